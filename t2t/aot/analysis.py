"""What a compiled program holds: memory per device, XLA's own FLOP count, collectives.

Everything here reads the compiler's own accounts of one device's program (XLA compiles one
SPMD program that every device runs): `memory_analysis()` for buffers, `cost_analysis()` for
FLOPs and bytes accessed, and the optimized HLO text for the collectives. The step-time estimate
is `t2t.aot.cost_model`'s.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from t2t.aot import hlo

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
# An instruction whose opcode is a collective (or its asynchronous start): "%x = SHAPE op(". The
# shape may be a tuple holding layouts, parentheses and "/*index=5*/" comments; it holds no
# opcode, so the first " op(" after " = " is the opcode.
_INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%\S+\s*=\s*(.*?)\s+(" + "|".join(COLLECTIVES) + r")(-start)?\(", re.MULTILINE
)


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape string: "f32[8,128]{1,0}" -> 4096; tuples add up."""
    return sum(a.bytes for a in hlo.arrays(shape))


def collectives(hlo_text: str) -> list[tuple[str, str]]:
    """(kind, result shape) of every collective in optimized HLO text, in program order.

    A combined collective (one instruction over a tuple of arrays) counts once, its result
    being the whole tuple. An asynchronous pair (`all-gather-start` / `-done`) counts once: the
    start's tuple holds the operands and then the results (all-gather), or the operand, the
    result and two scalar contexts (collective-permute); only the results are kept.
    """
    found = []
    for shape, kind, start in _INSTRUCTION.findall(hlo_text):
        if start and kind in ("all-gather", "collective-permute", "reduce-scatter"):
            arrays = [f"{a.dtype}[{','.join(map(str, a.dims))}]" for a in hlo.arrays(shape)]
            if kind == "collective-permute":
                arrays = arrays[1:2]
            else:  # (operands..., results...)
                arrays = arrays[len(arrays) // 2 :]
            shape = ", ".join(arrays)
        found.append((kind, shape))
    return found


def collective_census(hlo_text: str) -> dict[str, dict[str, int]]:
    """Count and result bytes of each kind of collective in optimized HLO text.

    Bytes are the sizes of the results one device receives: for an all-gather the gathered
    array, for a reduce-scatter its shard.

    Returns:
      {kind: {"count": n, "bytes": b}} for every kind in `COLLECTIVES` (zeros included).
    """
    census = {kind: {"count": 0, "bytes": 0} for kind in COLLECTIVES}
    for kind, shape in collectives(hlo_text):
        census[kind]["count"] += 1
        census[kind]["bytes"] += shape_bytes(shape)
    return census


@dataclasses.dataclass(frozen=True)
class Memory:
    """Bytes one device holds while the program runs (XLA's `memory_analysis`)."""

    arguments: int
    outputs: int
    aliased: int  # outputs written in place of donated arguments
    temporaries: int
    code: int

    @property
    def total(self) -> int:
        """Peak estimate: arguments, outputs not aliased to them, temporaries and code."""
        return self.arguments + self.outputs - self.aliased + self.temporaries + self.code

    @classmethod
    def of(cls, compiled: Any) -> Memory:
        m = compiled.memory_analysis()
        return cls(
            int(m.argument_size_in_bytes),
            int(m.output_size_in_bytes),
            int(m.alias_size_in_bytes),
            int(m.temp_size_in_bytes),
            int(m.generated_code_size_in_bytes),
        )


def costs(compiled: Any) -> dict[str, float]:
    """FLOPs and bytes accessed of one device's program (`cost_analysis`)."""
    analysis = compiled.cost_analysis()
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else {}
    analysis = analysis or {}
    return {
        "flops": float(analysis.get("flops", 0.0)),
        "bytes_accessed": float(analysis.get("bytes accessed", 0.0)),
    }


# The out-of-memory message of libtpu's compiler, e.g. "... exceeds available HBM (15.75G)" or
# "Used 40.12G of 15.75G hbm".
_OOM_USED = re.compile(r"Used ([\d.]+)([KMGT])? of ([\d.]+)([KMGT])? hbm")
_OOM_REQUIRED = re.compile(
    r"required for [^(]*\(([\d.]+)([KMGT])?\) exceeds available HBM \(([\d.]+)([KMGT])?\)"
)
_UNITS = {None: 1, "": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def parse_out_of_memory(message: str) -> tuple[int, int] | None:
    """(bytes required, bytes available) from a compiler out-of-memory error, or None."""
    for pattern in (_OOM_USED, _OOM_REQUIRED):
        match = pattern.search(message)
        if match:
            used, used_unit, limit, limit_unit = match.groups()
            return (
                int(float(used) * _UNITS[used_unit or ""]),
                int(float(limit) * _UNITS[limit_unit or ""]),
            )
    return None


def is_out_of_memory(message: str) -> bool:
    return "RESOURCE_EXHAUSTED" in message or "Ran out of memory" in message
