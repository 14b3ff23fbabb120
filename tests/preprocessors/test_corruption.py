"""Corruption functions on ragged batches: the docstring examples, computed eagerly."""

import numpy as np
import pytest
import tensorflow as tf

from preprocessors import corruption

SEED = tf.constant([2, 7], tf.int32)


def _ragged(rows, dtype=tf.int32):
    return tf.ragged.constant(rows, dtype=dtype)


def _mask(rows):
    return tf.ragged.constant(rows, dtype=tf.bool)


T, F = True, False


def test_spec_worked_example_both_sides(vocab32100):
    tokens = _ragged([[10, 11, 12, 13, 14, 15, 16, 17]])  # A B C D E F G H
    mask = _mask([[F, F, T, T, F, F, F, T]])  # noise C D and H
    inputs = corruption.noise_span_to_unique_sentinel(tokens, mask, vocab32100)
    targets = corruption.nonnoise_span_to_unique_sentinel(tokens, mask, vocab32100)
    assert inputs.to_list() == [[10, 11, 32099, 14, 15, 16, 32098]]
    assert targets.to_list() == [[32099, 12, 13, 32098, 17]]


def test_sentinels_restart_in_every_row(vocab32100):
    tokens = _ragged([[1 + 10, 12, 13], [14, 15]])
    mask = _mask([[T, F, T], [F, T]])
    assert corruption.noise_span_to_unique_sentinel(tokens, mask, vocab32100).to_list() == [
        [32099, 12, 32098],
        [14, 32099],
    ]


def test_drop_examples():
    tokens, mask = _ragged([[1, 2, 3, 4]]), _mask([[F, T, T, F]])
    assert corruption.drop_noise_tokens(tokens, mask).to_list() == [[1, 4]]
    assert corruption.drop_nonnoise_tokens(tokens, mask).to_list() == [[2, 3]]


def test_noise_token_to_sentinel_example(vocab32100):
    tokens, mask = _ragged([[1, 2, 3, 4]]), _mask([[F, T, T, F]])
    assert corruption.noise_token_to_sentinel(tokens, mask, vocab32100).to_list() == [
        [1, 32099, 32099, 4]
    ]


def test_mask_or_random_example_and_rates(vocab32100):
    tokens, mask = _ragged([[1, 2, 3, 4]]), _mask([[F, T, T, F]])
    out = corruption.noise_token_to_mask_or_random(
        tokens, mask, vocab32100, SEED, mask_rate=1.0, random_rate=0.0
    )
    assert out.to_list() == [[1, 32099, 32099, 4]]
    kept = corruption.noise_token_to_mask_or_random(
        tokens, mask, vocab32100, SEED, mask_rate=0.0, random_rate=0.0
    )
    assert kept.to_list() == [[1, 2, 3, 4]]
    swapped = corruption.noise_token_to_mask_or_random(
        _ragged([[5] * 4000]), _mask([[T] * 4000]), vocab32100, SEED, mask_rate=0.0, random_rate=1.0
    ).flat_values.numpy()
    assert swapped.min() >= 3 and swapped.max() < 32000 and len(np.unique(swapped)) > 3000


def test_permute_example_and_rows_are_permutations():
    tokens, mask = _ragged([[5, 6, 7, 8, 9]] * 200), _mask([[F, F, T, T, F]] * 200)
    rows = {tuple(r) for r in corruption.permute_noise_tokens(tokens, mask, seed=SEED).to_list()}
    assert rows == {(5, 6, 7, 8, 9), (5, 6, 8, 7, 9)}
    ragged = _ragged([[1, 2, 3], list(range(10, 30))])
    everything = tf.ragged.map_flat_values(tf.ones_like, ragged) > 0
    out = corruption.permute_noise_tokens(ragged, everything, seed=SEED).to_list()
    assert [sorted(r) for r in out] == ragged.to_list() and out[1] != ragged.to_list()[1]


def test_sentinel_functions_need_extra_ids():
    import seqio

    tokens, mask = _ragged([[1, 2]]), _mask([[F, T]])
    with pytest.raises(ValueError, match="extra ids"):
        corruption.noise_span_to_unique_sentinel(
            tokens, mask, seqio.PassThroughVocabulary(10, eos_id=1)
        )
