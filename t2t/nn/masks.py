"""Attention masks: which key each query may see, as boolean [B, 1, L, S] arrays.

A mask is True where attention is allowed. Masks combine with logical AND (`combine_masks`) and
become an additive bias once per stack (`mask_to_bias`), so layers only add a tensor.

Worked example (tested): tokens [[5, 6, 0]] (one pad) give `padding_mask` rows
[1 1 0], [1 1 0], [0 0 0]; `causal_mask(3)` is lower triangular; segments [[1, 1, 2]] give
`segment_mask` rows [1 1 0], [1 1 0], [0 0 1]; `prefix_lm_mask` with causal_attention
[[1, 1, 0, 0]] lets the two prefix positions see each other and keeps the rest causal.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# NOTE: a large finite negative number, not -inf: a fully masked row (a padding query) then gets
# a uniform softmax instead of NaNs.
MASKED_BIAS = -1e10


def pairwise_mask(query_valid: jax.Array, key_valid: jax.Array) -> jax.Array:
    """[B, L] bool, [B, S] bool -> [B, 1, L, S]: True where both query and key are valid."""
    return query_valid[:, None, :, None] & key_valid[:, None, None, :]


def padding_mask(query_tokens: jax.Array, key_tokens: jax.Array) -> jax.Array:
    """[B, L], [B, S] int tokens (0 = padding) -> [B, 1, L, S]: neither side is padding."""
    return pairwise_mask(query_tokens > 0, key_tokens > 0)


def key_padding_mask(key_tokens: jax.Array) -> jax.Array:
    """[B, S] int tokens -> [B, 1, 1, S]: the key is not padding (any query)."""
    return (key_tokens > 0)[:, None, None, :]


def causal_mask(length: int) -> jax.Array:
    """[1, 1, T, T]: query i sees keys j <= i."""
    idx = jnp.arange(length)
    return (idx[None, :] <= idx[:, None])[None, None]


def segment_mask(query_segment_ids: jax.Array, key_segment_ids: jax.Array) -> jax.Array:
    """[B, L], [B, S] packing segment ids -> [B, 1, L, S]: same packed example."""
    return query_segment_ids[:, None, :, None] == key_segment_ids[:, None, None, :]


def prefix_lm_mask(causal_attention: jax.Array) -> jax.Array:
    """[B, T] (1 on the fully visible prefix) -> [B, 1, T, T]: causal, or both in the prefix."""
    prefix = causal_attention.astype(bool)
    return causal_mask(causal_attention.shape[-1]) | pairwise_mask(prefix, prefix)


def combine_masks(*masks: jax.Array | None) -> jax.Array | None:
    """Logical AND of the masks that are not None (broadcasting); None if all are None."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    result = present[0]
    for m in present[1:]:
        result = result & m
    return result


def mask_to_bias(mask: jax.Array | None) -> jax.Array | None:
    """Boolean mask -> float32 additive bias (0 where allowed, -1e10 where masked)."""
    if mask is None:
        return None
    return jnp.where(mask, 0.0, MASKED_BIAS).astype(jnp.float32)
