"""What a program is compiled for: a named Cloud TPU slice (through libtpu) or N CPU devices.

A `Target` holds the devices to lay the mesh over, abstract ones for a TPU topology (nothing runs
on them; libtpu only describes them to the compiler), and the `Chip` figures the report compares
the program with: memory per device, peak bfloat16 FLOP/s and HBM bandwidth.

TPU figures per chip are from the Cloud TPU system-architecture pages; the memory per device is
what libtpu's compiler itself allows a program (read off its out-of-memory messages for each
generation): slightly less than the nominal HBM. v2 and v3 chips hold two devices (TensorCores),
each with half the chip; v4 and v5p are addressed in megacore mode (one device per chip), as
Cloud TPU VMs do.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Sequence

import jax

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One device's capacity.

    Attributes:
      name: the generation, e.g. "v5e".
      memory_bytes: memory a program may use on one device (HBM for TPUs).
      peak_flops: peak bfloat16 FLOP/s of one device.
      memory_bandwidth: bytes/s between memory and one device's cores.
      devices_per_chip: TensorCores addressed as separate devices on one chip.
    """

    name: str
    memory_bytes: int
    peak_flops: float
    memory_bandwidth: float
    devices_per_chip: int = 1


def _chip(name, memory_gib, chip_tflops, chip_gbps, devices_per_chip=1) -> Chip:
    return Chip(
        name,
        int(memory_gib * GIB),
        chip_tflops * 1e12 / devices_per_chip,
        chip_gbps * 1e9 / devices_per_chip,
        devices_per_chip,
    )


# generation -> (device memory libtpu allows, bf16 TFLOP/s per chip, HBM GB/s per chip).
CHIPS: dict[str, Chip] = {
    "v2": _chip("v2", 7.48, 45, 700, devices_per_chip=2),
    "v3": _chip("v3", 15.48, 123, 900, devices_per_chip=2),
    "v4": _chip("v4", 30.75, 275, 1228),
    "v5e": _chip("v5e", 15.75, 197, 819),
    "v5p": _chip("v5p", 95.74, 459, 2765),
    "v6e": _chip("v6e", 31.25, 918, 1640),
}
# The generations whose chips hold two TensorCores addressed as one device (megacore).
_MEGACORE = ("v4", "v5p")
# libtpu's topology names: generation, then chips per dimension, e.g. "v5p:4x4x4".
_TOPOLOGY = re.compile(r"^(v\d+[a-z]*):(\d+(?:x\d+){1,2})$")
TPU_EXTRA_HINT = (
    "libtpu is not installed: pip install -e '.[tpu]' (or pip install "
    '"jax[tpu]==<your jax version>"), which brings libtpu\'s compiler; no TPU is needed.'
)


@dataclasses.dataclass(frozen=True)
class Target:
    """Devices to compile for, and their capacity.

    Attributes:
      name: "v5e:4x4" or "cpu:8".
      devices: the devices, abstract for a TPU topology.
      chip: the capacity of one device (None: unknown, as for CPU devices without a limit).
      devices_per_host: devices one host (process) drives.
    """

    name: str
    devices: Sequence[jax.Device]
    chip: Chip | None
    devices_per_host: int

    @property
    def platform(self) -> str:
        return self.devices[0].platform

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_chips(self) -> int:
        return self.num_devices // (self.chip.devices_per_chip if self.chip else 1)


def parse_topology(topology: str) -> tuple[str, tuple[int, ...]]:
    """ "v5p:4x4x4" -> ("v5p", (4, 4, 4)).

    Raises:
      ValueError: for a malformed name or an unknown generation (listing the known ones).
    """
    match = _TOPOLOGY.match(topology.strip())
    if not match or match.group(1) not in CHIPS:
        raise ValueError(
            f"Unknown TPU topology {topology!r}: expected GENERATION:CHIPS as libtpu names it, "
            f"with GENERATION one of {sorted(CHIPS)} and chips per dimension, e.g. v5e:4x4 (16 "
            "chips), v4:4x4x4 (64 chips), v5p:8x8x16 (1024 chips), v3:16x32 (the paper's "
            "v3-1024: 512 chips, 1024 cores)."
        )
    return match.group(1), tuple(int(n) for n in match.group(2).split("x"))


def tpu_target(topology: str) -> Target:
    """Abstract devices of a Cloud TPU slice, e.g. "v5e:4x4", from libtpu (no TPU needed).

    Raises:
      ValueError: for a malformed topology name, or when libtpu is not installed (the message
        says how to install it).
    """
    generation, dims = parse_topology(topology)
    try:
        import libtpu  # noqa: F401  (only to say how to get it)
    except ImportError:
        raise ValueError(TPU_EXTRA_HINT) from None
    from jax.experimental import topologies

    # NOTE: libtpu looks for the worker hosts of a real slice in the environment and logs an
    # error when it finds none; compiling needs no host, so name this one. Compiling touches no
    # chip either, so several processes may compile at once (libtpu locks the chips otherwise).
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    description = topologies.get_topology_desc(
        topology_name=topology,
        platform="tpu",
        chip_config_name="megacore" if generation in _MEGACORE else "default",
        chips_per_host_bounds=_host_bounds(dims),
        num_slices=1,
    )
    devices = list(description.devices)
    hosts = len({d.process_index for d in devices})
    return Target(topology, devices, CHIPS[generation], len(devices) // hosts)


def _host_bounds(dims: tuple[int, ...]) -> tuple[int, int, int]:
    """Chips one host drives along each dimension: a 2x2 board, or the whole of a smaller slice
    (v5e:1x1, one chip on one host; v5e:2x2, one host)."""
    padded = (*dims, 1, 1)[:3]
    return tuple(min(d, b) for d, b in zip(padded, (2, 2, 1)))


def cpu_target(num_devices: int, memory_gib: float | None = None) -> Target:
    """The first `num_devices` CPU devices of this process (see `ensure_cpu_devices`).

    Args:
      num_devices: how many.
      memory_gib: a per-device memory limit to check the program against (None: none).

    Raises:
      ValueError: when the process has fewer CPU devices.
    """
    devices = jax.devices("cpu")
    if num_devices < 1 or num_devices > len(devices):
        raise ValueError(
            f"Asked for {num_devices} CPU devices; this process has {len(devices)}. Ask for "
            "1 or more before JAX starts (t2t compile --cpu_devices=N does), or set "
            f"XLA_FLAGS=--xla_force_host_platform_device_count={max(num_devices, 1)}."
        )
    chip = None
    if memory_gib is not None:
        chip = Chip("cpu", int(memory_gib * GIB), peak_flops=0.0, memory_bandwidth=0.0)
    return Target(f"cpu:{num_devices}", devices[:num_devices], chip, num_devices)


def ensure_cpu_devices(num_devices: int) -> None:
    """Asks JAX for at least `num_devices` CPU devices; effective only before JAX's first use."""
    from jax._src import xla_bridge

    if xla_bridge.backends_are_initialized():
        return
    jax.config.update("jax_num_cpu_devices", max(num_devices, 1))
