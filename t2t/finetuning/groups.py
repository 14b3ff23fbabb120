"""Named groups of a network's parameters, and where each parameter sits in its stack.

Fine-tuning methods say what trains in words a reader knows ("decoder", "layer_norms",
"adapters", "decoder_layer:-1") or with a regular expression searched in the parameter's path
(`encoder/layers_0/mlp/wi/kernel`). `select(params, specs)` turns such specs into one mask per
parameter:

- `True` / `False` for a parameter wholly selected or not;
- a boolean array [L] for a parameter of scanned layers (stacked [L, ...], `.../layers/...`)
  that a layer-wise spec selects only some layers of.

`position(path, shape)` says which stack and layer a parameter belongs to, for the per-layer
methods (gradual unfreezing, layer-wise learning rates). Stack-level parameters: the relative
position table goes with the bottom layer (every layer reads it, the first one first); the final
norm and the untied output projection with the top layer; the token embedding (and a soft
prompt) belong to no stack.
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from t2t.nn.additions import is_added
from t2t.pytrees import is_variable, param_path

STACKS = ("encoder", "decoder")
_LAYER = re.compile(r"^layers_(\d+)$")
_LAYER_SPEC = re.compile(r"^(encoder_|decoder_)?layer:(-?\d+)$")
_STACKED = "layers"  # the path component of scanned (stacked) layers


def _has(component: str) -> Callable[[list[str]], bool]:
    return lambda parts: component in parts


def _in_stack(stack: str) -> Callable[[list[str]], bool]:
    return lambda parts: parts[0] == stack


def _any_of(*components: str) -> Callable[[list[str]], bool]:
    return lambda parts: any(p in components for p in parts)


def _norms(parts: list[str]) -> bool:
    return any(p.endswith("norm") for p in parts)


def _original(test: Callable[[list[str]], bool]) -> Callable[[list[str]], bool]:
    """`test` restricted to parameters of the pretrained network (no additions)."""
    return lambda parts: test(parts) and not is_added("/".join(parts))


# Group name -> test on the path's components. Layer groups ("layer:i") are parsed separately.
GROUPS: dict[str, Callable[[list[str]], bool]] = {
    "all": lambda parts: True,
    "encoder": _in_stack("encoder"),
    "decoder": _in_stack("decoder"),
    "embeddings": _in_stack("token_embedder"),
    "logits": _has("logits_dense"),
    "layer_norms": _norms,
    "relpos": _has("relpos_bias"),
    "attention": _original(_any_of("attention", "self_attention", "encoder_decoder_attention")),
    "mlp": _original(_has("mlp")),
    "adapters": _has("adapter"),
    "lora": _any_of("lora_a", "lora_b"),
    "prompt": _in_stack("prompt"),
}
GROUP_HELP = (
    f"a group ({', '.join(GROUPS)}), a layer (layer:I in every stack, encoder_layer:I, "
    "decoder_layer:I; I < 0 counts from the top, layer:-1 is the top layer), or a regular "
    "expression searched in parameter paths such as encoder/layers_0/mlp/wi/kernel"
)


@dataclasses.dataclass(frozen=True)
class Position:
    """Where a parameter sits.

    Attributes:
      stack: "encoder", "decoder", or None (token embedding, soft prompt).
      layer: its layer index; None for the stack's stacked (scanned) parameters, which hold
        every layer along axis 0, and for parameters outside the stacks.
      num_layers: the stack's depth (0 outside the stacks).
      stacked: whether axis 0 is the layer axis (scanned layers).
    """

    stack: str | None
    layer: int | None
    num_layers: int
    stacked: bool

    def layers(self) -> np.ndarray:
        """The layer index of each slice: [L] for stacked parameters, [1] otherwise (-1 outside
        the stacks)."""
        if self.stacked:
            return np.arange(self.num_layers)
        return np.array([-1 if self.layer is None else self.layer])


def position(path: str, shape: Sequence[int], depths: Mapping[str, int]) -> Position:
    """The stack and layer of the parameter at `path` (shape needed for stacked layers).

    Args:
      path: e.g. "decoder/layers_3/mlp/wo/kernel" or "decoder/layers/mlp/wo/kernel" (scanned).
      shape: the parameter's shape.
      depths: {"encoder": layers, "decoder": layers} of the network.
    """
    parts = path.split("/")
    stack = parts[0] if parts[0] in STACKS else None
    if stack is None:
        return Position(None, None, 0, False)
    depth = depths[stack]
    component = parts[1] if len(parts) > 1 else ""
    if component == _STACKED:
        assert shape and shape[0] == depth, (path, shape, depth)
        return Position(stack, None, depth, True)
    match = _LAYER.match(component)
    if match:
        return Position(stack, int(match.group(1)), depth, False)
    if component == "relpos_bias":
        return Position(stack, 0, depth, False)
    return Position(stack, depth - 1, depth, False)  # final norm, logits: the top


def depths_of(params: Any) -> dict[str, int]:
    """{"encoder": layers, "decoder": layers} of a parameter tree (0 for a missing stack)."""
    depths = {stack: 0 for stack in STACKS}
    for path, shape in leaf_shapes(params):
        parts = path.split("/")
        if parts[0] not in STACKS or len(parts) < 2:
            continue
        match = _LAYER.match(parts[1])
        if match:
            depths[parts[0]] = max(depths[parts[0]], int(match.group(1)) + 1)
        elif parts[1] == _STACKED:
            depths[parts[0]] = max(depths[parts[0]], int(shape[0]))
    return depths


def _value(leaf: Any) -> Any:
    return leaf.get_value() if is_variable(leaf) else leaf


def _shape(leaf: Any) -> tuple[int, ...]:
    return tuple(np.shape(_value(leaf)))


def _absent(leaf: Any) -> bool:
    """A placeholder `optax.multi_transform` leaves where another label's parameters are."""
    return isinstance(_value(leaf), optax.MaskedNode)


