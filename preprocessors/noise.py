"""Noise masks (which tokens an objective corrupts) and the span-corruption length helper.

A noise mask function takes the lengths of a ragged batch of sequences and a seed and returns a
boolean mask `[B, W]` (`W = max(lengths)`, False beyond each length). The objectives in
`objectives` pair a mask with corruption functions from `corruption`; swapping the mask function is
how the paper's Table 4 and 5 variants (i.i.d. vs. span noise, rates, span lengths) are built.

The counts of `random_spans_noise_mask` follow docs/spec.md section 4 exactly:
`num_noise = clip(round(L * d), 1, L - 1)`, `num_spans = max(round(num_noise / m), 1)`, where
`round` is half-to-even on float64 values, the same numbers Python's `round` and
`random_spans_helper` produce.
"""

from typing import Optional, Tuple

import tensorflow as tf

_MAX_INT32 = 2**31 - 1


def random_spans_helper(
    inputs_length: int,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
    *,
    extra_tokens_per_span_inputs: int = 1,
    extra_tokens_per_span_targets: int = 1,
    targets_length: Optional[int] = None,
) -> Tuple[int, int]:
    """Raw segment length and encoded targets length for span corruption at `inputs_length`.

    Both lengths count the EOS that the task appends after the objective. For a raw length T:
    `noise = round(T*d)`, `spans = round(noise/m)` (clipped as in `noise_counts`, which only
    matters for lengths of a few tokens), `inputs(T) = T - noise + spans + 1`,
    `targets(T) = noise + spans + 1`; T is the largest length with `inputs(T) <= inputs_length`.

    Example (docs/spec.md section 4): `random_spans_helper(512)` -> `(568, 114)`: 568 raw tokens hold
    85 noise tokens in 28 spans, so inputs are 568 - 85 + 28 + 1 = 512 and targets 85 + 28 + 1 =
    114. With `mean_noise_span_length=20`, 1024 -> (1193, 189).

    Args:
        inputs_length: the encoder input length to fill exactly.
        noise_density: fraction of raw tokens that are noise, in (0, 1).
        mean_noise_span_length: mean length of a noise span, >= 1.
        extra_tokens_per_span_inputs: sentinels that replace one noise span in the inputs.
        extra_tokens_per_span_targets: sentinels that replace one kept span in the targets.
        targets_length: when given, the targets length the caller has configured; a value shorter
            than the encoded targets raises.

    Returns:
        `(tokens_length, targets_length)`: raw tokens per segment and the encoded targets length.

    Raises:
        ValueError: on an out-of-range argument, or when `targets_length` is too short.
    """
    _check_density_and_span(noise_density, mean_noise_span_length)
    if inputs_length < 3:
        raise ValueError(
            f"inputs_length must be at least 3 (a kept token, a sentinel and EOS), got {inputs_length}"
        )

    def lengths_for(tokens_length: int) -> Tuple[int, int]:
        # NOTE: the same clipping as `noise_counts` (at least one noise token and one span, at
        # least one kept token per span); it only binds for tiny lengths, where the t5 package's
        # helper counts zero spans and its targets overflow by a sentinel.
        num_noise = min(max(int(round(tokens_length * noise_density)), 1), tokens_length - 1)
        num_spans = int(round(num_noise / mean_noise_span_length))
        num_spans = min(max(num_spans, 1), tokens_length - num_noise)
        return (
            tokens_length - num_noise + num_spans * extra_tokens_per_span_inputs + 1,
            num_noise + num_spans * extra_tokens_per_span_targets + 1,
        )

    tokens_length = inputs_length - 1
    while lengths_for(tokens_length + 1)[0] <= inputs_length:
        tokens_length += 1
    needed_inputs, needed_targets = lengths_for(tokens_length)
    # NOTE: the t5 package shortens segments by one token at density 0.5 when the targets would
    # come out longer than the inputs, so inputs and targets can share one round length.
    if noise_density == 0.5 and needed_targets > needed_inputs:
        tokens_length -= 1
        needed_targets -= 1
    if targets_length is not None and targets_length < needed_targets:
        raise ValueError(
            f"span corruption at inputs length {inputs_length} (noise_density={noise_density}, "
            f"mean_noise_span_length={mean_noise_span_length}) needs a targets length of "
            f"{needed_targets}, but the targets length given is {targets_length}; set the "
            f"targets length to {needed_targets} or more"
        )
    return tokens_length, needed_targets


