"""A reader of optimized HLO text: computations, instructions, array sizes and memory spaces.

The cost model (`t2t.aot.cost_model`) walks what the compiler will run: the entry computation,
loop bodies (with their trip counts), called computations, and each fusion as one kernel whose
operands and results cross memory. This module only parses; it knows nothing of costs.

The text is XLA's `compiled.as_text()`: computations such as

    %fused_computation.3 (param_0: f32[8,128]) -> f32[8] { ... }
    ENTRY %main (p: f32[8,128]) -> f32[8] {
      %p = f32[8,128]{1,0} parameter(0)
      ROOT %fusion = f32[8]{0:T(256)} fusion(%p), kind=kLoop, calls=%fused_computation.3
    }

An array's layout may name a memory space, `S(1)` on TPUs (on-chip vector memory); arrays
without one live in device memory (HBM).
"""

from __future__ import annotations

import dataclasses
import re

# dtype[dims]{layout}: the layout (optional) may hold tiling and a memory space, e.g.
# "bf16[128,512]{1,0:T(8,128)(2,1)S(1)}".
_ARRAY = re.compile(
    r"\b(pred|s4|u4|s8|u8|s16|u16|f16|bf16|s32|u32|f32|s64|u64|f64|c64|c128|f8e4m3fn|f8e5m2|"
    r"f8e4m3b11fnuz|f8e4m3fnuz|f8e5m2fnuz|token)\[([\d,]*)\](\{[^{}]*\})?"
)
_ITEM_BYTES = {
    "pred": 1,
    "s4": 0.5,
    "u4": 0.5,
    "s8": 1,
    "u8": 1,
    "s16": 2,
    "u16": 2,
    "f16": 2,
    "bf16": 2,
    "s32": 4,
    "u32": 4,
    "f32": 4,
    "s64": 8,
    "u64": 8,
    "f64": 8,
    "c64": 8,
    "c128": 16,
    "f8e4m3fn": 1,
    "f8e5m2": 1,
    "f8e4m3b11fnuz": 1,
    "f8e4m3fnuz": 1,
    "f8e5m2fnuz": 1,
    "token": 0,
}
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")
_HEADER = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s+\((.*)\)\s+->\s+(.*)\{\s*$")
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_OPCODE = re.compile(r"\s*([\w\-]+)\(")
_CALLED = re.compile(r"\b(calls|body|condition|to_apply)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


@dataclasses.dataclass(frozen=True)
class Array:
    """One array of a shape: its element type, dimensions and memory space (0 = HBM)."""

    dtype: str
    dims: tuple[int, ...]
    memory_space: int = 0

    @property
    def bytes(self) -> int:
        count = 1
        for d in self.dims:
            count *= d
        return int(count * _ITEM_BYTES[self.dtype])


def arrays(shape: str) -> list[Array]:
    """The arrays of an HLO shape string, in order ("(f32[2]{0}, bf16[4,4]{1,0:S(1)})" -> two)."""
    found = []
    for dtype, dims, layout in _ARRAY.findall(shape):
        space = _MEMORY_SPACE.search(layout or "")
        found.append(
            Array(
                dtype,
                tuple(int(d) for d in filter(None, dims.split(","))),
                int(space.group(1)) if space else 0,
            )
        )
    return found


def device_memory_bytes(shape: str) -> int:
    """Bytes of the arrays of `shape` that live in device memory (no memory-space annotation)."""
    return sum(a.bytes for a in arrays(shape) if a.memory_space == 0)


@dataclasses.dataclass
class Instruction:
    """One HLO instruction: `%name = shape opcode(operands), attributes`."""

    name: str
    shape: str
    opcode: str
    operands: list[str]
    attributes: str
    is_root: bool = False
    operand_text: str = ""  # what the parentheses hold: "0" for parameter(0), a literal

    @property
    def parameter_index(self) -> int | None:
        """A parameter's position, None for other instructions."""
        if self.opcode != "parameter" or not self.operand_text.strip().isdigit():
            return None
        return int(self.operand_text)

    @property
    def called(self) -> dict[str, str]:
        """Computations it names: {"calls": ..., "body": ..., "condition": ..., "to_apply": ...}."""
        return dict(_CALLED.findall(self.attributes))

    @property
    def branches(self) -> list[str]:
        match = _BRANCHES.search(self.attributes)
        if not match:
            return []
        return [b.strip().lstrip("%") for b in match.group(1).split(",") if b.strip()]

    @property
    def target(self) -> str:
        """A custom call's target ("" for other instructions)."""
        match = _TARGET.search(self.attributes)
        return match.group(1) if match else ""

    @property
    def op_name(self) -> str:
        """The JAX operation it came from (metadata), or "" when absent."""
        match = _OP_NAME.search(self.attributes)
        return match.group(1) if match else ""

    @property
    def known_trip_count(self) -> int | None:
        match = _TRIP_COUNT.search(self.attributes)
        return int(match.group(1)) if match else None


@dataclasses.dataclass
class Computation:
    name: str
    instructions: list[Instruction]
    is_entry: bool = False

    def __post_init__(self):
        self.by_name = {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction:
        return next((i for i in self.instructions if i.is_root), self.instructions[-1])

    def users(self, name: str) -> list[Instruction]:
        return [i for i in self.instructions if name in i.operands]


@dataclasses.dataclass
class Module:
    computations: dict[str, Computation]
    entry: str

    @property
    def entry_computation(self) -> Computation:
        return self.computations[self.entry]


def _closing(text: str, start: int) -> int:
    """Index of the parenthesis closing the one at `start`."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"Unbalanced parentheses in HLO: {text[start : start + 200]!r}")


def _split_operands(text: str) -> list[str]:
    names, depth, token = [], 0, []
    for char in text + ",":
        if char in "({[":
            depth += 1
        elif char in ")}]":
            depth -= 1
        if char == "," and depth == 0:
            word = "".join(token).strip()
            # "%name", or "f32[2]{0} %name" in older text; literals (constant(1)) have none.
            refs = [w for w in word.split() if w.startswith("%")]
            if refs:
                names.append(refs[-1].lstrip("%"))
            token = []
        else:
            token.append(char)
    return names


def parse_instruction(line: str) -> Instruction | None:
    """An instruction line, or None for anything else (headers, braces, blank lines)."""
    match = _INSTRUCTION.match(line)
    if not match:
        return None
    root, name, rest = match.groups()
    rest = rest.strip()
    if rest.startswith("("):  # a tuple shape
        end = _closing(rest, 0) + 1
    else:
        end = rest.find(" ")
        if end < 0:
            return None
    shape, tail = rest[:end], rest[end:]
    opcode = _OPCODE.match(tail)
    if not opcode:
        return None
    open_paren = tail.index("(", opcode.start(1))
    close_paren = _closing(tail, open_paren)
    return Instruction(
        name=name,
        shape=shape,
        opcode=opcode.group(1),
        operands=_split_operands(tail[open_paren + 1 : close_paren]),
        attributes=tail[close_paren + 1 :],
        is_root=bool(root),
        operand_text=tail[open_paren + 1 : close_paren],
    )


def parse_module(text: str) -> Module:
    """Every computation of an HLO module's text, and which one is the entry.

    Raises:
      ValueError: when the text holds no entry computation.
    """
    computations: dict[str, Computation] = {}
    entry = None
    current: tuple[str, bool] | None = None
    body: list[Instruction] = []
    for line in text.splitlines():
        if current is None:
            header = _HEADER.match(line)
            if header:
                current = (header.group(2), bool(header.group(1)))
                body = []
            continue
        if line.strip() == "}":
            name, is_entry = current
            computations[name] = Computation(name, body, is_entry)
            if is_entry:
                entry = name
            current = None
            continue
        instruction = parse_instruction(line)
        if instruction is not None:
            body.append(instruction)
    if entry is None:
        raise ValueError("The HLO text holds no ENTRY computation; pass compiled.as_text().")
    return Module(computations, entry)