def leaf_shapes(params: Any) -> list[tuple[str, tuple[int, ...]]]:
    """(path, shape) of every parameter, in tree order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(params, is_leaf=is_variable)
    return [(param_path(path), _shape(leaf)) for path, leaf in flat if not _absent(leaf)]


def map_params(fn: Callable[[str, tuple[int, ...]], Any], params: Any) -> Any:
    """A tree like `params` whose every parameter is `fn(path, shape)` (an `nnx.Variable` keeps
    its type and metadata, holding the new value), e.g. optax labels or update masks. The
    placeholders of `optax.multi_transform` stay."""

    def one(path, leaf):
        if _absent(leaf):
            return leaf
        value = fn(param_path(path), _shape(leaf))
        return leaf.replace(value) if is_variable(leaf) else value

    return jax.tree_util.tree_map_with_path(one, params, is_leaf=is_variable)


Spec = str


def check_specs(specs: Sequence[Spec], what: str) -> None:
    """Raises ValueError for a spec that is neither a group, a layer nor a valid regex."""
    if isinstance(specs, str):
        raise TypeError(
            f"{what} must be a list of specs, got the string {specs!r}; write [{specs!r}]."
        )
    for spec in specs:
        if spec in GROUPS or _LAYER_SPEC.match(spec):
            continue
        try:
            re.compile(spec)
        except re.error as error:
            near = difflib.get_close_matches(spec, list(GROUPS), n=1)
            hint = f" Did you mean {near[0]!r}?" if near else ""
            raise ValueError(f"{what}: {spec!r} is not {GROUP_HELP} ({error}).{hint}") from None


def _spec_mask(spec: Spec, parts: list[str], path: str, where: Position) -> bool | np.ndarray:
    if spec in GROUPS:
        return bool(GROUPS[spec](parts))
    match = _LAYER_SPEC.match(spec)
    if match is None:
        return re.search(spec, path) is not None
    stack_prefix, index = match.group(1), int(match.group(2))
    if where.stack is None or (stack_prefix and stack_prefix[:-1] != where.stack):
        return False
    layer = index % where.num_layers if index < 0 else index
    if where.stacked:
        return where.layers() == layer
    return where.layer == layer and _in_layer(parts)


def _in_layer(parts: list[str]) -> bool:
    """Whether a stack's parameter lives in one of its layers (not the stack-level ones)."""
    return len(parts) > 1 and bool(_LAYER.match(parts[1]))


def select(params: Any, specs: Sequence[Spec], depths: Mapping[str, int] | None = None) -> Any:
    """A tree like `params` of masks: True, False, or [L] bool for stacked parameters that
    layer specs select in part (see the module docstring). `depths` (the stacks' layers) is
    read off `params` when not given."""
    depths = depths or depths_of(params)

    def mask_of(path: str, shape: tuple[int, ...]):
        parts = path.split("/")
        where = position(path, shape, depths)
        mask = np.zeros(where.num_layers if where.stacked else (), bool)
        for spec in specs:
            mask = np.logical_or(mask, _spec_mask(spec, parts, path, where))
        if mask.ndim == 0 or mask.all() or not mask.any():
            return bool(mask.all())
        return mask

    return map_params(mask_of, params)


def masks_of(masks: Any) -> list[bool | np.ndarray]:
    """The masks of a tree from `select`, in tree order."""
    flat, _ = jax.tree_util.tree_flatten(masks, is_leaf=is_variable)
    return [m.get_value() if is_variable(m) else m for m in flat]


def count(params: Any, masks: Any) -> int:
    """The number of parameter elements a mask tree (from `select`) selects."""
    total = 0
    for (_, shape), mask in zip(leaf_shapes(params), masks_of(masks)):
        size = int(np.prod(shape, dtype=np.int64))
        if isinstance(mask, np.ndarray):
            total += size // mask.size * int(mask.sum())
        elif mask:
            total += size
    return total
