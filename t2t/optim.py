"""How parameters move: T5's Adafactor, learning-rate schedules, microbatching, parameter labels.

Everything is composed from optax pieces so it plugs into any optax-based loop:

- `adafactor`: the T5 optimizer (docs/spec.md section 7) as an `optax.chain` of factored second
  moments, update clipping, parameter-scale-relative step size and the learning rate.
- Schedules (`optax.Schedule`, step -> learning rate): `inverse_sqrt` (pretraining),
  `constant` (fine-tuning), `warmup_linear_decay`, `warmup_cosine_decay` and
  `slanted_triangular` (Howard and Ruder), built with `optax.join_schedules` and friends.
- `accumulate_gradients`: the loss and gradients of a batch computed as k microbatches with
  `lax.scan`, equal to the one-batch result for every loss normalization.
- Parameter labels (`param_labels`, `label_transforms`, `freeze`): name parameters by path or
  logical axes and give each label its own transformation through `optax.multi_transform`, the
  mechanism behind frozen layers and adapters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import optax

from t2t import losses
from t2t.pytrees import is_variable, param_path

# ----------------------------------------------------------------------------------------------
# Adafactor
# ----------------------------------------------------------------------------------------------


def adafactor(
    learning_rate: float | optax.Schedule,
    *,
    decay_rate: float = 0.8,
    min_dim_size_to_factor: int = 128,
    clipping_threshold: float | None = 1.0,
    min_param_scale: float | None = 1e-3,
    epsilon1: float = 1e-30,
    step_offset: int = 0,
) -> optax.GradientTransformation:
    """Adafactor (Shazeer and Stern, 2018) with the settings T5 trained with.

    For a parameter X with gradient G at step t (counting from 0):

        beta2_t = 1 - (t + 1) ** -decay_rate              (0 at the first step)
        factored (the two largest dims both >= min_dim_size_to_factor), R rows, C columns:
            r = beta2_t r + (1 - beta2_t) mean_cols(G^2 + epsilon1)      [R]
            c = beta2_t c + (1 - beta2_t) mean_rows(G^2 + epsilon1)      [C]
            V = r c^T / mean(r)                                          [rows, columns]
        otherwise V = beta2_t V + (1 - beta2_t) (G^2 + epsilon1)
        U = G / sqrt(V);  U = U / max(1, RMS(U) / clipping_threshold)
        X = X - learning_rate_t * max(min_param_scale, RMS(X)) * U

    No momentum and no weight decay. Attention kernels are 2-D (`[D, N*H]`), so they are factored
    over their true rows and columns. A parameter of scanned layers (a `layers` component in its
    path, stacked `[L, ...]` along axis 0) is treated as L separate parameters: factored over
    each layer's own dimensions, clipped and scaled by each layer's own RMS (`per_layer`), so
    a scanned model trains exactly as the unscanned one.

    Args:
        learning_rate: a float or a schedule (step -> rate), e.g. `inverse_sqrt()`.
        decay_rate: exponent of the second-moment decay schedule.
        min_dim_size_to_factor: factor a parameter's second moments when its two largest
            dimensions are at least this large.
        clipping_threshold: RMS threshold of the update clipping (None: no clipping).
        min_param_scale: lower bound of the parameter-RMS step scale (epsilon2; None: steps are
            not scaled by the parameter RMS).
        epsilon1: added to squared gradients.
        step_offset: steps to subtract from the decay schedule's step (restart the second-moment
            decay for fine-tuning from a pretrained optimizer state).

    Returns:
        The `optax.GradientTransformation` (its `update` needs `params`).
    """
    steps = [
        optax.scale_by_factored_rms(
            factored=True,
            decay_rate=decay_rate,
            step_offset=step_offset,
            min_dim_size_to_factor=min_dim_size_to_factor,
            epsilon=epsilon1,
        )
    ]
    if clipping_threshold is not None:
        steps.append(optax.clip_by_block_rms(clipping_threshold))
    if min_param_scale is not None:
        steps.append(optax.scale_by_param_block_rms(min_param_scale))
    steps.append(optax.scale_by_learning_rate(learning_rate))  # negates: descent
    return per_layer(optax.chain(*steps))


# A path component that marks parameters of scanned layers, stacked along axis 0.
STACKED_LAYERS = "layers"


def _stacked_mask(params: Any) -> Any:
    """A tree like `params`: True for leaves of scanned layers (`.../layers/...`)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, _: STACKED_LAYERS in param_path(path).split("/"), params
    )


