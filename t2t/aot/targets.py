"""What a program is compiled for: a named Cloud TPU slice (through libtpu), NVIDIA GPUs (through
JAX's CUDA plugin) or N CPU devices.

A `Target` holds the devices to lay the mesh over, abstract ones for a TPU topology (nothing runs
on them; libtpu only describes them to the compiler), and the `Chip` figures the report compares
the program with: memory per device, peak bfloat16 FLOP/s and HBM bandwidth.

TPU figures per chip are from the Cloud TPU system-architecture pages; the memory per device is
what libtpu's compiler itself allows a program (read off its out-of-memory messages for each
generation): slightly less than the nominal HBM. v2 and v3 chips hold two devices (TensorCores),
each with half the chip; v4 and v5p are addressed in megacore mode (one device per chip), as
Cloud TPU VMs do.

GPUs are compiled for without one: XLA is given a description of the chip (compute capability,
SMs, memory, bandwidth, cuDNN's version) instead of asking a device. It then autotunes nothing:
every GEMM goes to cuBLAS (on a real H100 XLA picked cuBLAS for 578 of 651 and Triton for the
rest) and reductions keep XLA's own emitters; T5.1.1-base's step compiled so launches 5,380
kernels where the H100's own program launched 5,270 (`benchmarks/gpu_deviceless.py`).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import re
from collections.abc import Sequence

import jax

from t2t.aot import cost_model
from t2t.errors import UserError

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
      rates: rates measured on such a chip, for the cost model (None: it uses the peaks).
    """

    name: str
    memory_bytes: int
    peak_flops: float
    memory_bandwidth: float
    devices_per_chip: int = 1
    rates: cost_model.Rates | None = None


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


# NVIDIA GPUs t2t compiles for: what XLA needs to know of each (a `GpuTargetConfig` in text form,
# filled in below), bf16 dense TFLOP/s and HBM GB/s of the SXM parts. cuDNN 9.19 and CUDA 12.8 are
# those of the H100 machine the GPU benchmark ran on.
_GPU_TARGET_CONFIG = """
gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: 52428800 clock_rate_ghz: 1.98
  device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 19 }}
runtime_version {{ major: 12 minor: 8 }}
device_description_str: "{description}"
"""
CUDNN_VERSION = 91900
# name -> (description, device memory bytes as the driver reports it, bf16 TFLOP/s, HBM GB/s).
_GPUS = {
    "h100": ("NVIDIA H100 80GB HBM3", 84_929_347_584, 989, 3352),
    "h200": ("NVIDIA H200", 150_754_820_096, 989, 4800),
}
# Rates measured on one H100 80GB by `benchmarks/gpu_train_step_bench.py`
# (`benchmarks/results/gpu_train_step.json`: an 8192^3 bf16 matmul, a 1 GiB copy; cuDNN
# attention from its `sites` job, T5.1.1-base's encoder and cross-attention at batch 128; the
# least kernel time from its trace, `benchmarks/gpu_profile.py`: the median of the 2,289
# kernels per step under 1 MB). With them the cost model puts the H100's own program for
# T5.1.1-base's step at batch 128 at 180.6 ms against 167.5-168.8 measured.
_MEASURED = {
    "h100": cost_model.Rates(
        matmul_flops_per_second=647.0e12,
        bytes_per_second=2.226e12,
        source="measured (one H100: benchmarks/results/gpu_train_step.json)",
        attention_flops_per_second=117.9e12,
        kernel_seconds=1.44e-6,
    )
}


def gpu_rates(name: str) -> cost_model.Rates | None:
    """The rates measured on GPU `name` ("h100"), or None where none were."""
    return _MEASURED.get(name)


# "h100", "h100:8" (8 GPUs on one host), "h100:4x8" (4 hosts of 8).
_GPU_TOPOLOGY = re.compile(r"^(h100|h200)(?::(?:(\d+)x)?(\d+))?$")
CUDA_EXTRA_HINT = (
    "JAX's CUDA plugin is not installed: pip install -e '.[cuda]' (or pip install "
    '"jax[cuda12]==<your jax version>"), about 5 GB; no GPU or driver is needed.'
)


