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
- `flash`: Pallas flash attention on TPUs, for query and key lengths that are multiples of 128
  (the decoder's 114 targets are not: those sites stay on XLA); padding and packing become
  segment ids. t2t's kernels (`t2t.nn.flash_kernels`) read the position bias as [N, L, S] and
  sum its gradient over the batch inside the kernel; where they do not tile a device's rows
  (not a multiple of 8), JAX's (`jax.experimental.pallas.ops.tpu.flash_attention`), whose bias
  operand is [B, N, L, S], get the bias broadcast over the rows inside each device's shard.
- `auto`: per call site, from the platform the program is compiled for. TPUs: `flash` where
  the keys are 1024 or more long and its blocks tile the lengths, `xla` elsewhere. GPUs:
  `cudnn` where the attention is not causal (the encoder's self-attention with its bias and
  the cross-attention), `xla` for the causal decoder. CPUs: `xla`. The measurements behind
  these choices are in docs/model.md (each GPU site timed on an H100) and docs/pod_scale.md
  (TPU steps compiled for v5e). `describe` says what `auto` picks.

NOTE: T5 does not scale the logits by 1/sqrt(H) (the factor is in the query initializer), so
every implementation is called with scale 1.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from t2t.nn import axes, layers, masks
from t2t.nn.config import ATTENTION_IMPLS as IMPLEMENTATIONS
from t2t.nn.sharding import current_platform, current_spec

# NOTE: a large finite negative number, not -inf: a query that may see no key (a padding
# query) then gets a uniform softmax instead of NaNs, as with the additive -1e10 of old.
MASKED_LOGIT = masks.MASKED_BIAS
# cuDNN's flash attention: the head dimensions it takes and the compute dtypes.
_CUDNN_DTYPES = ("bfloat16", "float16")
_CUDNN_MAX_HEAD_DIM = 128
# Where XLA's softmax gradient takes each query's row sum from (`attention`'s `row_sums`).
ROW_SUMS = ("outputs", "probabilities")
# The rematerialization policies under which the outputs' row sums pay (`row_sums_for`).
_OUTPUT_ROWS_POLICIES = ("dots_with_no_batch_dims",)
# Pallas flash attention on TPUs tiles queries and keys in blocks of 128.
_FLASH_BLOCK = 128
# `auto` runs flash attention on TPUs from this key length on. T5.1.1-base's step compiled for
# v5e:4x4, the same tokens per step (`benchmarks/tpu_attention_compile.py`,
# `results/tpu_attention_compile_kernels*.json`), XLA vs t2t's flash kernels: see
# docs/pod_scale.md. At 512 tokens flash's estimate is a few percent shorter, too little to
# trust without a TPU's timing; from 1024 on it is shorter by a margin the kernels' unmodeled
# efficiency would not take back.
FLASH_AUTO_MIN_LENGTH = 1024


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


def flash_unsupported(
    *,
    platform: str,
    lengths: tuple[int, int] | None,
    dropout: bool,
    per_row_bias: bool = False,
    prefix_or_dense: bool = False,
) -> str | None:
    """Why Pallas flash attention (TPU) cannot run this attention (None when it can)."""
    if platform != "tpu":
        return f"Pallas flash attention runs on TPUs, and this program is for {platform}"
    if lengths is not None and any(n % _FLASH_BLOCK for n in lengths):
        return (
            f"Pallas flash attention tiles by {_FLASH_BLOCK}, and the query and key lengths are "
            f"{lengths[0]} and {lengths[1]}"
        )
    if dropout:
        return "Pallas flash attention has no dropout on the attention weights"
    if per_row_bias or prefix_or_dense:
        return "decoding steps and prefix LMs are left to XLA"
    return None


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Call:
    """One attention call as `choose` sees it."""

    platform: str
    dtype: str
    head_dim: int
    causal: bool
    dropout: bool
    per_row_bias: bool
    lengths: tuple[int, int] | None
    prefix_or_dense: bool

    @property
    def untileable(self) -> bool:
        return self.lengths is not None and any(n % _FLASH_BLOCK for n in self.lengths)


def _cudnn_reason(call: _Call) -> str | None:
    return cudnn_unsupported(
        platform=call.platform,
        dtype=call.dtype,
        head_dim=call.head_dim,
        dropout=call.dropout,
        per_row_bias=call.per_row_bias,
    )


def _flash_reason(call: _Call) -> str | None:
    return flash_unsupported(
        platform=call.platform,
        lengths=call.lengths,
        dropout=call.dropout,
        per_row_bias=call.per_row_bias,
        prefix_or_dense=call.prefix_or_dense,
    )


@dataclasses.dataclass(frozen=True)
class _Kernel:
    """What a fused kernel takes, and what it leaves to XLA when it is asked for by name."""

    cannot_run: Callable[[_Call], str | None]
    """Why the kernel cannot take a call (None: it can)."""
    left_to_xla: Callable[[_Call], bool]
    """Calls it cannot take that every run of its kind has, run on XLA without a word; any
    other call it cannot take is an error naming the reason."""
    instead: str
    """What the error suggests instead."""


# `choose`'s table: each fused kernel, what it takes, and where it falls back.
_KERNELS = {
    "cudnn": _Kernel(
        _cudnn_reason,
        lambda call: call.per_row_bias,  # decoding steps
        "attention_impl='auto' (cuDNN where it can run, XLA elsewhere) or 'xla'",
    ),
    "flash": _Kernel(
        _flash_reason,
        lambda call: (  # on a TPU: decoding steps, prefix LMs, 114 targets
            call.platform == "tpu"
            and not call.dropout
            and (call.per_row_bias or call.prefix_or_dense or call.untileable)
        ),
        "attention_impl='auto' or 'xla'",
    ),
}


def _auto(call: _Call) -> str:
    """`auto`'s pick: on TPUs flash where it can run and pays (`_flash_pays`); on GPUs cuDNN
    where it can run, for attention that is not causal and not a decoding step's one query;
    XLA everywhere else."""
    if call.platform == "tpu":
        return "flash" if _flash_pays(call) else "xla"
    one_query = call.lengths is not None and call.lengths[0] == 1
    return "cudnn" if _cudnn_reason(call) is None and not call.causal and not one_query else "xla"


def choose(
    requested: str,
    *,
    platform: str,
    dtype: str,
    head_dim: int,
    causal: bool,
    dropout: bool = False,
    per_row_bias: bool = False,
    lengths: tuple[int, int] | None = None,
    prefix_or_dense: bool = False,
) -> str:
    """The implementation one attention call runs: `requested`, or `auto`'s pick (`_auto`),
    or XLA where the requested kernel leaves the call to it (`_KERNELS`).

    Raises:
      ValueError: `requested` is unknown, or is "cudnn" or "flash" where that kernel cannot
        run (the message says why and what to change). Sites neither kernel takes in any run
        (decoding steps; for flash also prefix LMs and lengths its blocks do not tile) run XLA.
    """
    if requested not in IMPLEMENTATIONS:
        raise ValueError(f"attention_impl must be one of {IMPLEMENTATIONS}, got {requested!r}.")
    call = _Call(
        platform=platform,
        dtype=dtype,
        head_dim=head_dim,
        causal=causal,
        dropout=dropout,
        per_row_bias=per_row_bias,
        lengths=lengths,
        prefix_or_dense=prefix_or_dense,
    )
    if requested == "auto":
        return _auto(call)
    kernel = _KERNELS.get(requested)
    if kernel is None:
        return requested  # xla
    reason = kernel.cannot_run(call)
    if reason is None:
        return requested
    if kernel.left_to_xla(call):
        return "xla"
    raise ValueError(
        f"attention_impl={requested!r} cannot run here: {reason}. Use {kernel.instead}."
    )


def _flash_pays(call: _Call) -> bool:
    """Whether `auto` runs Pallas flash attention on a TPU: where it can, for keys at least
    `FLASH_AUTO_MIN_LENGTH` long (measured by compiling, `benchmarks/tpu_attention_compile.py`)."""
    if call.lengths is None or call.lengths[1] < FLASH_AUTO_MIN_LENGTH:
        return False
    return _flash_reason(call) is None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Site:
    """One attention call of a network, as the implementations see it.

    Attributes:
      causal: a query sees the keys up to its own position (the decoders' self-attention).
      lengths: (query length, key length), or None where the batches' lengths are not known.
      biased: it adds the relative position bias (self-attention; not the cross-attention).
      prefix: a prefix LM's fully visible prefix widens the causal mask.
    """

    causal: bool
    lengths: tuple[int, int] | None
    biased: bool
    prefix: bool = False


def sites(config, lengths: tuple[int, int] | None = None) -> dict[str, Site]:
    """The attention calls of `config`'s network by name ("encoder self-attention", ...), for
    batches of (input length, target length); decoder-only models attend over both together."""
    inputs, targets = lengths if lengths is not None else (None, None)
    if config.is_decoder_only:
        total = None if lengths is None else (inputs + targets, inputs + targets)
        prefix = config.architecture == "prefix_lm"
        site = Site(causal=True, lengths=total, biased=True, prefix=prefix)
        return {"decoder self-attention": site}
    return {
        "encoder self-attention": Site(
            causal=False, lengths=lengths and (inputs, inputs), biased=True
        ),
        "decoder self-attention": Site(
            causal=True, lengths=lengths and (targets, targets), biased=True
        ),
        "cross-attention": Site(causal=False, lengths=lengths and (targets, inputs), biased=False),
    }


def describe(
    config,
    platform: str,
    *,
    training: bool = True,
    lengths: tuple[int, int] | None = None,
) -> dict[str, str]:
    """What each attention site of `config`'s network runs on `platform`, e.g.
    {"encoder self-attention": "cudnn", "decoder self-attention": "xla", ...}.

    Args:
      config: the network.
      platform: "cpu", "gpu" or "tpu".
      training: whether dropout is on (it is only while training).
      lengths: (input length, target length) of the batches, for implementations that need
        particular lengths; None: not checked. Decoder-only models attend over both together.
    """
    dropout = training and config.dropout_rate > 0
    return {
        name: choose(
            config.attention_impl,
            platform=platform,
            dtype=config.dtype,
            head_dim=config.d_kv,
            causal=site.causal,
            dropout=dropout,
            lengths=site.lengths,
            prefix_or_dense=site.prefix,
        )
        for name, site in sites(config, lengths).items()
    }


def summary(config, platform: str, *, lengths: tuple[int, int] | None = None) -> str:
    """One line for a run's log: "attention (auto on gpu): encoder self-attention cudnn, ..."."""
    sites = describe(config, platform, lengths=lengths)
    return f"attention ({config.attention_impl} on {platform}): " + ", ".join(
        f"{site} {impl}" for site, impl in sites.items()
    )


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
    float32_logits: bool = False,
    row_sums: str = "probabilities",
) -> jax.Array:
    """Multi-head attention of every query over every key.

    Args:
      q: [B, L, N, H] queries (already scaled: T5 folds 1/sqrt(H) into the query kernel).
      k: [B, N, S, H] keys (the decoding cache's layout).
      v: [B, N, S, H] values.
      bias: [1, N, L, S] (a relative position bias, never broadcast over the batch), [R, N, 1, S]
        in a decoding step (one position per row), or None (cross-attention).
      visibility: which keys each query may see.
      implementation: "auto", "xla", "cudnn" or "flash" (`choose`).
      dropout_rate: dropout on the attention weights when `rngs` is given.
      rngs: `nnx.Rngs` with a dropout stream, or None (deterministic).
      float32_logits: XLA stores the logits [B, N, L, S] in float32 instead of the compute
        dtype (the softmax computes in float32 either way).
      row_sums: where XLA's softmax gradient takes each query's `sum_j p_ij dp_ij` from:
        "probabilities" or "outputs" (`sum_h do_ih o_ih`; `_weighted_values`, `row_sums_for`).

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
        dropout=dropout,
        # A decoding step: each row's query at its own position (a dense window, a bias per row).
        per_row_bias=visibility.dense is not None or (bias is not None and bias.shape[0] > 1),
        lengths=(q.shape[1], k.shape[2]),
        prefix_or_dense=visibility.prefix is not None or visibility.dense is not None,
    )
    if chosen == "cudnn":
        return _cudnn(q, k, v, bias, visibility)
    if chosen == "flash":
        return _flash(q, k, v, bias, visibility)
    logits_dtype = jnp.float32 if float32_logits else q.dtype
    if row_sums not in ROW_SUMS:
        raise ValueError(f"row_sums must be one of {ROW_SUMS}, got {row_sums!r}.")
    return _xla(q, k, v, bias, visibility, dropout_rate, rngs, logits_dtype, row_sums)


def row_sums_for(remat_policy: str) -> str:
    """`attention`'s `row_sums` for a layer rematerialized with `remat_policy`: the outputs'
    where the projections are kept and attention is recomputed (`dots_with_no_batch_dims`), the
    probabilities' elsewhere. Why, compiled for TPUs: docs/pod_scale.md, "The softmax
    gradient's row sums"."""
    return "outputs" if remat_policy in _OUTPUT_ROWS_POLICIES else "probabilities"


