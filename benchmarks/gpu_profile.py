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
import sys

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
      [(name, ms per step), ...], "largest": [[kind, name, ms per step, launches per step, an
      HLO op], ...] (every kind, 60 at most), "trace": path}.
    """
    path = find_trace(trace_dir)
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    pids = _device_pids(events)
    totals = collections.Counter()
    other = collections.Counter()
    by_kernel: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0.0, 0, ""])
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
        entry = by_kernel[(kind, _short(str(event.get("name", ""))))]
        entry[0] += duration_ms
        entry[1] += 1
        entry[2] = entry[2] or str((event.get("args") or {}).get("hlo_op", ""))
    return {
        "matmul_ms": totals["matmul"],
        "attention_ms": totals["attention"],
        "other_ms": totals["other"],
        "total_ms": sum(totals.values()),
        "kernels": count // max(steps, 1),
        "largest_other": [(name, round(ms, 3)) for name, ms in other.most_common(12)],
        # [kind, kernel name, ms per step, launches per step, one HLO op it ran], largest first.
        "largest": [
            [kind, name, round(ms, 3), round(n / max(steps, 1), 1), op]
            for (kind, name), (ms, n, op) in sorted(by_kernel.items(), key=lambda kv: -kv[1][0])[
                :60
            ]
        ],
        "trace": path,
        "device_processes_found": bool(pids),
    }


def _short(name: str) -> str:
    """A kernel name without its numeric suffix ("loop_add_fusion_17" -> "loop_add_fusion")."""
    return re.sub(r"[_.]\d+$", "", name)


_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = .*?metadata=\{([^}]*)\}")


def _source_table(hlo_text: str) -> tuple[dict[str, tuple[str, int]], dict[int, str]]:
    """From an optimized program's text: instruction name -> (op_name, stack frame id), and
    stack frame id -> "file:line function" of its innermost frame."""
    sections: dict[str, dict[int, str]] = {}
    section = None
    ops: dict[str, tuple[str, int]] = {}
    for line in hlo_text.splitlines():
        if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
            section = sections.setdefault(line, {})
            continue
        if section is not None and re.match(r"^\d+ ", line):
            key, value = line.split(" ", 1)
            section[int(key)] = value.strip('"')
            continue
        section = None
        match = _INSTRUCTION.match(line)
        if match:
            meta = match.group(2)
            op = re.search(r'op_name="([^"]*)"', meta)
            frame = re.search(r"stack_frame_id=(\d+)", meta)
            ops[match.group(1)] = (op.group(1) if op else "", int(frame.group(1)) if frame else 0)
    files, functions = sections.get("FileNames", {}), sections.get("FunctionNames", {})
    locations = {}
    for key, value in sections.get("FileLocations", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", value))
        file = files.get(int(fields.get("file_name_id", 0)), "?")
        function = functions.get(int(fields.get("function_name_id", 0)), "?")
        locations[key] = f"{_repo_path(file)}:{fields.get('line', '?')} {function}"
    frames = {}
    for key, value in sections.get("StackFrames", {}).items():
        fields = dict(re.findall(r"(\w+)=(\d+)", value))
        frames[key] = locations.get(int(fields.get("file_location_id", 0)), "?")
    return ops, frames


_PACKAGES = ("t2t", "benchmarks", "optax", "flax", "jax")


def _repo_path(path: str) -> str:
    """The path from the package's top: "/anywhere/t2t/nn/layers.py" -> "t2t/nn/layers.py",
    ".../site-packages/optax/x.py" -> "optax/x.py"."""
    parts = path.split("/")
    found = [i for i, part in enumerate(parts) if part in _PACKAGES]
    return "/".join(parts[found[-1] :]) if found else path


def by_source(trace_dir_or_file: str, hlo_text: str, steps: int, top: int = 25) -> list:
    """Kernel time per step of the kernels that are neither matmuls nor fused attention, by the
    line of t2t that made them: [[ms per step, kernels per step, "file:line function", op], ...],
    largest first. Kernels are matched to the program's fusions by name."""
    path = trace_dir_or_file
    if os.path.isdir(path):
        path = find_trace(path)
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    pids = _device_pids(events)
    ops, frames = _source_table(hlo_text)
    totals: dict[tuple[str, str], list] = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        if event.get("ph") != "X" or (pids and event.get("pid") not in pids):
            continue
        name = str(event.get("name", ""))
        if classify(name, event.get("args")) != "other":
            continue
        hlo_name = re.sub(r"_(\d+)$", r".\1", name)
        op, frame = ops.get(hlo_name) or ops.get(name) or ("(not in the program)", 0)
        key = (frames.get(frame, "?"), op.split("/")[-1])
        totals[key][0] += float(event.get("dur", 0.0)) / 1e3 / steps
        totals[key][1] += 1
    rows = sorted(totals.items(), key=lambda kv: -kv[1][0])[:top]
    return [[round(ms, 3), round(n / steps, 1), where, op] for (where, op), (ms, n) in rows]


