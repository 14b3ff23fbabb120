"""Fine-tuning additions to a pretrained network, as parameter-tree operations.

The network's configuration may add parameters a pretrained checkpoint does not have
(`TransformerConfig.adapter_size`, `lora_rank`, `prompt_length`). Two operations on parameter
trees (nested dicts of arrays, either layer layout) go with them:

- `merge_lora`: folds every LoRA update into its kernel, `W <- W + (alpha / r) A B`, and returns
  the plain network's parameters and configuration: a LoRA-tuned model exported or fine-tuned
  further as an ordinary T5.
- `is_added`: whether a parameter is an addition (absent from the network without them), so
  loading a pretrained checkpoint fills everything else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax.numpy as jnp
import numpy as np

from t2t.nn.config import TransformerConfig

LORA_A, LORA_B = "lora_a", "lora_b"
# Path components that only additions have.
ADDED_COMPONENTS = ("adapter", LORA_A, LORA_B, "prompt")


def merge_lora(
    params: Mapping[str, Any], config: TransformerConfig
) -> tuple[dict[str, Any], TransformerConfig]:
    """The parameters with every LoRA update merged into its kernel, and the config without LoRA.

    Works on concrete (numpy) and traced arrays, scanned ([L, ...]) or not; the merge is done in
    float32 and stored in the kernel's dtype.

    Args:
      params: nested dicts of arrays (`nnx.to_pure_dict` of a network's parameters).
      config: the network's config (its `lora_alpha` / `lora_rank` give the scale).

    Returns:
      (params without `lora_a` / `lora_b`, `config` with `lora_rank=0`).
    """
    if not config.lora_rank:
        return dict(params), config
    scale = config.lora_scale

    def merge(node):
        if not isinstance(node, Mapping):
            return node
        node = {k: merge(v) for k, v in node.items()}
        if LORA_A in node and LORA_B in node:
            a, b = node.pop(LORA_A), node.pop(LORA_B)  # [..., in, r], [..., r, out]
            kernel = node["kernel"]
            xp = np if isinstance(kernel, np.ndarray) else jnp
            update = xp.einsum(
                "...ir,...ro->...io", xp.asarray(a, np.float32), xp.asarray(b, np.float32)
            )
            node["kernel"] = (xp.asarray(kernel, np.float32) + scale * update).astype(kernel.dtype)
        return node

    return merge(params), config.replace(lora_rank=0)


def is_added(path: str) -> bool:
    """Whether a parameter path ("encoder/layers_0/mlp/adapter/wi/kernel") is an addition."""
    return any(part in ADDED_COMPONENTS for part in path.split("/"))
