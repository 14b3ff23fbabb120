"""The attention op, `softmax(q k + bias, masked) v`, and its implementations.

T5's attention adds a learned relative position bias [1, N, L, S] (one per stack, no batch
dimension) and masks padding, packing segments and future positions. This module keeps the two
apart until the op: the bias arrives as [1, N, L, S] and the mask as a `masks.Visibility`, and
each implementation combines them the way its kernel wants.

- `xla`: two einsums and a float32 softmax that XLA fuses; the mask is rebuilt inside the
  kernel from its [B, L]-sized parts. Runs everywhere, supports everything (dropout on the
  attention weights, a per-row bias in decoding steps, prefix LMs).
- `cudnn`: cuDNN's fused flash attention through `jax.nn.dot_product_attention`, on NVIDIA
  GPUs in bfloat16 or float16. Causal masking is a flag and padding a length per row (rows
  padded at the end, as seqio's converters and t2t's batches make them); packed segments and
  prefix LMs pass a boolean mask, which JAX's wrapper turns into a per-row bias. The bias is
  cast to the compute dtype: with a float32 bias cuDNN's bias gradient was measured wrong
  (issue 32). No dropout on attention weights.
- `auto`: per call site, from the platform the program is compiled for: `cudnn` on GPUs for
  the encoder's self-attention (bias, not causal: measured 2.1x faster forward + backward on an
  H100 at T5.1.1-base's shapes), `xla` elsewhere (the 114-token causal decoder was measured
  slower on cuDNN; cross-attention is unmeasured). `describe` says what `auto` picks.

NOTE: T5 does not scale the logits by 1/sqrt(H) (the factor is in the query initializer), so
every implementation is called with scale 1.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from t2t.nn import layers, masks
from t2t.nn.config import ATTENTION_IMPLS as IMPLEMENTATIONS
# NOTE: a large finite negative number, not -inf: a query that may see no key (a padding
# query) then gets a uniform softmax instead of NaNs, as with the additive -1e10 of old.
MASKED_LOGIT = masks.MASKED_BIAS
# cuDNN's flash attention: the head dimensions it takes and the compute dtypes.
_CUDNN_DTYPES = ("bfloat16", "float16")
_CUDNN_MAX_HEAD_DIM = 128


def current_platform() -> str:
    """The platform the program being traced is for: the current mesh's devices (which may be
    a TPU slice described to the compiler, `t2t compile`), else JAX's default backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    platform = getattr(device, "platform", None)
    return platform or jax.default_backend()


def cudnn_unsupported(
    *,
    platform: str,
    dtype: str,
    head_dim: int,
    dropout: bool,
    per_row_bias: bool = False,
) -> str | None:
    """Why cuDNN flash attention cannot run this attention (None when it can)."""
    if platform not in ("gpu", "cuda"):
        return f"cuDNN flash attention runs on NVIDIA GPUs, and this program is for {platform}"
    if dtype not in _CUDNN_DTYPES:
        return (
            f"cuDNN flash attention computes in bfloat16 or float16, and the network computes in "
            f"{dtype} (TransformerConfig.dtype='bfloat16')"
        )
    if head_dim % 8 or head_dim > _CUDNN_MAX_HEAD_DIM:
        return f"cuDNN flash attention needs d_kv a multiple of 8 up to 128, got {head_dim}"
    if dropout:
        return (
            "cuDNN flash attention has no dropout on the attention weights; train with "
            "dropout_rate=0 (T5.1.1 pretraining does) or attention_impl='xla'"
        )
    if per_row_bias:
        return "a bias per row (decoding steps) is left to XLA"
    return None