def _xla(q, k, v, bias, visibility, dropout_rate, rngs, logits_dtype, row_sums) -> jax.Array:
    # [B, N, L, S] in `logits_dtype` (the compute dtype by default, as T5X), softmax in float32.
    logits = jnp.einsum("BLNH,BNSH->BNLS", q, k, preferred_element_type=logits_dtype)
    log_sum = _normalizer(logits, bias, visibility)
    dropout_key = rngs.dropout() if rngs is not None and dropout_rate > 0 else None
    return _weighted_values(
        logits, bias, visibility, log_sum, v, dropout_key, dropout_rate, row_sums == "outputs"
    )


# The checkpoint name of the softmax's normalizer (the log of each row's sum of exponentials,
# [B, N, L, 1] float32): the rematerialization policies keep it (`t2t.nn.stacking`), so the
# backward pass rebuilds the probabilities from the recomputed logits without the reduction over
# the keys, which reads all [B, N, L, S] logits once more per layer.
SOFTMAX_NORMALIZER = "attention_softmax_normalizer"


def _normalizer(logits, bias, visibility: masks.Visibility) -> jax.Array:
    """The softmax's log normalizer [B, N, L, 1] float32, named for rematerialization.

    It carries no gradient of its own (`_weighted_values`'s gradient is complete without it)
    and is named, so a rematerialized layer keeps it instead of recomputing it.
    """
    log_sum = _log_normalizer(
        jax.lax.stop_gradient(logits),
        None if bias is None else jax.lax.stop_gradient(bias),
        visibility,
    )
    return checkpoint_name(log_sum, SOFTMAX_NORMALIZER)


