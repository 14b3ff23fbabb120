"""Ahead-of-time compilation: a run's programs compiled for a TPU slice, GPUs or CPU devices, no run.

Capacity planning before anyone rents a slice (`t2t compile`): the real train step and greedy
decoding, with the real shardings, lowered on abstract inputs and compiled by libtpu's compiler
for a named Cloud TPU topology (`tpu_target("v5p:4x4x4")`; libtpu is an optional extra and needs
no TPU), for described NVIDIA GPUs (`gpu_target("h100:8")`; JAX's CUDA plugin, an optional extra,
needs no GPU) or for N CPU devices (`cpu_target(8)`). The report gives memory per device against the
device's capacity, compile time, compiled against model FLOPs, the collectives, the compute dtype
and attention implementation, an estimated step time from the program's matmul FLOPs and memory
traffic (`cost_model`) with its largest memory-bound operations, and settings that would make a
step that does not fit fit.

    from t2t import aot, nn
    shape = aot.RunShape(nn.get_preset("t5_1_1_base", dtype="bfloat16", scan_layers=True),
                         batch_size=2048, task_feature_lengths={"inputs": 512, "targets": 114},
                         mesh_shape=(-1, 1), sharding_mode="fsdp")
    report = aot.compile_run(shape, aot.tpu_target("v5e:4x4"))
    print(aot.format_report(report))
"""

from t2t.aot import cost_model
from t2t.aot.report import Report, RunShape, advise, compile_run, format_report
from t2t.aot.targets import (
    CHIPS,
    Chip,
    Target,
    cpu_target,
    ensure_cpu_devices,
    gpu_target,
    prepare_gpu_compile,
    tpu_target,
)

__all__ = [
    "CHIPS",
    "Chip",
    "Report",
    "RunShape",
    "Target",
    "advise",
    "cost_model",
    "compile_run",
    "cpu_target",
    "ensure_cpu_devices",
    "format_report",
    "gpu_target",
    "prepare_gpu_compile",
    "tpu_target",
]