def is_gpu_topology(topology: str) -> bool:
    """Whether `topology` names GPUs ("h100", "h200:8", "h100:2x8") rather than a TPU slice."""
    return bool(_GPU_TOPOLOGY.match(topology.strip().lower()))


def has_cuda_plugin() -> bool:
    """Whether JAX's CUDA plugin is installed (`pip install -e '.[cuda]'`)."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins package at all
        return False


def prepare_gpu_compile() -> None:
    """What compiling for a described GPU needs before JAX starts: the CUDA plugin must not look
    for a driver, and XLA must not tile GEMMs for Triton (it would autotune the tiles on a
    device). Effective only before JAX's first use; `t2t compile` calls it first thing."""
    os.environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_gpu_enable_triton_gemm" not in flags:
        os.environ["XLA_FLAGS"] = (flags + " --xla_gpu_enable_triton_gemm=false").strip()


def gpu_target(topology: str) -> Target:
    """Described NVIDIA GPUs, e.g. "h100" (one), "h100:8" (one host of 8), "h100:4x8" (4 hosts
    of 8); nothing needs a GPU. The memory a program may use is JAX's default share of the
    device's, 75% (XLA_PYTHON_CLIENT_MEM_FRACTION sets another).

    Raises:
      ValueError: for a malformed name, or when JAX's CUDA plugin is missing or started
        without `prepare_gpu_compile` (the messages say what to do).
    """
    match = _GPU_TOPOLOGY.match(topology.strip().lower())
    if not match:
        raise ValueError(
            f"Unknown GPU topology {topology!r}: expected h100 or h200, optionally :GPUS or "
            ":HOSTSxGPUS, e.g. h100, h100:8 (one host of 8), h200:4x8 (4 hosts of 8)."
        )
    name, hosts, per_host = match.group(1), int(match.group(2) or 1), int(match.group(3) or 1)
    if not has_cuda_plugin():
        raise ValueError(CUDA_EXTRA_HINT)
    from jax.experimental import topologies

    description, memory, tflops, gbps = _GPUS[name]
    config = _GPU_TARGET_CONFIG.format(
        bandwidth=gbps * 10**9, memory=memory, description=description
    )
    try:
        found = topologies.get_topology_desc(
            platform="cuda", target_config=config, topology=f"1x{hosts}x{per_host}"
        )
    except NotImplementedError:
        raise ValueError(
            "JAX's CUDA plugin did not start (it looks for a driver unless "
            "JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 is set before JAX starts); call "
            "t2t.aot.targets.prepare_gpu_compile() first, as t2t compile does."
        ) from None
    _answer_cudnn_version()
    fraction = float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.75"))
    chip = Chip(name, int(memory * fraction), tflops * 1e12, gbps * 1e9, rates=_MEASURED.get(name))
    return Target(f"{name}:{hosts}x{per_host}", list(found.devices), chip, per_host)


def _answer_cudnn_version() -> None:
    """JAX asks the device for cuDNN's version while tracing cuDNN attention; with no device,
    answer with the version the target describes."""
    try:
        from jax._src.cudnn import fused_attention_stablehlo
    except ImportError:  # a JAX without it: cuDNN attention will say why it cannot run
        return
    # NOTE: a private JAX function; if it moves, cuDNN attention fails to trace with JAX's
    # own message, and attention_impl="xla" still compiles.
    fused_attention_stablehlo.check_cudnn_version = lambda *args, **kwargs: CUDNN_VERSION


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
    try:
        description = topologies.get_topology_desc(
            topology_name=topology,
            platform="tpu",
            chip_config_name="megacore" if generation in _MEGACORE else "default",
            chips_per_host_bounds=_host_bounds(dims),
            num_slices=1,
        )
    except jax.errors.JaxRuntimeError as error:  # a shape libtpu has no slice of
        raise UserError(
            f"libtpu has no TPU slice {topology!r}: {str(error).strip()}. Slices are boards of "
            "2x2 chips (v5e:2x4, v5e:4x4, v4:2x2x2, v5p:4x4x8, ...), or a single chip "
            "(v5e:1x1)."
        ) from None
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
