"""The pure step functions of training and evaluation, jitted with explicit shardings.

`train_step(params, opt_state, batch, rng, step) -> (params, opt_state, metrics)` computes the
loss and gradients over `num_microbatches` microbatches (`t2t.optim.accumulate_gradients`),
applies the optimizer, and returns device scalars that add up over steps and microbatches
(sums and counts). `eval_step(params, batch) -> sums` is the teacher-forced forward pass.
Ratios (token accuracy, loss per token, mean z-loss) are derived on the host by
`train_scalars` / `eval_scalars` from fetched sums, so a window of steps or a whole eval set
combines exactly.

`jit_train_step` gives every input and output its sharding: parameters and optimizer statistics
as the partitioner's rules say, batches split over the data axis, the RNG key, the step and the
metrics replicated. Parameters and optimizer state are donated, so a step updates them in place.
The eval step is jitted as it is (`Trainer`): its arguments arrive already sharded, the
parameters from the train step and the batch from the input pipeline.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t import losses, optim
from t2t.partitioning import Partitioner

# Token features whose non-padding entries count as tokens seen (inputs and targets).
_TOKEN_FEATURES = ("encoder_input_tokens", "decoder_target_tokens")
# Per-step quantities every train step returns besides the loss function's aux sums.
STEP_QUANTITIES = ("loss", "grad_norm", "param_norm", "num_tokens", "num_examples")
EVAL_SUMS = ("cross_ent_sum", "z_loss_sum", "weight_sum", "num_correct_tokens")


def batch_counts(batch: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
    """Non-padding tokens and task examples in a batch (packed or not).

    `num_tokens` counts non-zero input and target tokens; `num_examples` counts the examples
    packed into the rows (the largest segment id of each row; a row without segment ids holds
    one example if it has any target).

    Example: decoder_segment_ids [[1, 1, 2, 0], [1, 0, 0, 0], [0, 0, 0, 0]] -> 3 examples.
    """
    tokens = sum(
        jnp.sum(batch[name] != 0, dtype=jnp.int32) for name in _TOKEN_FEATURES if name in batch
    )
    if "decoder_segment_ids" in batch:
        examples = jnp.sum(jnp.max(batch["decoder_segment_ids"], axis=1), dtype=jnp.int32)
    else:
        examples = jnp.sum(jnp.any(batch["decoder_target_tokens"] != 0, axis=1), dtype=jnp.int32)
    return {"num_tokens": tokens, "num_examples": examples}


def make_train_step(
    model: Any,
    tx: optax.GradientTransformation,
    *,
    num_microbatches: int = 1,
    grad_shardings: Any = None,
) -> Callable:
    """The pure training step of `model` (a `t2t.models` wrapper) with optimizer `tx`.

    `grad_shardings` (the parameters' shardings) keeps the gradient sums of microbatches split
    as the parameters are (`t2t.optim.accumulate_gradients`).

    Returns:
      `train_step(params, opt_state, batch, rng, step) -> (params, opt_state, metrics)`:
      batch [B, ...] features, rng a PRNG key (dropout uses `fold_in(rng, step)`, so a resumed
      run draws the masks an uninterrupted one would), step the int32 number of updates so far.
      `metrics` holds the loss, the loss function's aux sums, the gradient and parameter norms
      (after the update) and the batch's token and example counts.
    """

    def train_step(params, opt_state, batch, rng, step):
        dropout_rng = jax.random.fold_in(rng, step)
        loss, aux, grads = optim.accumulate_gradients(
            model.loss_fn,
            params,
            batch,
            dropout_rng,
            num_microbatches,
            grad_shardings=grad_shardings,
        )
        updates, opt_state = tx.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        metrics = {
            "loss": loss,
            "grad_norm": optax.global_norm(grads),
            "param_norm": optax.global_norm(params),
            **aux,
            **batch_counts(batch),
        }
        return params, opt_state, metrics

    return train_step


def make_eval_step(model: Any) -> Callable:
    """`eval_step(params, batch) -> sums`: the teacher-forced pass, no dropout, as EVAL_SUMS."""

    def eval_step(params, batch):
        _, aux = model.loss_fn(params, batch, None)
        return {name: aux[name] for name in EVAL_SUMS}

    return eval_step


def shardings_of(abstract: Any) -> Any:
    """The shardings a tree of sharded shapes carries (for `jax.jit` and `make_train_step`)."""
    return jax.tree.map(lambda x: x.sharding, abstract)


def jit_train_step(
    train_step: Callable,
    partitioner: Partitioner,
    abstract_params: Any,
    abstract_opt_state: Any,
    batch_spec: Mapping[str, Any],
) -> Callable:
    """`train_step` under `jax.jit` with explicit in/out shardings, params and state donated.

    Args:
      train_step: from `make_train_step`.
      partitioner: the run's mesh and rules.
      abstract_params, abstract_opt_state: shapes carrying shardings
        (`Partitioner.abstract_model`, `Partitioner.abstract_optimizer`).
      batch_spec: feature name -> array or shape of a global batch.

    Call the result inside `partitioner.context()` (activation constraints read the mesh).
    """
    params_sharding = shardings_of(abstract_params)
    opt_sharding = shardings_of(abstract_opt_state)
    replicated = partitioner.replicated
    return jax.jit(
        train_step,
        in_shardings=(
            params_sharding,
            opt_sharding,
            partitioner.batch_shardings(batch_spec),
            replicated,
            replicated,
        ),
        out_shardings=(params_sharding, opt_sharding, replicated),
        donate_argnums=(0, 1),
    )


# -- host-side metrics -------------------------------------------------------------------------


def _ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else 0.0


def _percent(numerator: float, denominator: float) -> float:
    """Accuracies in percent, the unit of the paper and of the tasks' metrics (seqio's)."""
    return 100.0 * _ratio(numerator, denominator)


def train_scalars(raw: Mapping[str, Any], loss_normalizing_factor: float | str | None) -> dict:
    """The logged scalars of one step from its fetched metrics.

    `loss` is the objective as optimized; `z_loss` its z-loss share (same normalization);
    `cross_ent_per_token` the cross-entropy per real target token (comparable across
    normalizations and with eval losses); `token_accuracy` the percentage of target tokens whose
    argmax is right (percent, as the tasks' accuracies).
    """
    raw = {k: float(np.asarray(v)) for k, v in raw.items()}
    if losses.LOSS_DENOMINATOR in raw:
        denominator = raw[losses.LOSS_DENOMINATOR]
    elif loss_normalizing_factor is None:
        denominator = 1.0
    else:
        denominator = float(loss_normalizing_factor)
    return {
        "loss": raw["loss"],
        "z_loss": _ratio(raw["z_loss_sum"], denominator),
        "cross_ent_per_token": _ratio(raw["cross_ent_sum"], raw["weight_sum"]),
        "token_accuracy": _percent(raw["num_correct_tokens"], raw["weight_sum"]),
        "grad_norm": raw["grad_norm"],
        "param_norm": raw["param_norm"],
        "target_tokens": raw["weight_sum"],
        "num_tokens": raw["num_tokens"],
        "num_examples": raw["num_examples"],
    }


def eval_scalars(sums: Mapping[str, float]) -> dict[str, float]:
    """Teacher-forced eval metrics from summed EVAL_SUMS: `loss` (cross-entropy per real target
    token, no z-loss), `z_loss` (per token), `token_accuracy` (percent) and `target_tokens`."""
    weight = float(sums["weight_sum"])
    return {
        "loss": _ratio(float(sums["cross_ent_sum"]), weight),
        "z_loss": _ratio(float(sums["z_loss_sum"]), weight),
        "token_accuracy": _percent(float(sums["num_correct_tokens"]), weight),
        "target_tokens": weight,
    }


# Quantities whose non-finite value stops a run, in the order they are reported.
_WATCHED = (
    ("loss", "the loss"),
    ("z_loss_sum", "the z-loss"),
    ("cross_ent_sum", "the cross-entropy"),
    ("grad_norm", "the gradient norm"),
    ("param_norm", "the updated parameters' norm"),
)


def first_non_finite(raw: Mapping[str, Any]) -> str | None:
    """A description of the first watched quantity of a step that is NaN or infinite, or None."""
    for name, what in _WATCHED:
        if name in raw:
            value = float(np.asarray(raw[name]))
            if not math.isfinite(value):
                return f"{what} ({name}) is {value}"
    return None
