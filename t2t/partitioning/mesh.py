"""The device mesh and the multi-host runtime: which devices form the `data` x `model` grid, which
process joins which run, and which slice of every batch each host reads."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence

import jax
import numpy as np
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from t2t import hosts
from t2t.partitioning.rules import DATA, MESH_AXES, MODEL


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
    """Warns when tensor-parallel traffic would cross the network between hosts.

    NOTE: on a TPU slice every chip reaches every other over the inter-chip interconnect, so a
    model axis across hosts is normal there (16-way tensor parallelism on 4-chip hosts); the
    warning is for GPU and CPU hosts, where only devices of one host share a fast link.
    """
    devices = mesh.devices.reshape(-1)
    if devices[0].platform == "tpu":
        return
    processes = np.vectorize(lambda d: d.process_index)(mesh.devices)  # [data, model]
    if any(len(set(row)) > 1 for row in processes.tolist()):
        per_host = len(devices) // len({d.process_index for d in devices})
        logging.warning(
            "The model axis (%d) spans several hosts; tensor-parallel collectives will cross the "
            "network. Prefer a model axis that divides the devices per host (%d).",
            mesh.shape[MODEL],
            per_host,
        )


def initialize_distributed(
    coordinator_address: str | None = None,
    num_processes: int | None = None,
    process_id: int | None = None,
    *,
    auto_detect: bool | None = None,
) -> bool:
    """Joins this process to a multi-host run through `jax.distributed`; a no-op for one process.

    Call it first, before any other JAX call. Values not given are read from the environment:
    `JAX_COORDINATOR_ADDRESS` ("host:port" of process 0), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`,
    and `T2T_DISTRIBUTED=auto` for `auto_detect`. With auto detection JAX discovers the cluster
    itself (Cloud TPU pod slices, SLURM, Open MPI, Kubernetes), filling in whatever was not given.
    With nothing set the run is a single process and nothing happens. Calling it again is
    harmless.

    Args:
        coordinator_address: "host:port" of process 0, reachable from every host.
        num_processes: the number of processes (one per host; 1 means single-process).
        process_id: this process's index in `[0, num_processes)`.
        auto_detect: let JAX detect the cluster (default: `T2T_DISTRIBUTED == "auto"`).

    Returns:
        True when the process joined a multi-process run, False for a single process.

    Raises:
        ValueError: for a non-integer `JAX_NUM_PROCESSES` / `JAX_PROCESS_ID`, or an unknown
            `T2T_DISTRIBUTED` value.
    """
    if jax.distributed.is_initialized():
        return jax.process_count() > 1
    coordinator_address = coordinator_address or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
    num_processes = _env_int("JAX_NUM_PROCESSES") if num_processes is None else num_processes
    process_id = _env_int("JAX_PROCESS_ID") if process_id is None else process_id
    if auto_detect is None:
        mode = os.environ.get("T2T_DISTRIBUTED", "")
        if mode not in ("", "auto"):
            raise ValueError(f"T2T_DISTRIBUTED must be 'auto' or unset, got {mode!r}.")
        auto_detect = mode == "auto"
    if num_processes == 1:
        return False
    if (coordinator_address, num_processes, process_id) == (None, None, None) and not auto_detect:
        return False
    jax.distributed.initialize(
        coordinator_address=coordinator_address,
        num_processes=num_processes,
        process_id=process_id,
        # How long a process waits for all to join ($T2T_HOST_JOIN_SECONDS; JAX's 300 s).
        initialization_timeout=_env_int("T2T_HOST_JOIN_SECONDS") or 300,
    )
    hosts.watch()  # a lost peer ends this process with a message, not a hang
    return jax.process_count() > 1


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    if not value:
        return None
    try:
        return int(value)
    except ValueError:
        message = f"Environment variable {name} must be an integer, got {value!r}."
        raise ValueError(message) from None


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
