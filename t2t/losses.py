"""Token-level cross-entropy with T5's z-loss, and how a batch's loss is normalized.

Labels stay integers and no one-hot [B, T, V] tensor is ever built (docs/spec.md section 6): the
target's logit is selected by comparing each vocabulary position with the label inside the
reduction over the vocabulary, which XLA fuses with the softmax's own reductions, and whose
gradient is the same comparison fused into the softmax's gradient. (Gathering it with
`take_along_axis` instead makes the backward pass scatter into a zeroed float32 [B, T, V]
array: 3.75 GB of traffic in one scatter kernel for T5.1.1-base at batch 128.)

Worked example (tested): logits [[0, ln 3]] over a vocabulary of 2 and target 1 give
logsumexp = ln 4, cross-entropy = ln 4 - ln 3 = 0.2877 and, with z_loss = 1e-4, a z term of
1e-4 * (ln 4)^2 = 1.922e-4. Two such tokens with weights [1, 0] and
`loss_normalizing_factor="num_total_target_tokens"` give (0.2877 + 1.922e-4) / 2.

Label smoothing (T5X's `label_smoothing`): the target distribution puts `1 - s` on the label and
`s / (V - 1)` on every other token; the loss is its cross-entropy minus that distribution's own
entropy, so a perfect prediction of the smoothed distribution scores 0. "average_per_sequence"
(T5X's `AVERAGE_PER_SEQUENCE`) weighs each sequence (each packed segment) equally: a token's
weight is divided by its sequence's weight total, and the sum by the number of sequences.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

NORMALIZING_MODES = ("num_real_target_tokens", "num_total_target_tokens", "average_per_sequence")
# The aux key of a batch-dependent loss denominator (read by `t2t.optim.accumulate_gradients`).
LOSS_DENOMINATOR = "loss_denominator"


def cross_entropy_with_z_loss(
    logits: jax.Array, targets: jax.Array, z_loss: float = 0.0, label_smoothing: float = 0.0
) -> tuple[jax.Array, jax.Array]:
    """Per-token cross-entropy plus `z_loss * logsumexp(logits)**2`.

    Args:
      logits: [B, T, V] (any float dtype; computed in float32).
      targets: [B, T] int labels in [0, V).
      z_loss: coefficient of the squared log-partition penalty (T5 uses 1e-4).
      label_smoothing: s in [0, 1): the smoothed targets' cross-entropy minus their entropy
        (the module doc); 0 is the plain cross-entropy.

    Returns:
      (loss [B, T], z_loss [B, T]) float32; `loss` already includes the z term.
    """
    logits = logits.astype(jnp.float32)
    # NOTE: the max only stabilizes the exponent; stopping its gradient before taking it keeps
    # the backward pass free of the argmax comparison over [B, T, V] that a differentiated max
    # (as in jax.nn.logsumexp) would add.
    shift = jnp.max(jax.lax.stop_gradient(logits), axis=-1, keepdims=True)  # [B, T, 1]
    log_z = jnp.log(jnp.sum(jnp.exp(logits - shift), axis=-1)) + shift[..., 0]  # [B, T]
    vocab_ids = jax.lax.broadcasted_iota(jnp.int32, logits.shape, logits.ndim - 1)
    is_target = vocab_ids == targets[..., None].astype(jnp.int32)  # fused, never stored
    target_logits = jnp.sum(jnp.where(is_target, logits, 0.0), axis=-1, keepdims=True)
    z_term = z_loss * jnp.square(log_z)  # [B, T]
    if not label_smoothing:
        return log_z - target_logits[..., 0] + z_term, z_term
    if not 0 < label_smoothing < 1:
        raise ValueError(f"Expected 0 <= label_smoothing < 1, got {label_smoothing!r}.")
    vocab = logits.shape[-1]
    on, off = 1.0 - label_smoothing, label_smoothing / (vocab - 1)
    # sum_v q_v logit_v without a one-hot [B, T, V]: off on every token, on - off more on the label.
    expected_logit = off * jnp.sum(logits, axis=-1) + (on - off) * target_logits[..., 0]
    entropy = -(on * np.log(on) + (vocab - 1) * off * np.log(off + 1e-20))
    return log_z - expected_logit - entropy + z_term, z_term


def loss_normalizing_factor_value(
    loss_normalizing_factor: None | float | str, targets: jax.Array, weights: jax.Array
) -> jax.Array | float:
    """The divisor of the summed loss.

    Args:
      loss_normalizing_factor: None (the sum itself, factor 1), a constant (e.g. 233472 =
        2048 x 114 when fine-tuning T5's released checkpoints), "num_real_target_tokens" (the sum
        of the loss weights), "num_total_target_tokens" (B * T, padding included) or
        "average_per_sequence" (the weights must already be `per_sequence_weights`: their sum,
        the number of sequences).
      targets: [B, T].
      weights: [B, T].

    Raises:
      ValueError: an unknown mode or a non-positive constant.
    """
    if loss_normalizing_factor is None:
        return 1.0
    if isinstance(loss_normalizing_factor, str):
        if loss_normalizing_factor in ("num_real_target_tokens", "average_per_sequence"):
            return jnp.sum(weights, dtype=jnp.float32)
        if loss_normalizing_factor == "num_total_target_tokens":
            return float(targets.size)
        raise ValueError(
            f"loss_normalizing_factor={loss_normalizing_factor!r} is not a known mode; use None, "
            f"a positive number, or one of {NORMALIZING_MODES}."
        )
    if isinstance(loss_normalizing_factor, bool) or not loss_normalizing_factor > 0:
        raise ValueError(
            f"A constant loss_normalizing_factor must be a positive number, got "
            f"{loss_normalizing_factor!r}."
        )
    return float(loss_normalizing_factor)


def per_sequence_weights(weights: jax.Array, segment_ids: jax.Array | None = None) -> jax.Array:
    """Each token's weight divided by its sequence's total: every sequence then sums to 1.

    Args:
      weights: [B, T] loss weights.
      segment_ids: [B, T] packed segment ids (0 = padding); None: one sequence per row.
    """
    weights = weights.astype(jnp.float32)
    if segment_ids is None:
        totals = jnp.sum(weights, axis=-1, keepdims=True)
    else:
        length = weights.shape[-1]

        def row_totals(w, ids):
            sums = jax.ops.segment_sum(w, ids, num_segments=length + 1)
            return sums[ids]

        totals = jax.vmap(row_totals)(weights, segment_ids.astype(jnp.int32))
    return jnp.where(totals > 0, weights / jnp.where(totals > 0, totals, 1.0), 0.0)


def compute_weighted_loss(
    logits: jax.Array,
    targets: jax.Array,
    weights: jax.Array | None = None,
    *,
    z_loss: float = 1e-4,
    loss_normalizing_factor: None | float | str = None,
    label_smoothing: float = 0.0,
    segment_ids: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """The batch loss: weighted sum of per-token losses divided by the normalizing factor.

    Args:
      logits: [B, T, V].
      targets: [B, T] int.
      weights: [B, T] loss weights (seqio's `decoder_loss_weights`); None means `targets > 0`.
      z_loss: z-loss coefficient.
      loss_normalizing_factor: see `loss_normalizing_factor_value`.
      label_smoothing: see `cross_entropy_with_z_loss`.
      segment_ids: [B, T] packed segment ids, for "average_per_sequence" on packed rows.

    Returns:
      (loss scalar, aux). Every aux value adds up over microbatches (the contract of
      `t2t.optim.accumulate_gradients`): `cross_ent_sum` and `z_loss_sum` (the weighted sums of
      the two parts of the token loss, so `loss = (cross_ent_sum + z_loss_sum) / factor`) and
      `weight_sum`. When the factor depends on the batch ("num_real_target_tokens",
      "num_total_target_tokens") aux also holds it as `loss_denominator`; a constant factor (or
      None) is left out, as it does not add up. Ratios (mean z-loss, loss per token) are derived
      from these sums by whoever reports them. Under "average_per_sequence" the loss uses the
      per-sequence weights and `loss_denominator` counts sequences, while the three sums keep
      the token weights, so per-token ratios keep their meaning.
    """
    if logits.shape[:-1] != targets.shape:
        raise ValueError(
            f"logits {logits.shape} and targets {targets.shape} disagree: logits must be "
            "[B, T, V] for targets [B, T]."
        )
    if weights is None:
        weights = (targets > 0).astype(jnp.float32)
    elif weights.shape != targets.shape:
        raise ValueError(f"weights {weights.shape} must match targets {targets.shape}.")
    weights = weights.astype(jnp.float32)
    token_loss, token_z = cross_entropy_with_z_loss(logits, targets, z_loss, label_smoothing)
    loss_weights = weights
    if loss_normalizing_factor == "average_per_sequence":
        loss_weights = per_sequence_weights(weights, segment_ids)
    factor = loss_normalizing_factor_value(loss_normalizing_factor, targets, loss_weights)
    loss_sum = jnp.sum(token_loss * loss_weights)
    z_loss_sum = jnp.sum(token_z * weights)
    aux = {
        "cross_ent_sum": jnp.sum(token_loss * weights) - z_loss_sum,
        "z_loss_sum": z_loss_sum,
        "weight_sum": jnp.sum(weights),
    }
    if isinstance(loss_normalizing_factor, str):
        aux[LOSS_DENOMINATOR] = jnp.asarray(factor, jnp.float32)
    # NOTE: a batch (or microbatch) without a real target token has a zero denominator; its loss
    # is 0 rather than 0/0, and as a microbatch it weighs nothing in the accumulated batch loss.
    safe_factor = jnp.where(factor > 0, factor, 1.0) if isinstance(factor, jax.Array) else factor
    return loss_sum / safe_factor, aux
