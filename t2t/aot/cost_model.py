"""A step-time estimate that sees memory traffic: matmul FLOPs and every kernel's bytes.

`t2t compile` used to bound the step by the program's arguments and outputs, which sees none of
the activations a step writes and reads back; on the one accelerator measured (an H100, issue
32) more than half of T5.1.1-base's step went to such traffic. This model reads the optimized
program instead (`t2t.aot.hlo`) and counts, for each kernel the device will run:

- **what crosses device memory**: a fusion's operands and results (a fusion is one kernel: what
  it computes inside stays on chip), a copy's or a slice's bytes, a custom call's operands and
  results (a Pallas kernel's own count where it declares one: `pl.CostEstimate`, its blocks'
  re-reads included). Only arrays in device memory (HBM) count: on TPUs, operands the compiler
  staged in on-chip memory (`S(1)`) are counted once, by the copy that staged them. An operand a
  fusion only slices (a loop reading one layer of a stacked array), itself or in a fusion nested
  in it, counts the slice; an array updated in place counts the update.
- **how often**: a loop body counts as many times as the loop runs (the trip count the compiler
  knows, or the bound of the loop's condition), a conditional its most expensive branch.
- **matmul or not**: a kernel that holds a matmul (dot, convolution, a GEMM or fused-attention
  library call) runs at the chip's matmul rate; every other kernel at its memory bandwidth.

The estimate: `step = max(matmul FLOPs / matmul rate, matmul kernels' bytes / bandwidth) +
fused attention FLOPs / attention rate + the other kernels' time`, each other kernel taking its
bytes / bandwidth, or the least time a kernel takes when that is known (`Rates.kernel_seconds`)
and larger. Matmuls overlap
their own traffic; the other kernels (norms, softmax, dropout masks, the optimizer's update,
layout copies) run one after another, each at the speed of its memory traffic. The FLOPs come
from the traced program (`t2t.aot.flops`: exact, loops counted), not from the HLO. cuDNN's
fused attention gets a rate of its own when one was measured (on the H100 it ran T5.1.1-base's
attention at about a fifth of the GEMMs' rate: head dimension 64, and the relative bias's
gradient writes the scores' gradient out, multiplies it again for dq and reduces it over the
batch); without one its FLOPs count at the matmul rate.

What it does not model, and says so in its report: collectives (their bytes are listed; the
estimate assumes the interconnect overlaps them), compute inside non-matmul kernels
(transcendentals, reductions), cache reuse between kernels, tiling padding, kernel launch
overhead (beyond a least time per kernel when one was measured), and FLOPs of custom calls it
cannot read (they count bytes only and are named).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Any

from t2t.aot import hlo

# Opcodes that move no data themselves (views, tuples, parameters, constants, the second half
# of an asynchronous pair whose first half was counted).
_FREE = frozenset(
    {
        "parameter",
        "constant",
        "get-tuple-element",
        "tuple",
        "bitcast",
        "after-all",
        "partition-id",
        "replica-id",
        "opt-barrier",
        "copy-done",
        "slice-done",
        "fusion-done",
        "all-gather-done",
        "all-reduce-done",
        "collective-permute-done",
        "async-done",
        "async-update",
        "send-done",
        "recv-done",
        "add-dependency",
        "domain",
    }
)
_COLLECTIVES = frozenset(
    {
        "all-gather",
        "all-reduce",
        "reduce-scatter",
        "all-to-all",
        "collective-permute",
        "all-gather-start",
        "all-reduce-start",
        "collective-permute-start",
        "send",
        "recv",
        "ragged-all-to-all",
    }
)
_ASYNC_COPIES = frozenset({"copy-start", "slice-start"})
_MATMUL_OPCODES = frozenset({"dot", "convolution", "ragged-dot"})
# Custom-call targets that are matmuls or fused attention: cuBLAS, cuBLASLt, cuDNN, oneDNN, and
# Mosaic kernels on TPUs (in t2t's programs only Pallas flash attention).
_MATMUL_TARGET = re.compile(
    r"gemm|matmul|cudnn\$|fmha|onednn\$(matmul|convolution)|tpu_custom_call", re.I
)
# Custom calls that only move collectives' data (TPU asynchronous collectives).
_COLLECTIVE_TARGET = re.compile(r"Collective", re.I)
# Custom calls that cost nothing worth modeling.
_TRIVIAL_TARGET = re.compile(
    r"AssumeGatherIndicesInBound|Sharding|SPMDFullToShardShape|SPMDShardToFullShape|"
    r"MoveToHost|MoveToDevice|annotate|AllocateBuffer|ConcatBitcast",
    re.I,
)
_SLICING = frozenset({"dynamic-slice", "slice", "gather"})
_VIEWS = frozenset({"bitcast", "reshape", "get-tuple-element", "copy"})


@dataclasses.dataclass(frozen=True)
class Rates:
    """What the estimate divides by: the matmul rate (FLOP/s) and memory bandwidth (bytes/s).

    Peak figures give an optimistic estimate; rates measured on the chip (a large matmul, a
    large copy) give a realistic one. Say which in every report.
    """

    matmul_flops_per_second: float
    bytes_per_second: float
    source: str = "peak"
    # cuDNN fused attention's rate (its forward and backward kernels together, with the bias
    # gradient when there is one), measured at the network's attention shape; None: such
    # kernels count at the matmul rate.
    attention_flops_per_second: float | None = None
    # The least time one non-matmul kernel takes, however few bytes it moves (its launch and
    # ramp: on the H100 the 2,289 kernels per step under 1 MB took a median 1.44 us each);
    # 0: not modeled. A step of many small kernels (an optimizer updating each parameter
    # alone) is bound by their number, not their bytes.
    kernel_seconds: float = 0.0


@dataclasses.dataclass
class Kernel:
    """One kernel's traffic, times the number of times it runs."""

    name: str
    opcode: str
    op_name: str
    bytes: float
    runs: int
    matmul: bool


