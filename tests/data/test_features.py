"""Feature conversion per architecture: docs/spec.md section 5's packing vector and seqio's examples."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.data import features

EXAMPLES = [
    {"inputs": [7, 8, 5, 1], "targets": [3, 9, 1]},
    {"inputs": [8, 4, 9, 3, 1], "targets": [4, 1]},
]


def _convert(converter, examples, lengths):
    dataset = tf.data.Dataset.from_generator(
        lambda: iter(examples),
        output_signature={k: tf.TensorSpec([None], tf.int32) for k in examples[0]},
    )
    return [
        {k: v.tolist() for k, v in ex.items()}
        for ex in converter(dataset, lengths).as_numpy_iterator()
    ]


@pytest.mark.parametrize("architecture", ["encoder_decoder", "encoder_decoder_shared"])
def test_packing_vector_from_the_spec(architecture):
    # Same numbers as the `features` module docstring (docs/spec.md section 5).
    converter = features.feature_converter(architecture)
    (row,) = _convert(converter, EXAMPLES, {"inputs": 10, "targets": 7})
    assert row == {
        "encoder_input_tokens": [7, 8, 5, 1, 8, 4, 9, 3, 1, 0],
        "encoder_segment_ids": [1, 1, 1, 1, 2, 2, 2, 2, 2, 0],
        "encoder_positions": [0, 1, 2, 3, 0, 1, 2, 3, 4, 0],
        "decoder_target_tokens": [3, 9, 1, 4, 1, 0, 0],
        "decoder_input_tokens": [0, 3, 9, 0, 4, 0, 0],
        "decoder_loss_weights": [1, 1, 1, 1, 1, 0, 0],
        "decoder_segment_ids": [1, 1, 1, 2, 2, 0, 0],
        "decoder_positions": [0, 1, 2, 0, 1, 0, 0],
    }


def test_unpacked_encoder_decoder_pads_each_example():
    rows = _convert(
        features.feature_converter("encoder_decoder", pack=False),
        EXAMPLES,
        {"inputs": 6, "targets": 4},
    )
    assert [r["encoder_input_tokens"] for r in rows] == [[7, 8, 5, 1, 0, 0], [8, 4, 9, 3, 1, 0]]
    assert [r["decoder_input_tokens"] for r in rows] == [[0, 3, 9, 1], [0, 4, 1, 0]]
    assert "encoder_segment_ids" not in rows[0]


def test_prefix_lm_marks_the_visible_prefix():
    # seqio's PrefixLMFeatureConverter docstring example (packed, inputs 7, targets 8).
    (row,) = _convert(
        features.feature_converter("prefix_lm"), EXAMPLES, {"inputs": 7, "targets": 8}
    )
    assert row["decoder_target_tokens"] == [7, 8, 5, 1, 3, 9, 1, 8, 4, 9, 3, 1, 4, 1, 0]
    assert row["decoder_input_tokens"] == [0, 7, 8, 5, 1, 3, 9, 0, 8, 4, 9, 3, 1, 4, 0]
    assert row["decoder_loss_weights"] == [0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 0]
    assert row["decoder_causal_attention"] == [1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
    assert row["decoder_segment_ids"] == [1] * 7 + [2] * 7 + [0]


def test_decoder_only_concatenates_under_a_causal_mask():
    lengths = {"inputs": 7, "targets": 8}
    (causal,) = _convert(features.feature_converter("decoder_only"), EXAMPLES, lengths)
    (prefix,) = _convert(features.feature_converter("prefix_lm"), EXAMPLES, lengths)
    assert "decoder_causal_attention" not in causal
    del prefix["decoder_causal_attention"]
    assert causal == prefix  # same sequence, loss and packing; only the mask differs
    converter = features.feature_converter("decoder_only", loss_on_targets_only=False)
    (full,) = _convert(converter, EXAMPLES, lengths)
    assert full["decoder_loss_weights"] == [1] * 14 + [0]
    assert features.model_feature_lengths(converter, lengths) == {
        "decoder_target_tokens": 15,
        "decoder_input_tokens": 15,
        "decoder_loss_weights": 15,
        "decoder_segment_ids": 15,
        "decoder_positions": 15,
    }


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm"])
def test_targets_only_task_uses_the_lm_converter(architecture):
    converter = features.feature_converter(architecture, has_inputs=False)
    assert isinstance(converter, seqio.LMFeatureConverter)
    examples = [{"targets": [3, 9, 1]}, {"targets": [4, 1]}]
    (row,) = _convert(converter, examples, {"targets": 6})
    assert row["decoder_target_tokens"] == [3, 9, 1, 4, 1, 0]
    assert row["decoder_input_tokens"] == [0, 3, 9, 0, 4, 0]
    assert row["decoder_loss_weights"] == [1, 1, 1, 1, 1, 0]


def test_packed_rows_hold_every_token_once():
    rng = np.random.default_rng(0)
    examples = [
        {
            "inputs": rng.integers(3, 50, rng.integers(1, 9)).tolist() + [1],
            "targets": rng.integers(3, 50, rng.integers(1, 5)).tolist() + [1],
        }
        for _ in range(40)
    ]
    rows = _convert(
        features.feature_converter("encoder_decoder"), examples, {"inputs": 16, "targets": 8}
    )
    packed = [t for r in rows for t in r["encoder_input_tokens"] if t]
    assert packed == [t for ex in examples for t in ex["inputs"]]  # order kept, nothing dropped
    assert len(rows) < len(examples)


def test_bad_architecture_and_missing_inputs():
    with pytest.raises(ValueError, match="expected one of"):
        features.feature_converter("encoder_only")
    with pytest.raises(ValueError, match="needs tasks with an 'inputs' feature"):
        features.feature_converter("encoder_decoder", has_inputs=False)


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("architecture", ["encoder_decoder", "prefix_lm"])
def test_over_length_examples_are_trimmed_and_counted_not_refused(architecture, pack, capsys):
    # seqio's own converter refuses an example longer than its lengths (a tf.data assertion).
    lengths = {"inputs": 4, "targets": 2}
    seqio_cls = (
        seqio.EncDecFeatureConverter
        if architecture == "encoder_decoder"
        else seqio.PrefixLMFeatureConverter
    )
    with pytest.raises(tf.errors.InvalidArgumentError, match="input_validation"):
        _convert(seqio_cls(pack=pack), EXAMPLES, lengths)
    converter = features.feature_converter(architecture, pack=pack, count_trimmed=True)
    rows = _convert(converter, EXAMPLES, lengths)
    # The same rows as seqio's converter on examples cut by hand (trim_and_pack's cut).
    cut = [{k: v[: lengths[k]] for k, v in e.items()} for e in EXAMPLES]
    assert rows == _convert(seqio_cls(pack=pack), cut, lengths)
    assert converter.trimmed == 2  # both examples were over length
    assert "2 example(s) longer than the feature lengths were trimmed" in capsys.readouterr().err
    assert converter.trimmed == 2 and capsys.readouterr().err == ""  # reported once
    quiet = features.feature_converter(architecture, pack=pack)  # the training pipeline's
    assert _convert(quiet, EXAMPLES, lengths) == rows and quiet.trimmed == 0