def noise_counts(
    lengths: tf.Tensor, noise_density: float, mean_noise_span_length: float
) -> Tuple[tf.Tensor, tf.Tensor]:
    """Noise tokens and noise spans per sequence, as `random_spans_noise_mask` uses them.

    Example: lengths [568, 8, 2] at d=0.15, m=3 -> noise [85, 1, 1], spans [28, 1, 1].

    Args:
        lengths: int32 `[B]` sequence lengths (values below 2 are treated as 2).
        noise_density: fraction of tokens that are noise.
        mean_noise_span_length: mean noise span length.

    Returns:
        `(num_noise [B], num_spans [B])`, int32.
    """
    lengths = tf.maximum(tf.cast(lengths, tf.int32), 2)
    # NOTE: float64 and half-to-even `tf.round` reproduce Python's `round`, so these counts agree
    # with `random_spans_helper` for every length (float32 can differ at exact halves).
    num_noise = tf.cast(tf.round(tf.cast(lengths, tf.float64) * noise_density), tf.int32)
    num_noise = tf.clip_by_value(num_noise, 1, lengths - 1)
    num_spans = tf.cast(tf.round(tf.cast(num_noise, tf.float64) / mean_noise_span_length), tf.int32)
    # NOTE: the clip to the non-noise count only binds for extreme settings (density > ~0.7 with
    # spans of ~1 token); there the t5 package would build a mask with fewer spans than it counted.
    num_spans = tf.clip_by_value(num_spans, 1, lengths - num_noise)
    return num_noise, num_spans


def random_spans_noise_mask(
    lengths: tf.Tensor,
    seed: tf.Tensor,
    *,
    noise_density: float = 0.15,
    mean_noise_span_length: float = 3.0,
) -> tf.Tensor:
    """Random noise spans: the T5 objective's mask, computed for a whole batch at once.

    Each row has `num_noise` noise tokens in `num_spans` spans (`noise_counts`); the noise tokens
    and the kept tokens are each cut into `num_spans` random non-empty pieces, and the pieces
    alternate kept, noise, kept, noise, ... so a row starts with kept tokens and ends with noise.
    All such masks are equally likely.

    Example: lengths [8] with noise_density=0.4, mean_noise_span_length=1.5 gives 3 noise tokens
    in 2 spans, e.g. `[F F T T F F F T]` (docs/spec.md's `A B C D E F G H` with noise `C D` and `H`).

    Args:
        lengths: int32 `[B]` sequence lengths.
        seed: int32 `[2]` stateless seed.
        noise_density: fraction of tokens that are noise.
        mean_noise_span_length: mean noise span length.

    Returns:
        bool `[B, W]` with `W = max(lengths)`; False beyond each row's length.
    """
    lengths = tf.cast(lengths, tf.int32)
    # NOTE: one extra dummy row keeps every op well defined for an empty batch (`searchsorted`
    # rejects zero rows); it is sliced off at the end.
    padded_lengths = tf.maximum(tf.concat([lengths, [2]], axis=0), 2)
    num_noise, num_spans = noise_counts(padded_lengths, noise_density, mean_noise_span_length)
    noise_seed, kept_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    noise_ends = _random_segment_ends(num_noise, num_spans, noise_seed)  # [B, K]
    kept_ends = _random_segment_ends(padded_lengths - num_noise, num_spans, kept_seed)  # [B, K]
    # Noise span i covers [kept_ends[i] + noise_ends[i-1], kept_ends[i] + noise_ends[i]).
    previous_noise_ends = tf.pad(noise_ends[:, :-1], [[0, 0], [1, 0]])
    starts = kept_ends + previous_noise_ends  # [B, K]
    stops = kept_ends + noise_ends  # [B, K]
    width = _max_or_zero(padded_lengths)
    positions = tf.broadcast_to(tf.range(width), [tf.size(padded_lengths), width])  # [B+1, W]
    started = tf.searchsorted(starts, positions, side="right")
    stopped = tf.searchsorted(stops, positions, side="right")
    mask = started > stopped
    mask = mask[:-1, : _max_or_zero(lengths)]
    return mask & _valid_positions(lengths, tf.shape(mask)[1])