@dataclasses.dataclass
class Traffic:
    """Every kernel of a program with its device-memory bytes, and what was not modeled."""

    kernels: list[Kernel] = dataclasses.field(default_factory=list)
    collective_bytes: float = 0.0
    collective_count: int = 0
    not_modeled: list[str] = dataclasses.field(default_factory=list)

    @property
    def matmul_bytes(self) -> float:
        return sum(k.bytes for k in self.kernels if k.matmul)

    @property
    def other_bytes(self) -> float:
        return sum(k.bytes for k in self.kernels if not k.matmul)


def _contains_matmul(module: hlo.Module, computation: str, seen: set[str] | None = None) -> bool:
    seen = set() if seen is None else seen
    if computation in seen or computation not in module.computations:
        return False
    seen.add(computation)
    for instruction in module.computations[computation].instructions:
        if instruction.opcode in _MATMUL_OPCODES:
            return True
        if instruction.opcode == "custom-call" and _MATMUL_TARGET.search(instruction.target):
            return True
        if any(_contains_matmul(module, c, seen) for c in instruction.called.values()):
            return True
    return False


def _through_views(fused: hlo.Computation, name: str) -> list[hlo.Instruction]:
    """The users of `name` inside a fused computation, looking through bitcasts and reshapes."""
    found = []
    for user in fused.users(name):
        if user.opcode in ("bitcast", "reshape"):
            found += _through_views(fused, user.name)
        else:
            found.append(user)
    return found


def _fusion_bytes(module: hlo.Module, fusion: hlo.Instruction, outer: hlo.Computation) -> float:
    """Device-memory bytes a fusion reads and writes.

    An operand only sliced inside counts the slices; an operand updated in place by a
    dynamic-update-slice counts nothing (the result counts the update instead).
    """
    fused = module.computations.get(fusion.called.get("calls", ""))
    operand_shapes = [outer.by_name[o].shape if o in outer.by_name else "" for o in fusion.operands]
    if fused is None:
        return sum(map(hlo.device_memory_bytes, operand_shapes)) + hlo.device_memory_bytes(
            fusion.shape
        )
    params = {i.parameter_index: i for i in fused.instructions if i.opcode == "parameter"}
    in_place: set[str] = set()
    total = 0.0
    for index, shape in enumerate(operand_shapes):
        if hlo.device_memory_bytes(shape) == 0:
            continue
        param = params.get(index)
        users = _through_views(fused, param.name) if param is not None else []
        sliced = _slice_reads(module, fused, param.name) if param is not None else None
        if sliced is not None:
            total += sliced  # the slices read
        elif users and all(
            u.opcode == "dynamic-update-slice" and u.operands[0] in _view_names(fused, param.name)
            for u in users
        ):
            in_place.update(u.name for u in users)
        else:
            total += hlo.device_memory_bytes(shape)
    return total + _result_bytes(fused, fusion.shape, in_place)


