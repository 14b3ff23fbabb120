"""Corruption functions: how an objective turns tokens and a noise mask into inputs or targets.

Each function maps a ragged batch of token rows `[B, None]` and a noise mask of the same shape to a
new ragged batch. Pairs of them make the paper's Table 3 objectives (see `objectives`):

| objective | inputs function | targets function |
|---|---|---|
| span corruption, i.i.d. replace spans | `noise_span_to_unique_sentinel` | `nonnoise_span_to_unique_sentinel` |
| i.i.d. drop tokens | `drop_noise_tokens` | `drop_nonnoise_tokens` |
| BERT-style | `noise_token_to_mask_or_random` | (original text) |
| MASS-style | `noise_token_to_sentinel` | (original text) |
| deshuffling | `permute_noise_tokens` | (original text) |
| prefix LM | `drop_nonnoise_tokens` | `drop_noise_tokens` |

Sentinels come from the vocabulary (docs/spec.md section 3): `<extra_id_0>` = `vocab_size - 1`, and the
i-th span of a row gets `vocab_size - 1 - i`. The single mask token of BERT- and MASS-style is
`<extra_id_0>` too.
"""

from typing import Optional, Tuple

import seqio
import tensorflow as tf

# Ids 0, 1, 2 are PAD, EOS and UNK; random replacement tokens are drawn above them.
_NUM_RESERVED_IDS = 3


def sentinel_id(vocabulary: seqio.Vocabulary) -> int:
    """The id of `<extra_id_0>`: `vocabulary.vocab_size - 1` (32099 for 32000 pieces + 100)."""
    return vocabulary.vocab_size - 1


