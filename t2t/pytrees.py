"""Parameter trees, as every layer reads them: which leaves are NNX variables, and each leaf's
path named as T5X names it ("encoder/layers_0/mlp/wi/kernel").

A leaf module (flax and jax only), so the optimizer, the partitioner, the fine-tuning groups and
the layer stacking share one definition without importing each other or the network.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jax
from flax import nnx


def is_variable(x: Any) -> bool:
    """Whether a tree leaf is an NNX variable (the `is_leaf` of parameter-tree maps)."""
    return isinstance(x, nnx.Variable)


def param_path(path: Sequence[Any]) -> str:
    """A tree path as T5X-style "encoder/layers_0/mlp/wi/kernel" (Variable `.value` dropped)."""
    parts = list(key_names(path))
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)


def key_names(path: Sequence[Any]) -> tuple[str, ...]:
    """Every component of a tree path as a string (dict keys, indices, attribute names)."""
    return tuple(_key_name(key) for key in path)


def _key_name(key: Any) -> str:
    if isinstance(key, jax.tree_util.DictKey):
        return str(key.key)
    if isinstance(key, jax.tree_util.SequenceKey):
        return str(key.idx)
    if isinstance(key, jax.tree_util.GetAttrKey):
        return key.name
    return str(key)


# The second-moment slots of Adafactor, as optax's `FactoredState` and T5X name them.
ADAFACTOR_SLOTS = ("v_row", "v_col", "v")


def adafactor_slot(names: Sequence[str], params: Any) -> tuple[str, tuple[str, ...]] | None:
    """(slot, parameter path) of an optimizer-state leaf whose path `names` holds one of
    `ADAFACTOR_SLOTS` and one of the paths in `params` (a set of tuples), wherever the
    optimizer's wrappers put them; None for any other leaf.

    Example: ("0", "v_row", "encoder", "layers_0", "mlp", "wo", "kernel", "value") ->
    ("v_row", ("encoder", "layers_0", "mlp", "wo", "kernel")).
    """
    slots = [n for n in names if n in ADAFACTOR_SLOTS]
    if len(slots) != 1:
        return None
    for length in range(len(names), 0, -1):
        for start in range(len(names) - length + 1):
            candidate = tuple(names[start : start + length])
            if candidate in params:
                return slots[0], candidate
    return None
