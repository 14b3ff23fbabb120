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
    parts = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            parts.append(str(key.key))
        elif isinstance(key, jax.tree_util.SequenceKey):
            parts.append(str(key.idx))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            parts.append(key.name)
        else:
            parts.append(str(key))
    if parts and parts[-1] == "value":
        parts.pop()
    return "/".join(parts)
