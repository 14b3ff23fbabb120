"""Attention masks: which key each query may see, as boolean [B, 1, L, S] arrays.

A mask is True where attention is allowed. Masks combine with logical AND (`combine_masks`).
They stay boolean, and apart from the relative position bias, all the way to the attention op:
a stack hands its layers a `Visibility` (the mask's parts: padding, packing segments, causal,
a prefix), and each implementation of the op (`t2t.nn.attention_ops`) takes the parts it can
use. XLA rebuilds the boolean mask inside the attention kernel from [B, L]-sized parts; cuDNN
takes causal and padding as flags and lengths. Nothing of size [B, N, L, S] is made outside
the op, and no mask becomes an additive bias that the backward pass would accumulate.

Worked example (tested): tokens [[5, 6, 0]] (one pad) give `padding_mask` rows
[1 1 0], [1 1 0], [0 0 0]; `causal_mask(3)` is lower triangular; segments [[1, 1, 2]] give
`segment_mask` rows [1 1 0], [1 1 0], [0 0 1]; `prefix_lm_mask` with causal_attention
[[1, 1, 0, 0]] lets the two prefix positions see each other and keeps the rest causal.
"""

from __future__ import annotations

import dataclasses

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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Visibility:
    """Which keys each query of an attention may see, kept in parts.

    Every part is optional; the visible pairs are those every given part allows (AND). The
    parts have at most [B, L] or [B, S] elements, except `dense` (the decoding step's
    per-row window, [R, 1, 1, S]).

    Attributes:
      causal: query i sees keys j <= i (self-attention, L == S). Static.
      query_valid: [B, L] bool, the query is not padding.
      key_valid: [B, S] bool, the key is not padding.
      query_segments, key_segments: [B, L], [B, S] packing segment ids: a query sees the
        keys of its own segment (both or neither given).
      prefix: [B, L] bool, the fully visible prefix of a prefix LM (L == S): a query of the
        prefix sees every key of the prefix, in addition to what `causal` allows.
      dense: a boolean [B or 1, 1, L, S] mask for anything the parts cannot say.
    """

    causal: bool = dataclasses.field(default=False, metadata=dict(static=True))
    query_valid: jax.Array | None = None
    key_valid: jax.Array | None = None
    query_segments: jax.Array | None = None
    key_segments: jax.Array | None = None
    prefix: jax.Array | None = None
    dense: jax.Array | None = None

    def __post_init__(self):
        if (self.query_segments is None) != (self.key_segments is None):
            raise ValueError(
                "Packed attention needs segment ids for both queries and keys; got only one of "
                "query_segments / key_segments."
            )
        if self.prefix is not None and not self.causal:
            raise ValueError("A prefix (prefix LM) only widens a causal mask; set causal=True.")

    @property
    def packed(self) -> bool:
        return self.query_segments is not None

    def mask(self, query_length: int, key_length: int) -> jax.Array | None:
        """The boolean [B or 1, 1, L, S] mask of every part (None when nothing is masked).

        Built where attention uses it, so the compiler fuses it into the masking of the
        logits instead of reading a stored [B, 1, L, S] array.
        """
        causal = None
        if self.causal:
            if query_length != key_length:
                raise ValueError(
                    f"A causal mask needs as many queries as keys, got {query_length} and "
                    f"{key_length}."
                )
            causal = causal_mask(query_length)
            if self.prefix is not None:
                causal = causal | pairwise_mask(self.prefix, self.prefix)
        padding = None
        if self.query_valid is not None or self.key_valid is not None:
            padding = combine_masks(
                None if self.query_valid is None else self.query_valid[:, None, :, None],
                None if self.key_valid is None else self.key_valid[:, None, None, :],
            )
        segments = None
        if self.packed:
            segments = segment_mask(self.query_segments, self.key_segments)
        return combine_masks(causal, padding, segments, self.dense)


def mask_to_bias(mask: jax.Array | None) -> jax.Array | None:
    """Boolean mask -> float32 additive bias (0 where allowed, -1e10 where masked).

    For references and tests (the arithmetic t2t's attention had before masks reached the op
    as booleans); the network itself masks with `jnp.where` inside the op."""
    if mask is None:
        return None
    return jnp.where(mask, 0.0, MASKED_BIAS).astype(jnp.float32)