def _random_segment_ends(
    num_items: tf.Tensor, num_segments: tf.Tensor, seed: tf.Tensor
) -> tf.Tensor:
    """Cuts `num_items[b]` items into `num_segments[b]` random non-empty pieces.

    Example: num_items [5], num_segments [2] -> e.g. [[3, 5]] (pieces of 3 and 2 items).

    Args:
        num_items: int32 `[B]`, >= 1.
        num_segments: int32 `[B]`, in [1, num_items].
        seed: int32 `[2]` stateless seed.

    Returns:
        int32 `[B, K]`, `K = max(num_segments)`: the cumulative end of each piece, ascending;
        columns past a row's own `num_segments` hold `num_items[b]`.
    """
    batch = tf.size(num_items)
    num_cuts = tf.maximum(_max_or_zero(num_segments) - 1, 0)
    # Cut c (1 <= c < num_items) starts a new piece before item c; choose num_segments - 1 cuts
    # uniformly without replacement as the top keys of i.i.d. random keys.
    cut_width = tf.maximum(_max_or_zero(num_items) - 1, num_cuts)
    keys = tf.random.stateless_uniform(
        [batch, cut_width], seed, minval=0, maxval=_MAX_INT32, dtype=tf.int32
    )
    cuts = tf.range(1, cut_width + 1)[tf.newaxis, :]  # [1, C]
    keys = tf.where(cuts < num_items[:, tf.newaxis], keys, -1)
    chosen = tf.math.top_k(keys, k=num_cuts, sorted=True).indices + 1  # [B, K-1], best first
    in_row = tf.range(num_cuts)[tf.newaxis, :] < num_segments[:, tf.newaxis] - 1
    chosen = tf.where(in_row, chosen, num_items[:, tf.newaxis])
    ends = tf.concat([tf.sort(chosen, axis=1), num_items[:, tf.newaxis]], axis=1)
    return ends


def iid_noise_mask(
    lengths: tf.Tensor, seed: tf.Tensor, *, noise_density: float = 0.15
) -> tf.Tensor:
    """Each token is noise independently with probability `noise_density`.

    Example: lengths [4, 2] -> e.g. `[[F T F F], [T F]]` (padding is always False).

    Args:
        lengths: int32 `[B]` sequence lengths.
        seed: int32 `[2]` stateless seed.
        noise_density: probability that a token is noise.

    Returns:
        bool `[B, W]` with `W = max(lengths)`.
    """
    lengths = tf.cast(lengths, tf.int32)
    width = _max_or_zero(lengths)
    uniform = tf.random.stateless_uniform([tf.size(lengths), width], seed)
    return (uniform < noise_density) & _valid_positions(lengths, width)


def random_prefix_mask(lengths: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Marks a random non-empty proper prefix of each sequence (the prefix LM's inputs).

    The prefix length is uniform in [1, L - 1]; a sequence of one token gets an empty prefix.

    Example: lengths [10] -> e.g. `[T T T T F F F F F F]` (prefix of 4: "Thank you for inviting").

    Args:
        lengths: int32 `[B]` sequence lengths.
        seed: int32 `[2]` stateless seed.

    Returns:
        bool `[B, W]` with `W = max(lengths)`.
    """
    lengths = tf.cast(lengths, tf.int32)
    uniform = tf.random.stateless_uniform([tf.size(lengths)], seed, dtype=tf.float64)
    choices = tf.cast(tf.maximum(lengths - 1, 0), tf.float64)
    prefix = tf.cast(tf.floor(uniform * choices), tf.int32) + 1
    prefix = tf.minimum(prefix, lengths - 1)
    return _valid_positions(prefix, _max_or_zero(lengths))


def full_mask(lengths: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Marks every token (deshuffling permutes the whole sequence). `seed` is unused."""
    del seed
    lengths = tf.cast(lengths, tf.int32)
    return _valid_positions(lengths, _max_or_zero(lengths))


def _max_or_zero(values: tf.Tensor) -> tf.Tensor:
    """`max(values)`, or 0 for an empty batch (where `reduce_max` gives the dtype's minimum)."""
    return tf.reduce_max(tf.pad(values, [[0, 1]]))


def _valid_positions(lengths: tf.Tensor, width: tf.Tensor) -> tf.Tensor:
    return tf.sequence_mask(lengths, width)


def _check_density_and_span(noise_density: float, mean_noise_span_length: float) -> None:
    if not 0.0 < noise_density < 1.0:
        raise ValueError(
            f"noise_density must lie strictly between 0 and 1 (the paper sweeps 0.10-0.50), "
            f"got {noise_density}"
        )
    if mean_noise_span_length < 1.0:
        raise ValueError(
            f"mean_noise_span_length must be at least 1 token (the paper sweeps 2-10), "
            f"got {mean_noise_span_length}"
        )