def choose(
    requested: str,
    *,
    platform: str,
    dtype: str,
    head_dim: int,
    causal: bool,
    has_bias: bool,
    dropout: bool = False,
    per_row_bias: bool = False,
) -> str:
    """The implementation one attention call runs: `requested`, or `auto`'s pick.

    Raises:
      ValueError: `requested` is unknown, or is "cudnn" where cuDNN cannot run (the message
        says why and what to change).
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(
            f"attention_impl must be one of {IMPLEMENTATIONS}, got {requested!r}."
        )
    reason = cudnn_unsupported(
        platform=platform,
        dtype=dtype,
        head_dim=head_dim,
        dropout=dropout,
        per_row_bias=per_row_bias,
    )
    if requested == "cudnn":
        if reason is not None and not per_row_bias:
            raise ValueError(
                f"attention_impl='cudnn' cannot run here: {reason}. Use attention_impl='auto' "
                "(cuDNN where it can run, XLA elsewhere) or 'xla'."
            )
        return "xla" if per_row_bias else "cudnn"
    if requested == "auto":
        return "cudnn" if reason is None and has_bias and not causal else "xla"
    return requested


def describe(config, platform: str, *, training: bool = True) -> dict[str, str]:
    """What each attention site of `config`'s network runs on `platform`, e.g.
    {"encoder self-attention": "cudnn", "decoder self-attention": "xla", ...}."""
    dropout = training and config.dropout_rate > 0
    sites = {}
    if not config.is_decoder_only:
        sites["encoder self-attention"] = (False, True)
    sites["decoder self-attention"] = (True, True)
    if not config.is_decoder_only:
        sites["cross-attention"] = (False, False)
    return {
        site: choose(
            config.attention_impl,
            platform=platform,
            dtype=config.dtype,
            head_dim=config.d_kv,
            causal=causal,
            has_bias=has_bias,
            dropout=dropout,
        )
        for site, (causal, has_bias) in sites.items()
    }


def attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None,
    visibility: masks.Visibility,
    *,
    implementation: str = "auto",
    dropout_rate: float = 0.0,
    rngs=None,
) -> jax.Array:
    """Multi-head attention of every query over every key.

    Args:
      q: [B, L, N, H] queries (already scaled: T5 folds 1/sqrt(H) into the query kernel).
      k: [B, N, S, H] keys (the decoding cache's layout).
      v: [B, N, S, H] values.
      bias: [1, N, L, S] (a relative position bias, never broadcast over the batch), [R, N, 1, S]
        in a decoding step (one position per row), or None (cross-attention).
      visibility: which keys each query may see.
      implementation: "auto", "xla" or "cudnn" (`choose`).
      dropout_rate: dropout on the attention weights when `rngs` is given.
      rngs: `nnx.Rngs` with a dropout stream, or None (deterministic).

    Returns:
      [B, L, N, H] in the dtype of `v`.
    """
    dropout = rngs is not None and dropout_rate > 0
    chosen = choose(
        implementation,
        platform=current_platform(),
        dtype=jnp.dtype(q.dtype).name,
        head_dim=q.shape[-1],
        causal=visibility.causal,
        has_bias=bias is not None,
        dropout=dropout,
        per_row_bias=bias is not None and bias.shape[0] > 1,
    )
    if chosen == "cudnn":
        return _cudnn(q, k, v, bias, visibility)
    return _xla(q, k, v, bias, visibility, dropout_rate, rngs)


def _xla(q, k, v, bias, visibility, dropout_rate, rngs) -> jax.Array:
    logits = jnp.einsum("BLNH,BNSH->BNLS", q, k, preferred_element_type=jnp.float32)
    if bias is not None:
        logits = logits + bias.astype(jnp.float32)  # [1 or B, N, L, S] broadcast in the kernel
    mask = visibility.mask(q.shape[1], k.shape[2])  # [B or 1, 1, L, S] bool, fused
    if mask is not None:
        # NOTE: added, not selected with `jnp.where`: an add needs nothing of the mask in the
        # backward pass, whereas a select keeps its predicate broadcast to [B, N, L, S], which
        # JAX hoists out of a scanned stack as one such array per layer loop.
        logits = logits + jnp.where(mask, 0.0, MASKED_LOGIT).astype(jnp.float32)
    weights = jax.nn.softmax(logits, axis=-1)  # [B, N, L, S] float32
    weights = layers.dropout(weights, dropout_rate, rngs).astype(v.dtype)
    return jnp.einsum("BNLS,BNSH->BLNH", weights, v)  # [B, L, N, H]


def _cudnn(q, k, v, bias, visibility: masks.Visibility) -> jax.Array:
    k, v = jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2)  # [B, S, N, H], as cuDNN takes them
    length, key_length = q.shape[1], k.shape[1]
    if bias is not None:
        bias = bias.astype(q.dtype)  # NOTE: a float32 bias gets a wrong bias gradient
    mask, is_causal, query_lengths, key_lengths = None, visibility.causal, None, None
    if visibility.packed or visibility.prefix is not None or visibility.dense is not None:
        # What flags and lengths cannot say goes as a boolean mask (JAX's wrapper adds it to
        # the bias); the causal part stays a flag unless a prefix widens it.
        if visibility.prefix is None:
            mask = _without_causal(visibility).mask(length, key_length)
        else:
            mask, is_causal = visibility.mask(length, key_length), False
    else:
        # Padding as lengths: the valid positions come first in each row.
        if visibility.query_valid is not None:
            query_lengths = jnp.sum(visibility.query_valid, axis=-1, dtype=jnp.int32)
        if visibility.key_valid is not None:
            key_lengths = jnp.sum(visibility.key_valid, axis=-1, dtype=jnp.int32)
    out = jax.nn.dot_product_attention(
        q,
        k,
        v,
        bias=bias,
        mask=mask,
        scale=1.0,
        is_causal=is_causal,
        query_seq_lengths=query_lengths,
        key_value_seq_lengths=key_lengths,
        implementation="cudnn",
    )
    return out  # [B, L, N, H]


def _without_causal(visibility: masks.Visibility) -> masks.Visibility:
    return masks.Visibility(
        causal=False,
        query_valid=visibility.query_valid,
        key_valid=visibility.key_valid,
        query_segments=visibility.query_segments,
        key_segments=visibility.key_segments,
        dense=visibility.dense,
    )
