"""The `Partitioner`: a mesh plus a rules table, turning logical annotations into shardings.

It derives a `NamedSharding` for every parameter (from its `nnx.Variable` annotation), every
optimizer statistic (from the parameter it mirrors) and every input batch, creates models and
optimizer states directly in their shards, and assembles per-host data into global arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from t2t.nn import axes
from t2t.partitioning.mesh import data_shard_of_process, make_mesh
from t2t.partitioning.rules import MESH_AXES, LogicalRules, logical_axis_rules
from t2t.pytrees import is_variable, param_path


def _logical_names(x: Any) -> tuple[str | None, ...]:
    """The logical axis names a leaf was annotated with; () for unannotated leaves."""
    if is_variable(x):
        return tuple(x.get_metadata().get("out_sharding") or ())
    return ()


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
                    what,
                    name,
                    size,
                    target,
                    self.mesh.shape[target],
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
            shape = np.shape(x.get_value() if is_variable(x) else x)
            sharding = self.sharding(_logical_names(x), shape, what=param_path(path))
            return x.replace(sharding) if is_variable(x) else sharding

        return jax.tree_util.tree_map_with_path(leaf_sharding, tree, is_leaf=is_variable)

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
        for path, x in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_variable)[0]:
            value = x.get_value() if is_variable(x) else x
            by_path[param_path(path)] = (np.shape(value), _logical_names(x))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
        shardings = []
        for path, leaf in leaves:
            names = _statistic_names(param_path(path), np.shape(leaf), by_path)
            shardings.append(self.sharding(names, np.shape(leaf), what=param_path(path)))
        return jax.tree_util.tree_unflatten(treedef, shardings)

    # -- sharded initialization ----------------------------------------------------------------

    def abstract_model(self, create_fn: Callable[[], nnx.Module]) -> tuple[Any, Any]:
        """The module's structure and its state as sharded shapes, computing nothing.

        Returns `(graphdef, state)` where each state leaf is a `jax.ShapeDtypeStruct` carrying
        its `NamedSharding`: the target of a resharding checkpoint restore (Orbax restores each
        array straight into these shards) and what `init_model` fills in.

        Args:
            create_fn: builds the module, e.g. `lambda: nn.build(config, nnx.Rngs(params=0))`.
        """
        with self.context():
            graphdef, state = nnx.split(nnx.eval_shape(create_fn))
        return graphdef, _with_shardings(state, self.shardings(state))

    def init_model(self, create_fn: Callable[[], nnx.Module]) -> nnx.Module:
        """Builds a module with every variable created directly in its shards.

        `create_fn` is traced abstractly for shapes and annotations, then run under `jax.jit`
        with `out_shardings`, so each device computes only its own shards (JAX's partitionable
        threefry makes the values those of an unsharded init with the same seed).

        Args:
            create_fn: builds the module, e.g. `lambda: nn.build(config, nnx.Rngs(params=0))`.

        Returns:
            The module, its arrays laid out as the rules say.
        """
        graphdef, abstract = self.abstract_model(create_fn)
        shardings = jax.tree.map(lambda x: x.sharding, abstract)
        with self.context():
            state = jax.jit(lambda: nnx.split(create_fn())[1], out_shardings=shardings)()
        return nnx.merge(graphdef, state)

    def abstract_optimizer(self, tx: Any, params: Any) -> Any:
        """The optimizer state of `tx` for `params` as sharded shapes, computing nothing."""
        with self.context():
            state = jax.eval_shape(tx.init, params)
        return _with_shardings(state, self.optimizer_shardings(state, params))

    def init_optimizer(self, tx: Any, params: Any) -> Any:
        """`tx.init(params)` with the state created sharded like the parameters it mirrors.

        Args:
            tx: an `optax.GradientTransformation`.
            params: the (sharded) parameter state, e.g. `nnx.state(model, nnx.Param)`.
        """
        shardings = jax.tree.map(lambda x: x.sharding, self.abstract_optimizer(tx, params))
        with self.context():
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

    def batch_shardings(self, batch: Mapping[str, Any]) -> dict[str, NamedSharding]:
        """`batch_sharding` for every feature of a batch (arrays or shapes), for `jax.jit`."""
        return {name: self.batch_sharding(len(x.shape)) for name, x in batch.items()}

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


def _with_shardings(tree: Any, shardings: Any) -> Any:
    """Each leaf of `tree` as a `jax.ShapeDtypeStruct` carrying the matching sharding."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


def _statistic_names(
    path: str,
    shape: tuple[int, ...],
    params: Mapping[str, tuple[tuple[int, ...], tuple[str | None, ...]]],
) -> tuple[str | None, ...]:
    """Logical names of an optimizer-state leaf at `path` from the parameter it mirrors."""
    parts = path.split("/")
    # The longest parameter path within this path: optax states hold per-parameter trees
    # (".../v_row/encoder/layers_0/mlp/wi/kernel"), or per-parameter states when a
    # transformation runs per leaf (".../encoder/layers/mlp/wi/kernel/0/v_row", scanned layers).
    found = None
    for start in range(len(parts)):
        for end in range(len(parts), start, -1):
            candidate = "/".join(parts[start:end])
            if candidate in params and (found is None or end - start > found[0]):
                found = (end - start, candidate)
                break
    if found is None:
        return ()
    param_shape, names = params[found[1]]
    if not names:
        return ()
    if shape == param_shape:
        return names
    # A statistic with one parameter axis reduced away.
    reduced = [
        a for a in range(len(param_shape)) if param_shape[:a] + param_shape[a + 1 :] == shape
    ]
    if not reduced:
        return ()
    axis = reduced[0]
    if len(reduced) > 1 and {"v_row", "v_col"} & set(parts):
        # NOTE: equal dimensions make the reduced axis ambiguous from shapes; optax's factored
        # statistics reduce the largest axis for `v_row` and the second largest for `v_col`
        # (by `np.argsort` of the shape), so follow that to keep the kept axis's sharding.
        order = np.argsort(param_shape)
        axis = int(order[-1] if "v_row" in parts else order[-2])
    return names[:axis] + names[axis + 1 :]


def make_partitioner(
    data: int = -1,
    model: int = 1,
    mode: str = "tensor_parallel",
    *,
    devices: Sequence[jax.Device] | None = None,
) -> Partitioner:
    """The partitioner of a run from its flags: mesh sizes and a sharding mode.

    Example: `make_partitioner(data=-1, model=2, mode="fsdp")` on 8 devices gives a 4x2 mesh
    with parameters split over both axes.
    """
    return Partitioner(make_mesh(data, model, devices=devices), logical_axis_rules(mode))