def _vmapped_leaves(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` run separately on each slice [i] of every leaf: `jax.vmap` over axis 0, per leaf."""

    def init(params):
        return jax.tree.map(jax.vmap(tx.init), params)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("per_layer needs params: call update(updates, state, params).")
        results = jax.tree.map(jax.vmap(tx.update), updates, state, params)
        new_updates = jax.tree.map(lambda _, r: r[0], updates, results)
        new_state = jax.tree.map(lambda _, r: r[1], updates, results)
        return new_updates, new_state

    return optax.GradientTransformation(init, update)


def per_layer(tx: optax.GradientTransformation) -> optax.GradientTransformation:
    """`tx` with every parameter of scanned layers treated as one parameter per layer.

    A stacked `[L, ...]` leaf gets `tx` vmapped over its layer axis, so statistics computed over
    a whole parameter (Adafactor's factored moments, block RMS clipping and scaling) are those
    of each layer alone, as in the unscanned layout. Other leaves get `tx` as is; with no
    stacked leaf at all the state is exactly `tx`'s.
    """
    split = optax.chain(
        optax.masked(tx, lambda params: jax.tree.map(lambda m: not m, _stacked_mask(params))),
        optax.masked(_vmapped_leaves(tx), _stacked_mask),
    )

    def has_stacked(params) -> bool:
        return any(jax.tree.leaves(_stacked_mask(params)))

    def init(params):
        return split.init(params) if has_stacked(params) else tx.init(params)

    def update(updates, state, params=None):
        if params is None:
            raise ValueError("per_layer needs params: call update(updates, state, params).")
        if has_stacked(params):
            return split.update(updates, state, params)
        return tx.update(updates, state, params)

    return optax.GradientTransformation(init, update)


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


def inverse_sqrt(warmup_steps: int = 10_000, scale: float = 1.0) -> optax.Schedule:
    """T5's pretraining rate `scale / sqrt(max(step, warmup_steps))`.

    Constant `scale / sqrt(warmup_steps)` for the first `warmup_steps` steps, then decaying as
    the inverse square root of the step. With the defaults: 0.01 for steps 0..10,000, 0.005 at
    step 40,000, 0.001 at step 1,000,000.
    """
    if warmup_steps < 1:
        raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps}.")
    plateau = optax.constant_schedule(scale / warmup_steps**0.5)

    def decay(steps_after_warmup):  # join_schedules counts from the boundary
        return scale * jax.lax.rsqrt(jnp.asarray(steps_after_warmup + warmup_steps, jnp.float32))

    return optax.join_schedules([plateau, decay], boundaries=[warmup_steps])


def constant(value: float = 1e-3) -> optax.Schedule:
    """A fixed rate; T5 fine-tunes at 1e-3."""
    return optax.constant_schedule(value)


def warmup_linear_decay(
    peak_value: float, warmup_steps: int, total_steps: int, end_value: float = 0.0
) -> optax.Schedule:
    """Linear rise from 0 to `peak_value` over `warmup_steps`, then linear to `end_value` at
    `total_steps` (and constant after). Example: peak 1.0, 10 warm-up, 110 total: step 5 -> 0.5,
    step 10 -> 1.0, step 60 -> 0.5, step 110 -> 0.0.
    """
    _check_warmup(warmup_steps, total_steps)
    return optax.join_schedules(
        [
            optax.linear_schedule(0.0, peak_value, warmup_steps),
            optax.linear_schedule(peak_value, end_value, total_steps - warmup_steps),
        ],
        boundaries=[warmup_steps],
    )


def warmup_cosine_decay(
    peak_value: float, warmup_steps: int, total_steps: int, end_value: float = 0.0
) -> optax.Schedule:
    """Linear rise from 0 to `peak_value` over `warmup_steps`, then a half cosine to `end_value`
    at `total_steps`. Example: peak 1.0, 10 warm-up, 110 total: step 60 -> 0.5, step 110 -> 0.0.
    """
    _check_warmup(warmup_steps, total_steps)
    return optax.warmup_cosine_decay_schedule(
        0.0, peak_value, warmup_steps, total_steps, end_value=end_value
    )


def slanted_triangular(
    peak_value: float, total_steps: int, cut_frac: float = 0.1, ratio: float = 32.0
) -> optax.Schedule:
    """Howard and Ruder's slanted triangular rate (ULMFiT), the paper's triangular schedule.

    Rises linearly from `peak_value / ratio` to `peak_value` over the first
    `cut = floor(cut_frac * total_steps)` steps, then falls linearly back to
    `peak_value / ratio` at `total_steps`. Example (their defaults: peak 0.01, cut_frac 0.1,
    ratio 32, 1000 steps): step 0 -> 0.0003125, step 50 -> 0.00515625, step 100 -> 0.01,
    step 550 -> 0.00515625, step 1000 -> 0.0003125.
    """
    cut = int(cut_frac * total_steps)
    if not 0 < cut < total_steps:
        raise ValueError(
            f"cut_frac * total_steps must fall inside (0, total_steps); got cut_frac={cut_frac}, "
            f"total_steps={total_steps} (cut={cut})."
        )
    low = peak_value / ratio
    return optax.join_schedules(
        [
            optax.linear_schedule(low, peak_value, cut),
            optax.linear_schedule(peak_value, low, total_steps - cut),
        ],
        boundaries=[cut],
    )


def _check_warmup(warmup_steps: int, total_steps: int) -> None:
    if not 0 < warmup_steps < total_steps:
        raise ValueError(
            f"Need 0 < warmup_steps < total_steps; got warmup_steps={warmup_steps}, "
            f"total_steps={total_steps}."
        )


# ----------------------------------------------------------------------------------------------
# Gradient accumulation
# ----------------------------------------------------------------------------------------------

# The key of `aux` that carries a microbatch's loss denominator (see `accumulate_gradients`).
LOSS_DENOMINATOR = losses.LOSS_DENOMINATOR  # the aux key of a batch-dependent denominator


def accumulate_gradients(
    loss_fn: Callable[[Any, Any, jax.Array], tuple[jax.Array, dict[str, Any]]],
    params: Any,
    batch: Mapping[str, jax.Array],
    rng: jax.Array | None,
    num_microbatches: int = 1,
    *,
    grad_shardings: Any = None,
) -> tuple[jax.Array, dict[str, Any], Any]:
    """Loss and gradients of `batch`, computed as `num_microbatches` sequential microbatches.

    Peak activation memory is that of one microbatch; the result equals one pass over the whole
    batch. `loss_fn(params, batch, rng) -> (loss, aux)` must follow this contract:

    - `loss` is a scalar: the weighted sum of token losses divided by a denominator.
    - `aux` is a dict of arrays that add up over microbatches (sums and counts, e.g. the z-loss
      sum, the number of correct tokens); the result's `aux` holds their sums.
    - If the denominator depends on the batch (normalizing by the number of real or total target
      tokens), `aux["loss_denominator"]` holds it. The batch loss is then
      sum(denominator_k * loss_k) / sum(denominator_k), and likewise the gradients.
    - If the denominator is a constant (a fixed loss normalizing factor, or none), `aux` must NOT
      carry `"loss_denominator"`: each microbatch's loss is already its share of the batch loss,
      and losses and gradients are summed.

    Microbatch j takes rows j, j + k, j + 2k, ... (k = `num_microbatches`), so each microbatch
    keeps the batch's split over the `data` mesh axis. Each gets its own `fold_in(rng, j)`.

    Args:
        loss_fn: the loss function (pure, jittable).
        params: the parameters to differentiate.
        batch: feature name -> [B, ...] arrays, B divisible by `num_microbatches`.
        rng: a PRNG key for dropout, or None for deterministic passes.
        num_microbatches: k; 1 computes the batch in one pass.
        grad_shardings: shardings like `params` for the gradient sums carried from one
            microbatch to the next (the parameters' own, so FSDP keeps them split); None lets
            the compiler choose.

    Returns:
        (loss scalar, aux dict, grads like `params`).

    Raises:
        ValueError: when B is not divisible by `num_microbatches`.
    """
    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    if num_microbatches == 1:
        (loss, aux), grads = grad_fn(params, batch, rng)
        return loss, aux, grads
    microbatches = _split_microbatches(batch, num_microbatches)  # leaves [k, B / k, ...]

    def weight(aux):
        return aux[LOSS_DENOMINATOR].astype(jnp.float32) if LOSS_DENOMINATOR in aux else 1.0

    def split_like_params(grads):
        if grad_shardings is None:
            return grads
        return jax.lax.with_sharding_constraint(grads, grad_shardings)

    def step(carry, inputs):
        index, microbatch = inputs
        microbatch_rng = None if rng is None else jax.random.fold_in(rng, index)
        (loss, aux), grads = grad_fn(params, microbatch, microbatch_rng)
        w = weight(aux)
        update = (w * loss, jax.tree.map(lambda g: w * g.astype(jnp.float32), grads), aux)
        loss_sum, grads_sum, aux_sum = jax.tree.map(
            lambda a, b: (a + b).astype(a.dtype), carry, update
        )
        return (loss_sum, split_like_params(grads_sum), aux_sum), None

    first = jax.tree.map(lambda x: x[0], microbatches)
    (_, aux_shape), grads_shape = jax.eval_shape(grad_fn, params, first, rng)
    # NOTE: loss and gradients accumulate in float32 whatever the parameter dtype, so k bfloat16
    # microbatches do not round k times; aux keeps its dtypes (integer counts stay exact).
    zeros = (
        jnp.zeros((), jnp.float32),
        split_like_params(jax.tree.map(lambda s: jnp.zeros(s.shape, jnp.float32), grads_shape)),
        jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), aux_shape),
    )
    (loss_sum, grads_sum, aux), _ = jax.lax.scan(
        step, zeros, (jnp.arange(num_microbatches), microbatches)
    )
    total = weight(aux)
    # NOTE: with batch-dependent denominators the weighted sums divide by the batch total; with
    # constant ones `total` is 1 and the microbatch shares are simply summed.
    grads = jax.tree.map(lambda g, s: (g / total).astype(s.dtype), grads_sum, grads_shape)
    return loss_sum / total, aux, grads


def _split_microbatches(batch: Mapping[str, jax.Array], k: int) -> dict[str, jax.Array]:
    """[B, ...] features -> [k, B / k, ...] with microbatch j holding rows j, j + k, ..."""
    out = {}
    for name, x in batch.items():
        if x.shape[0] % k:
            raise ValueError(
                f"Feature {name!r} has batch size {x.shape[0]}, not divisible into {k} "
                f"microbatches. Use a batch size that is a multiple of {k}."
            )
        x = x.reshape((x.shape[0] // k, k) + x.shape[1:])  # [B / k, k, ...]
        out[name] = jnp.swapaxes(x, 0, 1)  # [k, B / k, ...]
    return out


# ----------------------------------------------------------------------------------------------
# Parameter labels
# ----------------------------------------------------------------------------------------------

TRAINABLE = "trainable"
FROZEN = "frozen"

# A label rule matches a parameter either by a regular expression searched in its path
# ("encoder/layers_0/mlp/wi/kernel") or by a predicate on (path, logical axis names).
Matcher = str | Callable[[str, tuple[str | None, ...]], bool]


def param_labels(
    params: Any, rules: Sequence[tuple[Matcher, str]], *, default: str = TRAINABLE
) -> Any:
    """Labels every parameter with the label of the first rule that matches it.

    Example: rules `[(r"^encoder/", "frozen"), (r"layer_norm", "norms")]` label
    `encoder/layers_0/mlp/wi/kernel` "frozen", `decoder/decoder_norm/scale` "trainable" (the
    default) and `decoder/layers_0/pre_mlp_layer_norm/scale` "norms".

    Args:
        params: a parameter tree (an `nnx.State` of Variables, or nested dicts of arrays).
        rules: (matcher, label) pairs, tried in order; a matcher is a regex searched in the
            parameter's path or a callable `(path, logical_axes) -> bool`.
        default: the label of parameters no rule matches.

    Returns:
        A tree like `params` with a label string per parameter, for `optax.multi_transform`.
    """
    compiled = [(re.compile(m) if isinstance(m, str) else m, label) for m, label in rules]

    def label_of(path, x):
        name = param_path(path)
        names = tuple(x.get_metadata().get("out_sharding") or ()) if is_variable(x) else ()
        for matcher, label in compiled:
            hit = matcher.search(name) if isinstance(matcher, re.Pattern) else matcher(name, names)
            if hit:
                return x.replace(label) if is_variable(x) else label
        return x.replace(default) if is_variable(x) else default

    return jax.tree_util.tree_map_with_path(label_of, params, is_leaf=is_variable)


def label_transforms(
    transforms: Mapping[str, optax.GradientTransformation],
    rules: Sequence[tuple[Matcher, str]],
    *,
    default: str = TRAINABLE,
) -> optax.GradientTransformation:
    """One transformation per label (`optax.multi_transform`), labels from `param_labels`.

    Labels are computed from the parameter tree each time (a callable), so parameters added
    later (adapters) are labelled by the same rules. Example: `{"trainable": adafactor(lr),
    "frozen": optax.set_to_zero()}` with rules `[(r"^encoder/", "frozen")]` trains only the
    decoder.

    Raises:
        ValueError: when `default` or a rule's label has no transformation.
    """
    labels = {label for _, label in rules} | {default}
    missing = sorted(labels - set(transforms))
    if missing:
        raise ValueError(
            f"Labels {missing} have no transformation; transforms are given for "
            f"{sorted(transforms)}."
        )
    return optax.multi_transform(
        dict(transforms), lambda params: param_labels(params, rules, default=default)
    )


def freeze(
    tx: optax.GradientTransformation, frozen: Sequence[Matcher]
) -> optax.GradientTransformation:
    """`tx` for every parameter except those `frozen` matches, which never change.

    Frozen parameters get zero updates and no optimizer state. Example:
    `freeze(adafactor(constant()), [r"^token_embedder/"])` keeps the embedding fixed.
    """
    return label_transforms(
        {TRAINABLE: tx, FROZEN: optax.set_to_zero()},
        [(matcher, FROZEN) for matcher in frozen],
    )