def _masked_logits(logits, bias, visibility: masks.Visibility) -> jax.Array:
    """float32 `logits + bias`, -1e10 where a query may not see a key: [B, N, L, S]."""
    x = logits.astype(jnp.float32)
    if bias is not None:
        x = x + bias.astype(jnp.float32)  # [1 or B, N, L, S] broadcast in the kernel
    mask = visibility.mask(x.shape[-2], x.shape[-1])  # [B or 1, 1, L, S] bool
    if mask is not None:
        # 0 where visible, -1e10 where masked; scalar arithmetic, not `jnp.where`, whose
        # broadcast constants JAX would hoist out of a scanned stack as full-size arrays.
        x = x + (mask.astype(jnp.float32) - 1.0) * -MASKED_LOGIT
    return x


@jax.custom_vjp
def _log_normalizer(logits, bias, visibility: masks.Visibility) -> jax.Array:
    """log(sum(exp(x))) over the keys of the masked, biased logits x: [B, N, L, 1] float32.

    NOTE: a function with its own (zero) gradient only to keep the mask inside it, out of
    reach of the loop-invariant hoisting described at `_probabilities`; it is only ever called
    on values without a gradient.
    """
    x = _masked_logits(logits, bias, visibility)
    peak = jnp.max(x, axis=-1, keepdims=True)
    return peak + jnp.log(jnp.sum(jnp.exp(x - peak), axis=-1, keepdims=True))