def least_kernel_seconds(trace_dir_or_file: str, hlo_text: str, small_bytes: float = 1e6) -> dict:
    """How long a kernel takes however little it moves: the median duration of the non-matmul
    kernels whose traffic (by the cost model, `t2t.aot.cost_model.traffic`) is under
    `small_bytes`, for `cost_model.Rates.kernel_seconds`. Kernels are matched to the program's
    instructions by name. Returns {"seconds", "kernels" (small kernels per trace), "matched",
    "unmatched"}."""
    import statistics

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from t2t.aot import cost_model

    path = trace_dir_or_file
    if os.path.isdir(path):
        path = find_trace(path)
    with gzip.open(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    pids = _device_pids(events)
    size = {k.name: k.bytes / k.runs for k in cost_model.traffic(hlo_text).kernels if k.runs}
    small, matched, unmatched = [], 0, 0
    for event in events:
        if event.get("ph") != "X" or (pids and event.get("pid") not in pids):
            continue
        name = str(event.get("name", ""))
        if classify(name, event.get("args")) != "other":
            continue
        hlo_name = re.sub(r"_(\d+)$", r".\1", name)
        found = size.get(hlo_name, size.get(name))
        if found is None:
            unmatched += 1
            continue
        matched += 1
        if found < small_bytes:
            small.append(float(event.get("dur", 0.0)) / 1e6)
    return {
        "seconds": statistics.median(small) if small else None,
        "kernels": len(small),
        "matched": matched,
        "unmatched": unmatched,
    }


_NO_KERNEL = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "add-dependency",
        "opt-barrier",
        "partition-id",
        "replica-id",
        "domain",
        # the second half of an asynchronous pair (its first half is the kernel)
        "fusion-done",
        "copy-done",
        "async-done",
        "async-update",
        "send-done",
        "recv-done",
    }
)
_FUSION_KIND = re.compile(r'"kind":"(\w+)"|\bkind=(\w+)')


def _kernel_kind(instruction) -> str:
    """A fusion's emitter ("kLoop", "kInput", "__triton", ...), a custom call's target, or the
    opcode of anything else (a copy, an asynchronous half)."""
    if instruction.opcode in ("fusion", "fusion-start"):
        found = _FUSION_KIND.findall(instruction.attributes)
        kinds = [a or b for a, b in found]
        custom = [k for k in kinds if k.startswith("__")]
        return (custom or kinds or ["fusion"])[0]
    if instruction.opcode == "custom-call":
        return instruction.target or "custom-call"
    return instruction.opcode


def kernel_inventory(hlo_text: str) -> dict:
    """The kernels an optimized GPU program launches per step, read from its text alone (no
    trace): each instruction of the entry computation that runs on the device (a fusion, a
    library call, a copy), loop bodies counted as often as they run, command buffers and calls
    looked into. Returns {"kernels": n, "by_kind": {kind: n}, "by_file": {"t2t/nn/layers.py" or
    "optax": n}}, largest first; a kernel with no source line counts under "?"."""
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from t2t.aot import cost_model, hlo

    module = hlo.parse_module(hlo_text)
    ops, frames = _source_table(hlo_text)
    by_kind, by_file = collections.Counter(), collections.Counter()

    def walk(name: str, runs: int, stack: tuple) -> None:
        if name in stack or name not in module.computations:
            return
        for instruction in module.computations[name].instructions:
            op = instruction.opcode
            if op in _NO_KERNEL:
                continue
            if op == "while":
                trips = cost_model.trip_count(module, instruction) or 1
                walk(instruction.called["body"], runs * trips, stack + (name,))
                continue
            if op in ("call", "async-start") or (
                op == "fusion" and "command_buffer" in instruction.called.get("calls", "")
            ):
                for called in instruction.called.values():
                    walk(called, runs, stack + (name,))
                continue
            if op == "conditional":
                for branch in instruction.branches[:1]:
                    walk(branch, runs, stack + (name,))
                continue
            by_kind[_kernel_kind(instruction)] += runs
            where = frames.get(ops.get(instruction.name, ("", 0))[1], "?")
            by_file["optax" if where.startswith("optax/") else where.split(":")[0]] += runs

    walk(module.entry, 1, ())
    return {
        "kernels": sum(by_kind.values()),
        "by_kind": dict(by_kind.most_common()),
        "by_file": dict(by_file.most_common()),
    }


def main(argv=None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        description="Kernel time of a GPU trace by kind, and its non-matmul kernels by line of t2t."
    )
    parser.add_argument("trace", help="a *.trace.json.gz file or the directory of one")
    parser.add_argument("hlo", help="the optimized program's text (.txt or .txt.gz)")
    parser.add_argument("--steps", type=int, default=3, help="train steps the trace covers")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    opener = gzip.open if args.hlo.endswith(".gz") else open
    with opener(args.hlo, "rt") as f:
        text = f.read()
    trace = args.trace
    found = kernel_breakdown(os.path.dirname(trace) if os.path.isfile(trace) else trace, args.steps)
    print(
        f"kernel time per step {found['total_ms']:.1f} ms: matmul {found['matmul_ms']:.1f}, "
        f"fused attention {found['attention_ms']:.1f}, other {found['other_ms']:.1f}"
    )
    print("| fused-attention kernel | ms per step | launches per step |\n|---|---|---|")
    for kind, name, ms, launches, _ in found["largest"]:
        if kind == "attention":
            print(f"| `{name[:60]}` | {ms:.2f} | {launches:g} |")
    least = least_kernel_seconds(trace, text)
    if least["seconds"]:
        print(
            f"least kernel time: {least['seconds'] * 1e6:.2f} us, the median of "
            f"{least['kernels'] / args.steps:.0f} kernels per step under 1 MB"
        )
    print("| ms per step | kernels per step | where | op |\n|---|---|---|---|")
    for ms, count, where, op in by_source(trace, text, args.steps, top=args.top):
        print(f"| {ms:.2f} | {count:g} | `{where}` | {op} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
