"""Masks as small visible 0/1 matrices (1 = the query of that row may see the key of that column)."""

import numpy as np

from t2t.nn import masks


def matrix(mask):
    """[B, 1, L, S] bool -> [B, L, S] int, for comparison with literal matrices."""
    return np.asarray(mask)[:, 0].astype(int)


def test_padding_mask():
    tokens = np.array([[5, 6, 0]])
    np.testing.assert_array_equal(
        matrix(masks.padding_mask(tokens, tokens)),
        [
            [
                [1, 1, 0],
                [1, 1, 0],
                [0, 0, 0],
            ]
        ],
    )


def test_key_padding_mask_for_cross_attention():
    encoder_tokens = np.array([[7, 8, 9, 0], [7, 0, 0, 0]])
    np.testing.assert_array_equal(
        np.asarray(masks.key_padding_mask(encoder_tokens))[:, 0, 0],
        [
            [1, 1, 1, 0],
            [1, 0, 0, 0],
        ],
    )


def test_causal_mask():
    np.testing.assert_array_equal(
        matrix(masks.causal_mask(4)),
        [
            [
                [1, 0, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 1, 1],
            ]
        ],
    )


def test_segment_mask():
    segments = np.array([[1, 1, 2]])
    np.testing.assert_array_equal(
        matrix(masks.segment_mask(segments, segments)),
        [
            [
                [1, 1, 0],
                [1, 1, 0],
                [0, 0, 1],
            ]
        ],
    )


def test_packed_cross_attention_mask():
    # Decoder segments [1, 1, 2, 0] over encoder segments [1, 2, 2].
    cross = masks.segment_mask(np.array([[1, 1, 2, 0]]), np.array([[1, 2, 2]]))
    np.testing.assert_array_equal(
        matrix(cross),
        [
            [
                [1, 0, 0],
                [1, 0, 0],
                [0, 1, 1],
                [0, 0, 0],
            ]
        ],
    )


def test_prefix_lm_mask():
    # The first two positions are the fully visible prefix; the rest is causal.
    np.testing.assert_array_equal(
        matrix(masks.prefix_lm_mask(np.array([[1, 1, 0, 0]]))),
        [
            [
                [1, 1, 0, 0],
                [1, 1, 0, 0],
                [1, 1, 1, 0],
                [1, 1, 1, 1],
            ]
        ],
    )


def test_packed_decoder_mask_combines_causal_and_segments():
    segments = np.array([[1, 1, 2, 2, 0]])
    combined = masks.combine_masks(masks.causal_mask(5), masks.segment_mask(segments, segments))
    np.testing.assert_array_equal(
        matrix(combined),
        [
            [
                [1, 0, 0, 0, 0],
                [1, 1, 0, 0, 0],
                [0, 0, 1, 0, 0],
                [0, 0, 1, 1, 0],
                [0, 0, 0, 0, 1],
            ]
        ],
    )


def test_combine_masks_skips_none_and_bias_values():
    assert masks.combine_masks(None, None) is None
    assert masks.mask_to_bias(None) is None
    bias = np.asarray(masks.mask_to_bias(masks.causal_mask(2)))[0, 0]
    np.testing.assert_array_equal(bias, [[0.0, -1e10], [0.0, 0.0]])
    assert bias.dtype == np.float32