def _slice_reads(module: hlo.Module, fused: hlo.Computation, name: str) -> float | None:
    """The bytes a fusion reads of its operand `name` when every use slices it (looking through
    views and into nested fusions: TPU matmul fusions slice a stacked loop operand inside a
    fusion of their own); None when some use reads it whole."""
    views = _view_names(fused, name)
    users = _through_views(fused, name)
    if not users:
        return None
    total = 0.0
    for user in users:
        if user.opcode in _SLICING and user.operands[0] in views:
            total += _array_bytes(user.shape)
            continue
        inner = module.computations.get(user.called.get("calls", ""))
        if user.opcode != "fusion" or inner is None:
            return None
        params = {i.parameter_index: i for i in inner.instructions if i.opcode == "parameter"}
        for position, operand in enumerate(user.operands):
            if operand not in views:
                continue
            param = params.get(position)
            read = None if param is None else _slice_reads(module, inner, param.name)
            if read is None:
                return None
            total += read
    return total


def _array_bytes(shape: str) -> int:
    return sum(a.bytes for a in hlo.arrays(shape))


def _view_names(fused: hlo.Computation, name: str) -> set[str]:
    names = {name}
    for user in fused.users(name):
        if user.opcode in ("bitcast", "reshape"):
            names |= _view_names(fused, user.name)
    return names


def _result_bytes(fused: hlo.Computation, shape: str, in_place: set[str]) -> float:
    """A fusion's written bytes: the whole result, except in-place updates count the update."""
    root = fused.root
    outputs = [root]
    if root.opcode == "tuple":
        outputs = [fused.by_name[o] for o in root.operands if o in fused.by_name]
    result_arrays = hlo.arrays(shape)
    total = 0.0
    for position, out in enumerate(outputs):
        array = result_arrays[position] if position < len(result_arrays) else None
        if array is None or array.memory_space != 0:
            continue
        while out.opcode in ("bitcast", "reshape") and out.operands[0] in fused.by_name:
            out = fused.by_name[out.operands[0]]
        if out.name in in_place and len(out.operands) > 1 and out.operands[1] in fused.by_name:
            total += _array_bytes(fused.by_name[out.operands[1]].shape)
        else:
            total += array.bytes
    return total


def trip_count(module: hlo.Module, loop: hlo.Instruction) -> int | None:
    known = loop.known_trip_count
    if known is not None:
        return known
    condition = module.computations.get(loop.called.get("condition", ""))
    if condition is None:
        return None
    root = condition.root
    if root.opcode != "compare" or "direction=LT" not in root.attributes:
        return None
    for operand in root.operands:
        constant = condition.by_name.get(operand)
        if constant is not None and constant.opcode == "constant":
            literal = constant.operand_text.strip()
            if re.fullmatch(r"-?\d+", literal):
                return int(literal)
    return None


def _walk(module: hlo.Module, name: str, runs: int, traffic: Traffic, stack: tuple = ()) -> None:
    if name in stack:
        return
    computation = module.computations[name]
    for instruction in computation.instructions:
        op = instruction.opcode
        if op in _FREE:
            continue
        if op == "while":
            trips = trip_count(module, instruction)
            if trips is None:
                trips = 1
                traffic.not_modeled.append(
                    f"loop {instruction.name}: trip count unknown, counted once"
                )
            _walk(module, instruction.called["body"], runs * trips, traffic, stack + (name,))
            continue
        if op in ("call", "async-start"):
            for called in instruction.called.values():
                _walk(module, called, runs, traffic, stack + (name,))
            continue
        if op == "conditional":
            _walk_branches(module, instruction, runs, traffic, stack + (name,))
            continue
        if op in _COLLECTIVES or (
            op == "custom-call" and _COLLECTIVE_TARGET.search(instruction.target)
        ):
            traffic.collective_count += runs
            traffic.collective_bytes += runs * _array_bytes(instruction.shape)
            continue
        if op == "custom-call" and _TRIVIAL_TARGET.search(instruction.target):
            continue
        matmul = op in _MATMUL_OPCODES
        if op == "fusion-start":  # an asynchronous fusion: ((operands), result, context)
            instruction = dataclasses.replace(
                instruction, opcode="fusion", shape=_async_result_shape(instruction.shape)
            )
            op = "fusion"
        if op == "fusion":
            size = _fusion_bytes(module, instruction, computation)
            matmul = _contains_matmul(module, instruction.called.get("calls", ""))
        elif op in _ASYNC_COPIES:
            size = _async_copy_bytes(instruction, computation)
        elif op == "dynamic-update-slice":
            update = computation.by_name.get(instruction.operands[1])
            size = 2 * (_array_bytes(update.shape) if update else 0)
        elif op in ("dynamic-slice", "slice"):
            size = 2 * hlo.device_memory_bytes(instruction.shape)
        elif op == "custom-call" and (declared := _declared_bytes(instruction)) is not None:
            size = declared  # a Pallas kernel's own count, its blocks' re-reads included
            matmul = bool(_MATMUL_TARGET.search(instruction.target))
        else:
            size = _operand_bytes(instruction, computation) + hlo.device_memory_bytes(
                instruction.shape
            )
            if op == "custom-call":
                matmul = bool(_MATMUL_TARGET.search(instruction.target))
                if not matmul:
                    traffic.not_modeled.append(
                        f"custom call {instruction.target or instruction.name}: bytes only"
                    )
        if size:
            traffic.kernels.append(
                Kernel(instruction.name, op, instruction.op_name, runs * size, runs, matmul)
            )