def noise_span_to_unique_sentinel(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: seqio.Vocabulary,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Replaces each run of noise tokens with the next sentinel, counting down from `<extra_id_0>`.

    Example (docs/spec.md section 4, vocab_size 32100): tokens `A B C D E F G H`, noise `C D` and `H`
    -> `A B 32099 E F G 32098`.

    Args:
        tokens: int `[B, None]`.
        noise_mask: bool `[B, None]`, same row lengths.
        vocabulary: supplies `vocab_size`.
        seed: unused.

    Returns:
        int `[B, None]`: kept tokens and one sentinel per noise span.
    """
    del seed
    if not vocabulary.extra_ids:
        raise ValueError(
            f"sentinel objectives need a vocabulary with extra ids, but {vocabulary} has none; use "
            "seqio.SentencePieceVocabulary(path, extra_ids=100)"
        )
    dense, mask, valid = _to_dense(tokens, noise_mask)
    previous = tf.pad(mask[:, :-1], [[0, 0], [1, 0]])
    first = mask & ~previous
    later = mask & previous
    span_index = tf.cumsum(tf.cast(first, dense.dtype), axis=1)  # 1 for the first span
    check = tf.debugging.assert_less_equal(
        tf.reduce_max(span_index[:, -1:]),  # spans in the busiest row
        tf.cast(vocabulary.extra_ids, dense.dtype),
        message=(
            f"a sequence has more noise spans than the vocabulary's {vocabulary.extra_ids} "
            "sentinels; lower noise_density, raise the mean span length or use shorter segments"
        ),
    )
    sentinels = tf.cast(sentinel_id(vocabulary) + 1, dense.dtype) - span_index
    with tf.control_dependencies([check]):
        out = tf.where(first, sentinels, dense)
    return tf.ragged.boolean_mask(out, valid & ~later)


def nonnoise_span_to_unique_sentinel(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: seqio.Vocabulary,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Replaces each run of kept tokens with the next sentinel (the span-corruption targets).

    Example (docs/spec.md section 4, vocab_size 32100): tokens `A B C D E F G H`, noise `C D` and `H`
    -> `32099 C D 32098 H`.
    """
    return noise_span_to_unique_sentinel(tokens, _invert(noise_mask), vocabulary, seed)


def drop_noise_tokens(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: Optional[seqio.Vocabulary] = None,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Removes the noise tokens. Example: `1 2 3 4`, noise `2 3` -> `1 4`."""
    del vocabulary, seed
    return tf.ragged.boolean_mask(tokens, tf.logical_not(noise_mask))


def drop_nonnoise_tokens(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: Optional[seqio.Vocabulary] = None,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Keeps only the noise tokens. Example: `1 2 3 4`, noise `2 3` -> `2 3`."""
    del vocabulary, seed
    return tf.ragged.boolean_mask(tokens, noise_mask)


def noise_token_to_sentinel(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: seqio.Vocabulary,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Replaces every noise token with the mask token `<extra_id_0>` (MASS-style inputs).

    Example (vocab_size 32100): `1 2 3 4`, noise `2 3` -> `1 32099 32099 4`.
    """
    del seed
    replacement = tf.cast(sentinel_id(vocabulary), tokens.dtype)
    return tf.ragged.map_flat_values(lambda t, m: tf.where(m, replacement, t), tokens, noise_mask)


def noise_token_to_mask_or_random(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: seqio.Vocabulary,
    seed: tf.Tensor,
    *,
    mask_rate: float = 0.8,
    random_rate: float = 0.1,
) -> tf.RaggedTensor:
    """BERT-style replacement: each noise token becomes the mask token, a random token, or stays.

    A noise token becomes `<extra_id_0>` with probability `mask_rate`, a random ordinary piece
    (ids 3 .. vocab_size - extra_ids - 1) with probability `random_rate`, and stays unchanged
    otherwise. BERT uses 0.8 / 0.1 (0.1 kept); the paper's Table 3 row uses 0.9 / 0.1.

    Example (vocab_size 32100, mask_rate 1.0): `1 2 3 4`, noise `2 3` -> `1 32099 32099 4`.

    Args:
        tokens: int `[B, None]`.
        noise_mask: bool `[B, None]`.
        vocabulary: supplies the mask token and the range of random tokens.
        seed: int32 `[2]` stateless seed.
        mask_rate: probability of the mask token.
        random_rate: probability of a random token.

    Returns:
        int `[B, None]`, same row lengths as `tokens`.
    """
    check_replacement_rates(mask_rate, random_rate)
    choice_seed, token_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    flat = tokens.flat_values  # [total tokens]
    noise = noise_mask.flat_values
    uniform = tf.random.stateless_uniform(tf.shape(flat), choice_seed)
    use_mask = noise & (uniform < mask_rate)
    use_random = noise & (uniform >= mask_rate) & (uniform < mask_rate + random_rate)
    random_tokens = tf.random.stateless_uniform(
        tf.shape(flat),
        token_seed,
        minval=_NUM_RESERVED_IDS,
        maxval=vocabulary.vocab_size - vocabulary.extra_ids,
        dtype=flat.dtype,
    )
    out = tf.where(use_random, random_tokens, flat)
    out = tf.where(use_mask, tf.cast(sentinel_id(vocabulary), flat.dtype), out)
    return tokens.with_flat_values(out)


def permute_noise_tokens(
    tokens: tf.RaggedTensor,
    noise_mask: tf.RaggedTensor,
    vocabulary: Optional[seqio.Vocabulary] = None,
    seed: Optional[tf.Tensor] = None,
) -> tf.RaggedTensor:
    """Shuffles the noise tokens among the noise positions; other tokens stay in place.

    With the mask covering everything this is the deshuffling objective's input.

    Example: `5 6 7 8 9`, noise `7 8` -> `5 6 7 8 9` or `5 6 8 7 9`.

    Args:
        tokens: int `[B, None]`.
        noise_mask: bool `[B, None]`.
        vocabulary: unused.
        seed: int32 `[2]` stateless seed.

    Returns:
        int `[B, None]`, same row lengths, each row a permutation of the input row.
    """
    del vocabulary
    dense, mask, _ = _to_dense(tokens, noise_mask)
    keys = tf.random.stateless_uniform(tf.shape(dense), seed)
    # Noise positions in random order first (keys < 1), everything else after (key 2).
    random_order = tf.argsort(tf.where(mask, keys, 2.0), axis=1)  # [B, W]
    rank = tf.cumsum(tf.cast(mask, tf.int32), axis=1, exclusive=True)  # [B, W] rank among noise
    source = tf.gather(random_order, rank, batch_dims=1)
    shuffled = tf.gather(dense, source, batch_dims=1)
    out = tf.where(mask, shuffled, dense)
    return tf.RaggedTensor.from_tensor(out, lengths=tokens.row_lengths())


def check_replacement_rates(mask_rate: float, random_rate: float) -> None:
    """Raises unless the BERT-style rates are probabilities that sum to at most 1."""
    if not (0.0 <= mask_rate <= 1.0 and 0.0 <= random_rate <= 1.0):
        raise ValueError(
            f"mask_rate and random_rate must each lie in [0, 1], got {mask_rate} and {random_rate}"
        )
    if mask_rate + random_rate > 1.0 + 1e-9:
        raise ValueError(
            f"mask_rate + random_rate must be at most 1 (the rest of the noise tokens are kept), "
            f"got {mask_rate} + {random_rate} = {mask_rate + random_rate}"
        )


def _to_dense(
    tokens: tf.RaggedTensor, noise_mask: tf.RaggedTensor
) -> Tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """Padded `[B, W]` tokens, noise mask (False on padding) and validity mask."""
    dense = tokens.to_tensor()
    mask = noise_mask.to_tensor(default_value=False)  # same row lengths, so the same width
    valid = tf.sequence_mask(tokens.row_lengths(), tf.shape(dense)[1])
    return dense, mask, valid


def _invert(noise_mask: tf.RaggedTensor) -> tf.RaggedTensor:
    return tf.ragged.map_flat_values(tf.logical_not, noise_mask)
