"""Where a GPU step's kernel time goes, read from a JAX profiler trace (`jax.profiler.trace`).

`kernel_breakdown(trace_dir)` finds the trace the profiler wrote (`*.trace.json.gz`), keeps the
kernels that ran on the GPU, sorts each into matmul (cuBLAS, cuBLASLt, CUTLASS and XLA's Triton
GEMMs), fused attention (cuDNN's flash attention) or other (XLA's fusions: softmax, norms,
elementwise, reductions, the optimizer, copies), and sums their durations. Memory copies between
host and device are left out. The sorting goes by kernel name and by the HLO operation the
profiler records beside it; names it could not place count as "other" and are listed.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re

# Kernel names (or their HLO op) of matrix products: cuBLAS/cuBLASLt (sm90_xmma_gemm_*, nvjet_*,
# cutlass_*), XLA's Triton GEMM fusions (gemm_fusion_*, triton_gemm_*), custom-call GEMMs.
MATMUL = re.compile(r"gemm|xmma|nvjet|cutlass|cublas|matmul|\bdot\b|__cublas", re.I)
# cuDNN's fused (flash) attention, forward and backward (XLA's own attention kernels are fusions
# named after their HLO, which count as "other").
ATTENTION = re.compile(r"cudnn|fmha|flash", re.I)
MEMCPY = re.compile(r"memcpy|memset", re.I)


def find_trace(trace_dir: str) -> str:
    """The newest `*.trace.json.gz` the profiler wrote under `trace_dir`."""
    found = glob.glob(os.path.join(trace_dir, "**", "*.trace.json.gz"), recursive=True)
    if not found:
        raise FileNotFoundError(f"No *.trace.json.gz under {trace_dir}: did the profiler run?")
    return max(found, key=os.path.getmtime)


def _device_pids(events: list[dict]) -> set:
    """Processes of the trace that are GPUs ("/device:GPU:0", "... GPU ..."), not the host."""
    return {
        e["pid"]
        for e in events
        if e.get("ph") == "M"
        and e.get("name") == "process_name"
        and re.search(r"gpu|device:", str(e.get("args", {}).get("name", "")), re.I)
        and "host" not in str(e.get("args", {}).get("name", "")).lower()
    }


def classify(name: str, args: dict | None = None) -> str:
    """ "matmul", "attention", "memcpy" or "other" for one kernel."""
    text = " ".join([name, *(str(v) for v in (args or {}).values())])
    if MEMCPY.search(name):
        return "memcpy"
    if ATTENTION.search(text):
        return "attention"
    if MATMUL.search(text):
        return "matmul"
    return "other"


def kernel_breakdown(trace_dir: str, steps: int) -> dict:
    """Kernel milliseconds per step by kind, and the largest "other" kernels.

    Args:
      trace_dir: the directory given to `jax.profiler.trace`.
      steps: how many train steps the trace covers (the totals are divided by it).

    Returns:
      {"matmul_ms", "attention_ms", "other_ms", "total_ms", "kernels", "largest_other":
      [(name, ms per step), ...], "trace": path}.
    """
    path = find_trace(trace_dir)
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    pids = _device_pids(events)
    totals = collections.Counter()
    other = collections.Counter()
    count = 0
    for event in events:
        if event.get("ph") != "X" or (pids and event.get("pid") not in pids):
            continue
        kind = classify(str(event.get("name", "")), event.get("args"))
        if kind == "memcpy":
            continue
        duration_ms = float(event.get("dur", 0.0)) / 1e3 / steps
        totals[kind] += duration_ms
        count += 1
        if kind == "other":
            other[_short(str(event.get("name", "")))] += duration_ms
    return {
        "matmul_ms": totals["matmul"],
        "attention_ms": totals["attention"],
        "other_ms": totals["other"],
        "total_ms": sum(totals.values()),
        "kernels": count // max(steps, 1),
        "largest_other": [(name, round(ms, 3)) for name, ms in other.most_common(12)],
        "trace": path,
        "device_processes_found": bool(pids),
    }


def _short(name: str) -> str:
    """A kernel name without its numeric suffix ("loop_add_fusion_17" -> "loop_add_fusion")."""
    return re.sub(r"[_.]\d+$", "", name)