def _async_result_shape(shape: str) -> str:
    """The result of an asynchronous start's `((operands...), result, context)` shape: what the
    wrapped fusion writes (GPUs run a scanned loop's in-place slice updates this way)."""
    depth, start, parts = 0, 1, []
    for i, char in enumerate(shape):
        if char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        if (char == "," and depth == 1) or (char == ")" and depth == 0):
            parts.append(shape[start:i].strip())
            start = i + 1
    return parts[1] if len(parts) > 1 else shape


def _walk_branches(module, instruction, runs, traffic, stack) -> None:
    best = None
    for branch in instruction.branches:
        trial = Traffic()
        _walk(module, branch, runs, trial, stack)
        if best is None or sum(k.bytes for k in trial.kernels) > sum(k.bytes for k in best.kernels):
            best = trial
    if best is not None:
        traffic.kernels += best.kernels
        traffic.collective_bytes += best.collective_bytes
        traffic.collective_count += best.collective_count
        traffic.not_modeled += best.not_modeled


def _operand_bytes(instruction: hlo.Instruction, computation: hlo.Computation) -> float:
    return sum(
        hlo.device_memory_bytes(computation.by_name[o].shape)
        for o in instruction.operands
        if o in computation.by_name
    )


# A Pallas kernel's `pl.CostEstimate`, which Mosaic keeps in the custom call's configuration.
_DECLARED_BYTES = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"?(\d+)')


def _declared_bytes(instruction: hlo.Instruction) -> float | None:
    """The device-memory bytes a kernel declares it moves (a Pallas kernel's cost estimate:
    with blocks fetched again for each block of the other operand, more than its operands and
    results), or None when it declares none."""
    match = _DECLARED_BYTES.search(instruction.attributes)
    return float(match.group(1)) if match and int(match.group(1)) > 0 else None


def _async_copy_bytes(instruction: hlo.Instruction, computation: hlo.Computation) -> float:
    """A copy-start or slice-start moves its result's second element; each side of the move
    that is device memory counts it once."""
    moved = hlo.arrays(instruction.shape)
    if len(moved) < 2:
        return 0.0
    piece = moved[1]
    source = computation.by_name.get(instruction.operands[0]) if instruction.operands else None
    source_in_hbm = source is None or any(a.memory_space == 0 for a in hlo.arrays(source.shape))
    sides = int(source_in_hbm) + int(piece.memory_space == 0)
    return float(piece.bytes * sides)


def traffic(hlo_text: str) -> Traffic:
    """Every kernel of the program in `hlo_text` (optimized HLO) with its device-memory bytes."""
    module = hlo.parse_module(hlo_text)
    found = Traffic()
    _walk(module, module.entry, 1, found)
    found.not_modeled = sorted(set(found.not_modeled))
    return found


def _source(op_name: str) -> str:
    """A kernel's JAX source, shortened: "jit(train_step)/jvp()/while/body/closed_call/add" ->
    "while/body/add" (transformations dropped, the last operations kept)."""
    parts = [
        p for p in op_name.split("/") if p and not p.startswith(("jit(", "jvp(", "closed_call"))
    ]
    parts = [
        p
        for p in parts
        if p not in ("transpose(jvp())", "body", "checkpoint", "rematted_computation")
    ]
    return "/".join(parts[-3:]) or "(copies and prefetches, no JAX source)"


