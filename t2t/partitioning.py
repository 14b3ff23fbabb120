"""Where every array of a training run lives: the device mesh, the logical-axis rules, shardings.

The network names each parameter dimension with a logical axis (`t2t.nn.axes`: `embed`, `mlp`,
`joined_kv`, ...) and constrains key activations the same way. This module owns the other half:
a 2-D device mesh with axes `data` and `model`, and one rules table per sharding mode that maps
logical names to mesh axes. From the two it derives a `jax.sharding.NamedSharding` for every
parameter, optimizer statistic and input batch, so a model is sharded by changing a flag, never
the network code.

Everything is laid out sharded from the start: the model is traced abstractly (`nnx.eval_shape`),
its shardings are computed from the annotations, and a jitted initializer writes each shard
directly on its device (`out_shardings`), so no device ever holds the whole model unless the rules
replicate it. The optimizer state is created the same way.

Typical use (one process or one per host)::

    partitioning.initialize_distributed()          # no-op for one process
    mesh = partitioning.make_mesh(data=-1, model=2)
    partitioner = partitioning.Partitioner(mesh, partitioning.logical_axis_rules("fsdp"))
    model = partitioner.init_model(lambda: nn.build(config, nnx.Rngs(params=0)))
    params = nnx.state(model, nnx.Param)
    opt_state = partitioner.init_optimizer(tx, params)
    shard = partitioner.data_shard_info()            # this host's seqio.ShardInfo
    batch = partitioner.make_global_batch(local_numpy_batch)
    with partitioner.context():                      # mesh + rules for activation constraints
        params, opt_state, metrics = train_step(params, opt_state, batch)
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import logging
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from t2t.nn import axes

# Mesh axis names. Batches are split over `data`; tensor-parallel dimensions over `model`.
DATA = "data"
MODEL = "model"
MESH_AXES = (DATA, MODEL)

# A rules table: (logical axis name, mesh axis or None for replicated), one pair per name.
LogicalRules = tuple[tuple[str, str | None], ...]

# NOTE: Every logical name appears in every table, mapped to None when it stays replicated, so a
# name missing from the network's vocabulary or a typo fails loudly instead of being taken for a
# mesh axis (flax passes unknown names through unchanged).
RULES: dict[str, LogicalRules] = {
    # Pure data parallelism: every parameter replicated, batches split over `data`.
    "data_parallel": (
        (axes.VOCAB, None),
        (axes.EMBED, None),
        (axes.MLP, None),
        (axes.HEADS, None),
        (axes.KV, None),
        (axes.JOINED_KV, None),
        (axes.RELPOS_BUCKETS, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, None),
        (axes.ACT_HEADS, None),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, None),
    ),
    # Data parallel over `data` plus Megatron-style tensor parallelism over `model`: attention
    # heads, the feed-forward hidden units and the vocabulary are split (T5X's 1-D partitioning).
    # With a `model` axis of size 1 this is plain data parallelism.
    "tensor_parallel": (
        (axes.VOCAB, MODEL),
        (axes.EMBED, None),
        (axes.MLP, MODEL),
        (axes.HEADS, MODEL),
        (axes.KV, None),
        (axes.JOINED_KV, MODEL),
        (axes.RELPOS_BUCKETS, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, MODEL),
        (axes.ACT_HEADS, MODEL),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, MODEL),
    ),
    # tensor_parallel plus parameters (and so optimizer statistics) sharded over `data` along
    # `embed` (fully sharded data parallel, T5X's 2-D partitioning): memory per device falls with
    # the number of data replicas; XLA gathers each weight where it is used. Activations keep
    # `activation_embed` replicated because their batch dimension already uses `data`.
    "fsdp": (
        (axes.VOCAB, MODEL),
        (axes.EMBED, DATA),
        (axes.MLP, MODEL),
        (axes.HEADS, MODEL),
        (axes.KV, None),
        (axes.JOINED_KV, MODEL),
        (axes.RELPOS_BUCKETS, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, MODEL),
        (axes.ACT_HEADS, MODEL),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, MODEL),
    ),
}


def logical_axis_rules(mode: str = "tensor_parallel") -> LogicalRules:
    """The rules table of a sharding mode: `data_parallel`, `tensor_parallel` or `fsdp`.

    Raises:
        ValueError: for an unknown mode (the message lists the modes).
    """
    if mode not in RULES:
        near = difflib.get_close_matches(mode, list(RULES), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ValueError(
            f"Unknown sharding mode {mode!r}; expected one of {sorted(RULES)}.{hint}"
        )
    return RULES[mode]


# ----------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------


def resolve_mesh_shape(data: int, model: int, num_devices: int) -> tuple[int, int]:
    """Mesh sizes `(data, model)` with one size given as -1 inferred from the device count.

    Examples: 8 devices, (-1, 2) -> (4, 2); (2, -1) -> (2, 4); (1, 1) on 1 device -> (1, 1).

    Raises:
        ValueError: when both sizes are -1, a size is not positive, or the product of the sizes
            is not the number of devices.
    """
    sizes = {DATA: data, MODEL: model}
    for name, size in sizes.items():
        if not isinstance(size, (int, np.integer)) or (size < 1 and size != -1):
            raise ValueError(f"Mesh axis {name!r} must be a positive int or -1, got {size!r}.")
    if data == -1 and model == -1:
        raise ValueError(
            "At most one mesh axis may be -1 (inferred); got data=-1 and model=-1. "
            f"Give one of them explicitly (there are {num_devices} devices)."
        )
    if -1 in (data, model):
        known = model if data == -1 else data
        if num_devices % known:
            raise ValueError(
                f"Cannot infer the mesh: {num_devices} devices are not divisible by "
                f"{'model' if data == -1 else 'data'}={known}. Choose a size that divides "
                f"{num_devices}."
            )
        data, model = (num_devices // known, known) if data == -1 else (known, num_devices // known)
    if data * model != num_devices:
        raise ValueError(
            f"Mesh data={data} x model={model} = {data * model} devices, but {num_devices} devices "
            f"are available. Make the product equal {num_devices}, or pass -1 for one axis to "
            "infer it."
        )
    return int(data), int(model)


def make_mesh(
    data: int = -1, model: int = 1, *, devices: Sequence[jax.Device] | None = None
) -> Mesh:
    """A `data` x `model` device mesh laid out along the physical topology.

    `jax.make_mesh` orders the devices so neighbouring mesh positions are neighbouring chips
    (rings on TPU). Devices are ordered process by process, so the `model` axis stays within a
    host whenever it divides the devices per host and `data` spans the hosts. On a multi-slice TPU
    (devices from several slices), slices are joined along `data` with
    `mesh_utils.create_hybrid_device_mesh`, keeping `model` traffic on the fast in-slice links.

    Args:
        data: size of the `data` axis, or -1 to infer it from the device count.
        model: size of the `model` axis, or -1 to infer it.
        devices: the devices to use (default: all, `jax.devices()`); every one of them is used.

    Returns:
        A `jax.sharding.Mesh` with axes ("data", "model") of type Auto (the compiler propagates
        shardings between the annotated parameters, inputs and activation constraints).

    Raises:
        ValueError: when the sizes do not multiply to the number of devices.
    """
    devices = list(jax.devices() if devices is None else devices)
    data, model = resolve_mesh_shape(data, model, len(devices))
    axis_types = (AxisType.Auto, AxisType.Auto)
    num_slices = len({getattr(d, "slice_index", 0) for d in devices})
    if num_slices > 1:
        if data % num_slices:
            raise ValueError(
                f"The devices span {num_slices} TPU slices, so the data axis ({data}) must be a "
                f"multiple of {num_slices}; the model axis stays within a slice."
            )
        grid = mesh_utils.create_hybrid_device_mesh(
            (data // num_slices, model), (num_slices, 1), devices=devices
        )
        mesh = Mesh(grid, MESH_AXES, axis_types=axis_types)
    else:
        mesh = jax.make_mesh((data, model), MESH_AXES, axis_types=axis_types, devices=devices)
    _warn_if_model_axis_spans_hosts(mesh)
    return mesh


def _warn_if_model_axis_spans_hosts(mesh: Mesh) -> None:
    processes = np.vectorize(lambda d: d.process_index)(mesh.devices)  # [data, model]
    if any(len(set(row)) > 1 for row in processes.tolist()):
        logging.warning(
            "The model axis (%d) spans several hosts; tensor-parallel collectives will cross the "
            "network. Prefer a model axis that divides the devices per host (%d).",
            mesh.shape[MODEL],
            jax.local_device_count(),
        )


# ----------------------------------------------------------------------------------------------
# Multi-host
# ----------------------------------------------------------------------------------------------


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto_detect: bool = False,
) -> bool:
    """Joins this process to a multi-host run through `jax.distributed`; a no-op for one process.

    Call it first, before any other JAX call. Values not given are read from the environment:
    `JAX_COORDINATOR_ADDRESS` ("host:port" of process 0), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`.
    With none of them set and `auto_detect=False` the run is a single process and nothing happens.
    `auto_detect=True` lets JAX discover the cluster itself (Cloud TPU pod slices, SLURM, Open
    MPI, Kubernetes), filling in whatever was not given.

    Args:
        coordinator_address: "host:port" of process 0, reachable from every host.
        num_processes: the number of processes (one per host; 1 means single-process).
        process_id: this process's index in `[0, num_processes)`.
        auto_detect: let JAX detect the cluster when values are missing.

    Returns:
        True when the process joined a multi-process run, False for a single process.
    """
    env = os.environ
    coordinator_address = coordinator_address or env.get("JAX_COORDINATOR_ADDRESS") or None
    if num_processes is None and env.get("JAX_NUM_PROCESSES"):
        num_processes = int(env["JAX_NUM_PROCESSES"])
    if process_id is None and env.get("JAX_PROCESS_ID"):
        process_id = int(env["JAX_PROCESS_ID"])
    if num_processes == 1:
        return False
    given = (coordinator_address, num_processes, process_id)
    if all(value is None for value in given) and not auto_detect:
        return False
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
    )
    return jax.process_count() > 1


def data_shard_of_process(process_grid: np.ndarray, process_index: int) -> tuple[int, int]:
    """Which slice of the global batch a process reads: `(shard index, number of shards)`.

    A process feeds the rows of the batch that live on its devices, i.e. the `data` positions its
    devices occupy. Processes whose devices cover the same `data` positions (a `model` axis that
    spans hosts) read the same shard.

    Example: 2 hosts x 4 devices on a 2x4 mesh, `process_grid` [[0, 0, 0, 0], [1, 1, 1, 1]]:
    process 1 -> (1, 2). On a 1x8 mesh every row is [0, 0, 0, 0, 1, 1, 1, 1]: both hosts read
    shard (0, 1).

    Args:
        process_grid: [data, model] the process index of each mesh position.
        process_index: the process asking.

    Returns:
        (index, num_shards) for `seqio.ShardInfo`.

    Raises:
        ValueError: when processes cover overlapping but different sets of `data` positions, or
            sets of different sizes (the mesh cannot be fed by equal, disjoint host shards).
    """
    positions: dict[int, frozenset[int]] = {}
    for data_index, row in enumerate(np.asarray(process_grid).tolist()):
        for process in row:
            positions[process] = positions.get(process, frozenset()) | {data_index}
    if process_index not in positions:
        raise ValueError(f"Process {process_index} owns no device of the mesh {process_grid}.")
    blocks = sorted(set(positions.values()), key=min)
    covered = [i for block in blocks for i in block]
    if len(covered) != len(set(covered)) or len({len(b) for b in blocks}) != 1:
        raise ValueError(
            "Hosts cannot read disjoint, equal shards of the batch: the data positions per host "
            f"are {[sorted(b) for b in blocks]}. Choose mesh sizes where each host's devices form "
            "whole rows of the data axis (model axis dividing the devices per host)."
        )
    return blocks.index(positions[process_index]), len(blocks)


# ----------------------------------------------------------------------------------------------
# Shardings
# ----------------------------------------------------------------------------------------------


def _is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def _logical_names(x: Any) -> tuple[str | None, ...]:
    """The logical axis names a leaf was annotated with; () for unannotated leaves."""
    if _is_variable(x):
        return tuple(x.get_metadata().get("out_sharding") or ())
    return ()


def param_path(path: Sequence[Any]) -> str:
    """A tree path as T5X-style "encoder/layers_0/mlp/wi/kernel" (Variable `.value` dropped)."""
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class Partitioner:
    """A mesh and a rules table: turns logical annotations into shardings and lays arrays out.

    Attributes:
        mesh: the device mesh (see `make_mesh`).
        rules: the logical-axis rules (see `logical_axis_rules`).
    """

    mesh: Mesh
    rules: LogicalRules

    def __post_init__(self):
        missing = [a for a in MESH_AXES if a not in self.mesh.axis_names]
        if missing:
            raise ValueError(
                f"The mesh needs axes {MESH_AXES}, got {self.mesh.axis_names}; build it with "
                "partitioning.make_mesh."
            )
        for name, target in self.rules:
            if target is not None and target not in self.mesh.axis_names:
                raise ValueError(
                    f"Rule {name!r} -> {target!r} names no mesh axis; mesh axes are "
                    f"{self.mesh.axis_names}."
                )

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        """Makes the mesh and the rules current for tracing: activation constraints read both.

        Enter it around every call of a jitted function that runs the network (tracing happens at
        the first call), and around `init_model`.
        """
        with jax.set_mesh(self.mesh), nnx.logical_axis_rules(self.rules):
            yield

    # -- single arrays -------------------------------------------------------------------------

    def spec(
        self, names: Sequence[str | None], shape: Sequence[int], *, what: str = "array"
    ) -> PartitionSpec:
        """The mesh `PartitionSpec` of an array with logical axis `names` and `shape`.

        A dimension whose size the mesh axis does not divide is replicated (with a warning):
        sharding requires equal shards, and a tiny test config need not fit every mesh.

        Raises:
            ValueError: for a name the rules do not know, or names not matching the rank.
        """
        if not names:
            return PartitionSpec()
        if len(names) != len(shape):
            raise ValueError(
                f"{what}: {len(names)} logical axes {tuple(names)} for a rank-{len(shape)} "
                f"array of shape {tuple(shape)}."
            )
        table = dict(self.rules)
        spec = []
        for name, size in zip(names, shape):
            if name is None or name in self.mesh.axis_names:
                target = name
            elif name in table:
                target = table[name]
            else:
                raise ValueError(
                    f"{what}: logical axis {name!r} is not in the rules table; known names are "
                    f"{sorted(table)}. Add it to partitioning.RULES."
                )
            if target is not None and target in spec:
                raise ValueError(f"{what}: mesh axis {target!r} used twice by axes {tuple(names)}.")
            if target is not None and size % self.mesh.shape[target]:
                logging.warning(
                    "%s: axis %r of size %d is not divisible by mesh axis %r (%d); replicating it.",
                    what, name, size, target, self.mesh.shape[target],
                )
                target = None
            spec.append(target)
        return PartitionSpec(*spec)

    def sharding(
        self, names: Sequence[str | None], shape: Sequence[int], *, what: str = "array"
    ) -> NamedSharding:
        """`spec` as a `NamedSharding` on this mesh."""
        return NamedSharding(self.mesh, self.spec(names, shape, what=what))

    @property
    def replicated(self) -> NamedSharding:
        """A full copy on every device (scalars, step counters, RNG keys)."""
        return NamedSharding(self.mesh, PartitionSpec())

    # -- parameter trees -----------------------------------------------------------------------

    def shardings(self, tree: Any) -> Any:
        """Shardings for a tree of `nnx.Variable`s (an `nnx.State`, abstract or concrete).

        Each Variable's logical annotation (`out_sharding` metadata) decides its sharding; plain
        array leaves and unannotated Variables are replicated. The result has the tree's own
        structure, Variables holding `NamedSharding`s, so it serves directly as `in_shardings` /
        `out_shardings` of `jax.jit`.
        """

        def leaf_sharding(path, x):
            shape = np.shape(x.get_value() if _is_variable(x) else x)
            sharding = self.sharding(_logical_names(x), shape, what=param_path(path))
            return x.replace(sharding) if _is_variable(x) else sharding

        return jax.tree_util.tree_map_with_path(leaf_sharding, tree, is_leaf=_is_variable)

    def optimizer_shardings(self, opt_state: Any, params: Any) -> Any:
        """Shardings for an optimizer state whose statistics mirror `params`.

        Every state leaf is matched to the parameter whose tree path ends its own path (optax
        states hold per-parameter trees: `v`, `mu`, `v_row`, ...). A leaf shaped like its
        parameter takes the parameter's sharding; a factored statistic (the parameter's shape
        with one axis reduced away, as Adafactor's `v_row` / `v_col`) keeps the sharding of the
        remaining axes; anything else (counters, placeholders) is replicated.

        Args:
            opt_state: the state, concrete or abstract (`jax.eval_shape(tx.init, params)`).
            params: the parameter tree the state was made for (Variables with annotations).
        """
        by_path = {}
        for path, x in jax.tree_util.tree_flatten_with_path(params, is_leaf=_is_variable)[0]:
            value = x.get_value() if _is_variable(x) else x
            by_path[param_path(path)] = (np.shape(value), _logical_names(x))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
        shardings = []
        for path, leaf in leaves:
            names = _statistic_names(param_path(path), np.shape(leaf), by_path)
            shardings.append(self.sharding(names, np.shape(leaf), what=param_path(path)))
        return jax.tree_util.tree_unflatten(treedef, shardings)

    # -- sharded initialization ----------------------------------------------------------------

    def init_model(self, create_fn: Callable[[], nnx.Module]) -> nnx.Module:
        """Builds a module with every variable created directly in its shards.

        `create_fn` is traced abstractly for shapes and annotations, then run under `jax.jit`
        with `out_shardings`, so each device computes only its own shards.

        Args:
            create_fn: builds the module, e.g. `lambda: nn.build(config, nnx.Rngs(params=0))`.

        Returns:
            The module, its arrays laid out as the rules say.
        """
        with self.context():
            abstract = nnx.eval_shape(create_fn)
            graphdef, abstract_state = nnx.split(abstract)
            shardings = self.shardings(abstract_state)
            state = jax.jit(lambda: nnx.split(create_fn())[1], out_shardings=shardings)()
        return nnx.merge(graphdef, state)

    def init_optimizer(self, tx: Any, params: Any) -> Any:
        """`tx.init(params)` with the state created sharded like the parameters it mirrors.

        Args:
            tx: an `optax.GradientTransformation`.
            params: the (sharded) parameter state, e.g. `nnx.state(model, nnx.Param)`.
        """
        with self.context():
            abstract = jax.eval_shape(tx.init, params)
            shardings = self.optimizer_shardings(abstract, params)
            return jax.jit(tx.init, out_shardings=shardings)(params)

    # -- input batches -------------------------------------------------------------------------

    @property
    def batch_axis(self) -> str | None:
        """The mesh axis the batch dimension is split over (the rule for `activation_batch`)."""
        return dict(self.rules).get(axes.ACT_BATCH)

    def data_shard(self, process_index: int | None = None) -> tuple[int, int]:
        """`(index, num_shards)`: which slice of every global batch a host reads.

        Usually `(jax.process_index(), jax.process_count())`; hosts that share `data` positions
        (a model axis across hosts) read the same shard.
        """
        index = jax.process_index() if process_index is None else process_index
        grid = np.vectorize(lambda d: d.process_index)(self.mesh.devices)  # [data, model]
        if self.batch_axis is None:  # batch replicated: every host reads the whole batch
            grid = grid.reshape(1, -1)
        return data_shard_of_process(grid, index)

    def data_shard_info(self, process_index: int | None = None):
        """This host's shard as a `seqio.ShardInfo`, for `seqio.get_dataset(shard_info=...)`."""
        # NOTE: seqio imports TensorFlow; importing it here keeps `t2t.partitioning` light for
        # code that never reads data (inference, export).
        import seqio

        index, num_shards = self.data_shard(process_index)
        return seqio.ShardInfo(index=index, num_shards=num_shards)

    def batch_sharding(self, ndim: int) -> NamedSharding:
        """Batch dimension split over the batch mesh axis, other dimensions replicated."""
        return NamedSharding(self.mesh, PartitionSpec(self.batch_axis, *([None] * (ndim - 1))))

    def make_global_batch(self, local_batch: Mapping[str, Any]) -> dict[str, jax.Array]:
        """Assembles each host's slice of a batch into global arrays split over `data`.

        Args:
            local_batch: feature name -> [B_local, ...] array this host read (its
                `data_shard_info()` shard); all hosts pass equal shapes.

        Returns:
            feature name -> [B_local * num_shards, ...] `jax.Array`, batch dimension sharded.

        Raises:
            ValueError: when features disagree on the batch size, or the global batch is not
                divisible by the data axis.
        """
        _, num_shards = self.data_shard()
        sizes = {name: np.shape(x)[0] if np.ndim(x) else None for name, x in local_batch.items()}
        if len(set(sizes.values())) != 1 or None in sizes.values():
            raise ValueError(f"Every feature needs the same leading batch size; got {sizes}.")
        local_size = next(iter(sizes.values()))
        global_size = local_size * num_shards
        data_size = self.mesh.shape[self.batch_axis] if self.batch_axis else 1
        if global_size % data_size:
            raise ValueError(
                f"The global batch ({local_size} per host x {num_shards} hosts = {global_size}) "
                f"must be divisible by the data axis ({data_size}). Pick a batch size that is a "
                f"multiple of {data_size}."
            )
        batch = {}
        for name, x in local_batch.items():
            x = np.asarray(x)
            sharding = self.batch_sharding(x.ndim)
            batch[name] = jax.make_array_from_process_local_data(
                sharding, x, (global_size, *x.shape[1:])
            )
        return batch


def _statistic_names(
    path: str,
    shape: tuple[int, ...],
    params: Mapping[str, tuple[tuple[int, ...], tuple[str | None, ...]]],
) -> tuple[str | None, ...]:
    """Logical names of an optimizer-state leaf at `path` from the parameter it mirrors."""
    parts = path.split("/")
    for start in range(len(parts)):  # longest parameter path that ends this path
        suffix = "/".join(parts[start:])
        if suffix in params:
            param_shape, names = params[suffix]
            break
    else:
        return ()
    if not names:
        return ()
    if shape == param_shape:
        return names
    for axis in range(len(param_shape)):  # a statistic with one parameter axis reduced away
        if param_shape[:axis] + param_shape[axis + 1 :] == shape:
            return names[:axis] + names[axis + 1 :]
    return ()


def num_bytes_per_device(tree: Any) -> int:
    """Bytes of `tree`'s arrays held by the most loaded local device (memory check)."""
    totals: dict[Any, int] = {}
    for leaf in jax.tree.leaves(tree):
        for shard in getattr(leaf, "addressable_shards", ()):
            nbytes = math.prod(shard.data.shape) * shard.data.dtype.itemsize
            totals[shard.device] = totals.get(shard.device, 0) + nbytes
    return max(totals.values(), default=0)