_log_normalizer.defvjp(
    lambda logits, bias, visibility: (_log_normalizer(logits, bias, visibility), None),
    lambda residuals, grad: (None, None, None),
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _probabilities(logits, bias, visibility: masks.Visibility, log_sum, dtype) -> jax.Array:
    """exp(x - log_sum) of the masked, biased logits x [B, N, L, S], in `dtype`.

    NOTE: a function with its own gradient so that XLA sees the whole of it inside the layer:
    the mask is rebuilt from its [B, L]-sized parts in the kernels that use it. As a separate
    step, the mask's [B, 1, L, S] additive form is loop-invariant, and JAX hoists it out of a
    scanned stack as an array every kernel then reads (13 GB per step for T5.1.1-base at batch
    2048 on v5e:4x4); inlined into `_weighted_values`'s forward pass, it is hoisted too. As
    exp(x - log_sum), the kernel recomputes the exponential from the (compute-dtype) logits;
    `x / sum(x)` after `exp` has XLA store the float32 exponentials [B, N, L, S] between two
    kernels. Its gradient is the softmax's (`_weighted_values` has its own and does not use it).
    """
    return jnp.exp(_masked_logits(logits, bias, visibility) - log_sum).astype(dtype)


def _probabilities_forward(logits, bias, visibility, log_sum, dtype):
    probabilities = _probabilities(logits, bias, visibility, log_sum, dtype)
    return probabilities, (probabilities, *_dtype_carriers(logits, bias))


def _probabilities_backward(dtype, residuals, grad):
    del dtype
    probabilities, logits_like, bias_like = residuals
    p = probabilities.astype(jnp.float32)
    g = grad.astype(jnp.float32)
    dx = p * (g - jnp.sum(p * g, axis=-1, keepdims=True))  # [B, N, L, S] float32
    return dx.astype(logits_like.dtype), _bias_gradient(dx, bias_like), None, None


_probabilities.defvjp(_probabilities_forward, _probabilities_backward)


def _dtype_carriers(logits, bias):
    """Empty arrays that carry the logits' dtype and the bias's rows and dtype to a backward
    pass (a residual must be an array)."""
    logits_like = jnp.zeros((0,), logits.dtype)
    bias_like = None if bias is None else jnp.zeros((bias.shape[0], 0), bias.dtype)
    return logits_like, bias_like


def _bias_gradient(dx, bias_like):
    """The bias's gradient from the biased logits' `dx` [B, N, L, S] float32: summed over the
    batch the bias was broadcast to; None without a bias."""
    if bias_like is None:
        return None
    if bias_like.shape[0] == 1 and dx.shape[0] != 1:
        dx = jnp.sum(dx, axis=0, keepdims=True)  # [1, N, L, S]
    return dx.astype(bias_like.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _weighted_values(
    logits,
    bias,
    visibility: masks.Visibility,
    log_sum,
    v,
    dropout_key,
    dropout_rate: float,
    rows_from_outputs: bool,
) -> jax.Array:
    """`dropout(softmax(logits + bias, masked)) v` [B, L, N, H], the probabilities computed
    from the normalizer `log_sum` in the dtype of `v`; no dropout when `dropout_key` is None.

    NOTE: one function with its own gradient, for two reasons. The backward pass keeps no
    [B, N, L, S] array but the probabilities, which the values' product reads anyway, and
    draws dropout's mask again from its key (autodiff would keep the mask). And the softmax's
    gradient needs each query's `sum_j p_ij dp_ij` (dp: the probabilities' gradient), which
    equals `sum_h do_ih o_ih` (do: the output's gradient, o: the output; dropout's mask
    included; the identity flash attention's backward uses): `rows_from_outputs` takes it as
    that sum over the head dimension, which XLA computes in the epilogue of the matmul that
    produces `do`, instead of a pass over two [B, N, L, S] arrays (`row_sums_for` says where
    that pays).
    """
    probabilities = _probabilities(logits, bias, visibility, log_sum, v.dtype)
    weights = _dropped(probabilities, dropout_key, dropout_rate)
    return jnp.einsum("BNLS,BNSH->BLNH", weights, v)


def _dropped(x, key, rate):
    return x if key is None else layers.dropout_with_key(x, rate, key)


def _weighted_values_forward(
    logits, bias, visibility, log_sum, v, dropout_key, dropout_rate, rows_from_outputs
):
    probabilities = _probabilities(logits, bias, visibility, log_sum, v.dtype)
    out = jnp.einsum("BNLS,BNSH->BLNH", _dropped(probabilities, dropout_key, dropout_rate), v)
    kept_out = out if rows_from_outputs else None
    return out, (probabilities, v, kept_out, dropout_key, *_dtype_carriers(logits, bias))


def _weighted_values_backward(dropout_rate, rows_from_outputs, residuals, grad):
    probabilities, v, out, dropout_key, logits_like, bias_like = residuals
    grad = grad.astype(v.dtype)
    weights = _dropped(probabilities, dropout_key, dropout_rate)
    dv = jnp.einsum("BNLS,BLNH->BNSH", weights, grad)
    # The probabilities' gradient [B, N, L, S]: through dropout, the same mask and scale.
    dp = _dropped(jnp.einsum("BLNH,BNSH->BNLS", grad, v), dropout_key, dropout_rate)
    p, dp = probabilities.astype(jnp.float32), dp.astype(jnp.float32)
    # Each query's sum_j p_ij dp_ij: [B, N, L, 1] float32.
    if rows_from_outputs:  # as sum_h do_ih o_ih
        row = jnp.sum(grad.astype(jnp.float32) * out.astype(jnp.float32), axis=-1)  # [B, L, N]
        row = jnp.swapaxes(row, 1, 2)[..., None]
    else:
        row = jnp.sum(p * dp, axis=-1, keepdims=True)
    dx = p * (dp - row)  # [B, N, L, S]
    return dx.astype(logits_like.dtype), _bias_gradient(dx, bias_like), None, None, dv, None


_weighted_values.defvjp(_weighted_values_forward, _weighted_values_backward)


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


def _flash(q, k, v, bias, visibility: masks.Visibility) -> jax.Array:
    """Pallas flash attention (TPU): blocks of queries and keys stay in on-chip memory, so no
    [B, N, L, S] logits are written. t2t's kernels take the position bias as [N, L, S]; JAX's,
    where t2t's do not tile this device's rows, need it broadcast to [B, N, L, S] inside the
    shard. Padding and packing become segment ids (padding is segment 0, which real tokens
    never see)."""
    from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash

    from t2t.nn import flash_kernels

    batch, length, key_length = q.shape[0], q.shape[1], k.shape[2]
    query_ids, key_ids = _segment_ids(visibility, batch, length, key_length)
    q = jnp.swapaxes(q, 1, 2)  # [B, N, L, H]
    has_bias = bias is not None

    def attend(q, k, v, bias, query_ids, key_ids):
        # This device's rows and heads: t2t's kernels where they tile them (the bias stays
        # [N, L, S]), else JAX's with the bias broadcast over the rows.
        if flash_kernels.fits(q.shape[0], length, key_length) is None:
            return flash_kernels.flash_attention(
                q,
                k,
                v,
                None if bias is None else bias[0].astype(q.dtype),
                query_ids,
                key_ids,
                visibility.causal,
            )
        ab = None
        if has_bias:  # [B, N, L, S] for this shard's rows and heads
            ab = jnp.broadcast_to(bias.astype(q.dtype), (*q.shape[:2], length, key_length))
        segments = None
        if query_ids is not None:
            segments = pallas_flash.SegmentIds(q=query_ids, kv=key_ids)
        return pallas_flash.flash_attention(
            q, k, v, ab=ab, segment_ids=segments, causal=visibility.causal, sm_scale=1.0
        )

    heads = (axes.ACT_BATCH, axes.ACT_HEADS, axes.ACT_LENGTH, axes.ACT_KV)
    q_spec = current_spec(heads, q.shape)
    if q_spec is not None:  # inside a mesh: one kernel per device on its own shards
        rows = current_spec((axes.ACT_BATCH, axes.ACT_LENGTH), (batch, length))
        bias_spec = None if bias is None else current_spec(heads, bias.shape)
        ids_spec = None if query_ids is None else rows
        attend = jax.shard_map(
            attend,
            in_specs=(q_spec, q_spec, q_spec, bias_spec, ids_spec, ids_spec),
            out_specs=q_spec,
            check_vma=False,
        )
    out = attend(q, k, v, bias, query_ids, key_ids)  # [B, N, L, H]
    return jnp.swapaxes(out, 1, 2)  # [B, L, N, H]


def _segment_ids(visibility: masks.Visibility, batch: int, length: int, key_length: int):
    """[B, L] and [B, S] int32 segment ids saying what padding and packing say, or Nones."""
    if visibility.packed:
        return (
            visibility.query_segments.astype(jnp.int32),
            visibility.key_segments.astype(jnp.int32),
        )
    if visibility.query_valid is None and visibility.key_valid is None:
        return None, None
    query = visibility.query_valid
    key = visibility.key_valid
    query = jnp.ones((batch, length), jnp.int32) if query is None else query.astype(jnp.int32)
    key = jnp.ones((batch, key_length), jnp.int32) if key is None else key.astype(jnp.int32)
    return query, key