def _kernel_seconds(kernel, rates: Rates) -> float:
    """A non-matmul kernel's time over its runs: its bytes at the bandwidth, at least
    `rates.kernel_seconds` a run."""
    return kernel.runs * max(
        kernel.bytes / kernel.runs / rates.bytes_per_second, rates.kernel_seconds
    )


def _largest_sources(kernels, rates: Rates, top: int) -> list[dict[str, Any]]:
    """The `top` lines of the program that move the most bytes in non-matmul kernels."""
    by_source: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0, 0.0])
    for kernel in kernels:
        if kernel.matmul:
            continue
        entry = by_source[_source(kernel.op_name)]
        entry[0] += kernel.bytes
        entry[1] += kernel.runs
        entry[2] += _kernel_seconds(kernel, rates)
    largest = sorted(by_source.items(), key=lambda item: -item[1][0])[:top]
    return [
        {"source": source, "bytes": size, "seconds": seconds, "kernels": int(count)}
        for source, (size, count, seconds) in largest
    ]


def estimate(
    hlo_text: str,
    matmul_flops: float,
    rates: Rates,
    *,
    attention_flops: float = 0.0,
    top: int = 8,
) -> dict[str, Any]:
    """The step's estimated time on one device, what bounds it and its largest memory-bound ops.

    Args:
      hlo_text: one device's optimized program (`compiled.as_text()`).
      matmul_flops: the matmul FLOPs one device runs per step (`t2t.aot.flops`, loops counted),
        fused attention's included.
      rates: the chip's matmul rate and memory bandwidth (and fused attention's rate).
      attention_flops: the part of `matmul_flops` in cuDNN's fused attention
        (`t2t.aot.flops.fused_attention_flops`); timed at `rates.attention_flops_per_second`
        when that is set, else at the matmul rate like the rest.
      top: how many of the largest memory-bound sources to list.

    Returns:
      {"step_seconds", "matmul_seconds", "matmul_memory_seconds", "attention_seconds",
      "other_seconds", "other_kernels" (how many non-matmul kernels run), "bound",
      "matmul_flops", "attention_flops" (the inputs, echoed),
      "matmul_bytes", "other_bytes", "hbm_bytes", "collective_bytes", "collective_count",
      "largest_memory_bound": [{"source", "bytes", "seconds", "kernels"}...], "rates",
      "not_modeled": [...]}.
    """
    found = traffic(hlo_text)
    if rates.attention_flops_per_second:
        attention = attention_flops / rates.attention_flops_per_second
        gemm_flops = matmul_flops - attention_flops
    else:
        attention, gemm_flops = 0.0, matmul_flops
    compute = gemm_flops / rates.matmul_flops_per_second
    matmul_memory = found.matmul_bytes / rates.bytes_per_second
    other = sum(_kernel_seconds(k, rates) for k in found.kernels if not k.matmul)
    other_kernels = sum(k.runs for k in found.kernels if not k.matmul)
    matmul_part = max(compute, matmul_memory)
    step = matmul_part + attention + other
    if other > max(matmul_part, attention):
        bound = "other kernels' memory traffic"
    elif attention > matmul_part:
        bound = "fused attention"
    elif compute >= matmul_memory:
        bound = "matmul compute"
    else:
        bound = "matmul kernels' memory traffic"
    return {
        "step_seconds": step,
        "matmul_seconds": compute,
        "matmul_memory_seconds": matmul_memory,
        "attention_seconds": attention,
        "other_seconds": other,
        "other_kernels": other_kernels,
        "bound": bound,
        "matmul_flops": matmul_flops,
        "attention_flops": attention_flops,
        "matmul_bytes": found.matmul_bytes,
        "other_bytes": found.other_bytes,
        "hbm_bytes": found.matmul_bytes + found.other_bytes,
        "collective_bytes": found.collective_bytes,
        "collective_count": found.collective_count,
        "largest_memory_bound": _largest_sources(found.kernels, rates, top),
        "rates": dataclasses.asdict(rates),
        "not_modeled": [
            "collectives (bytes listed; assumed overlapped by the interconnect)",
            "compute inside non-matmul kernels, cache reuse between kernels, tiling padding, "
            + (
                f"launch overhead beyond {rates.kernel_seconds * 1e6:.2f} us per kernel"
                if rates.kernel_seconds
                else "launch overhead"
            ),
            *found.not_modeled,
        ],
    }
