"""The Table 3 objectives: hand-worked goldens with injected masks, statistics of the random path."""

import numpy as np
import pytest
import seqio
import tensorflow as tf

import preprocessors
from preprocessors import corruption

# docs/spec.md section 4: tokens A B C D E F G H as ids 10..17.
A, B, C, D, E, F, G, H = range(10, 18)
X, Y, Z = 32099, 32098, 32097  # <extra_id_0>, <extra_id_1>, <extra_id_2> with vocab_size 32100
M = 32099  # the mask token of BERT- and MASS-style


def mask_at(*positions):
    """A noise-mask function marking fixed positions of every row (injected to fix the mask)."""

    def noise_mask_fn(lengths, seed):
        del seed
        lengths = tf.cast(lengths, tf.int32)
        width = tf.reduce_max(lengths)
        marked = tf.reduce_any(tf.range(width)[:, None] == tf.constant(positions)[None, :], axis=1)
        return marked[None, :] & tf.sequence_mask(lengths, width)

    return noise_mask_fn


def run(
    objective, docs, token_dataset, as_lists, features, lengths, with_eos=True, seed=1, **kwargs
):
    with seqio.map_seed_manager(seed):
        ds = objective(
            token_dataset(docs), sequence_length=lengths, output_features=features, **kwargs
        )
    if with_eos:
        ds = seqio.preprocessors.append_eos_after_trim(
            ds, output_features=features, sequence_length=lengths
        )
    return as_lists(ds)


# ------------------------------------------------------------------------------------- goldens


def test_span_corruption_spec_worked_example(token_dataset, as_lists, features32100):
    out = run(
        preprocessors.span_corruption,
        [[A, B, C, D, E, F, G, H]],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 9, "targets": 8},
        noise_mask_fn=mask_at(2, 3, 7),
    )
    assert out == [{"inputs": [A, B, X, E, F, G, Y, 1], "targets": [X, C, D, Y, H, 1]}]


def test_denoise_spec_worked_example_without_eos(token_dataset, as_lists, features32100):
    ds = preprocessors.denoise(
        token_dataset([[A, B, C, D, E, F, G, H]]),
        features32100,
        mask_at(2, 3, 7),
        preprocessors.noise_span_to_unique_sentinel,
        preprocessors.nonnoise_span_to_unique_sentinel,
    )
    assert as_lists(ds) == [{"inputs": [A, B, X, E, F, G, Y], "targets": [X, C, D, Y, H]}]


def test_iid_noise_replace_spans_docstring_example(token_dataset, as_lists, features32100):
    # `1 2 3 4 5 6`, noise `3 4` and `6` (ids shifted by 10 to stay clear of PAD/EOS/UNK).
    out = run(
        preprocessors.iid_noise_replace_spans,
        [[11, 12, 13, 14, 15, 16]],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 7, "targets": 7},
        with_eos=False,
        noise_mask_fn=mask_at(2, 3, 5),
    )
    assert out == [{"inputs": [11, 12, X, 15, Y], "targets": [X, 13, 14, Y, 16]}]


def test_iid_noise_drop_tokens_docstring_example(token_dataset, as_lists, features32100):
    out = run(
        preprocessors.iid_noise_drop_tokens,
        [[11, 12, 13, 14, 15, 16]],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 7, "targets": 7},
        noise_mask_fn=mask_at(2, 3, 5),
    )
    assert out == [{"inputs": [11, 12, 15, 1], "targets": [13, 14, 16, 1]}]


@pytest.mark.parametrize("objective", ["bert_style", "mass_style"])
def test_mask_token_objectives_docstring_example(objective, token_dataset, as_lists, features32100):
    kwargs = {"mask_rate": 1.0, "random_rate": 0.0} if objective == "bert_style" else {}
    out = run(
        getattr(preprocessors, objective),
        [[11, 12, 13, 14, 15, 16]],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 7, "targets": 7},
        with_eos=False,
        noise_mask_fn=mask_at(2, 3),
        **kwargs,
    )
    assert out == [{"inputs": [11, 12, M, M, 15, 16], "targets": [11, 12, 13, 14, 15, 16]}]


def test_bert_style_keep_rate_one_leaves_inputs_unchanged(token_dataset, as_lists, features32100):
    out = run(
        preprocessors.bert_style,
        [[11, 12, 13, 14]],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 5, "targets": 5},
        with_eos=False,
        noise_mask_fn=mask_at(1, 2),
        mask_rate=0.0,
        random_rate=0.0,
    )
    assert out == [{"inputs": [11, 12, 13, 14], "targets": [11, 12, 13, 14]}]


def test_paper_table3_bert_row(token_dataset, as_lists, features32100):
    # "Thank you for inviting me to your party last week ." with "for inviting" masked and "last"
    # swapped for a random token ("apple"): mask_rate / random_rate as the noise picks them.
    text = list(range(100, 111))
    out = run(
        preprocessors.bert_style,
        [text],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 12, "targets": 12},
        with_eos=False,
        noise_mask_fn=mask_at(2, 3),
        mask_rate=1.0,
        random_rate=0.0,
    )
    assert out[0]["inputs"][:2] == [100, 101] and out[0]["inputs"][2:4] == [M, M]
    assert out[0]["inputs"][4:] == text[4:] and out[0]["targets"] == text


def test_deshuffle_with_mask_permutes_only_the_marked_tokens(
    token_dataset, as_lists, features32100
):
    # 40 copies of `5 6 7 8 9` concatenate and split back into 5-token segments, each shuffled with
    # its own randomness.
    out = run(
        preprocessors.deshuffle,
        [[5, 6, 7, 8, 9]] * 40,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 6, "targets": 6},
        with_eos=False,
        noise_mask_fn=mask_at(2, 3),
    )
    assert len(out) == 40 and all(e["targets"] == [5, 6, 7, 8, 9] for e in out)
    assert {tuple(e["inputs"]) for e in out} == {(5, 6, 7, 8, 9), (5, 6, 8, 7, 9)}


def test_prefix_lm_paper_example(token_dataset, as_lists, features32100):
    # "Thank you for inviting | me to your party last week ." as ids 100..110, prefix of 4.
    text = list(range(100, 111))
    out = run(
        preprocessors.prefix_lm,
        [text],
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 16, "targets": 16},
        noise_mask_fn=mask_at(0, 1, 2, 3),
    )
    assert out == [
        {"inputs": [100, 101, 102, 103, 1], "targets": [104, 105, 106, 107, 108, 109, 110, 1]}
    ]


def test_full_lm_docstring_example(token_dataset, as_lists, vocab32100):
    features = {"targets": seqio.Feature(vocab32100, add_eos=False)}
    out = run(
        preprocessors.full_lm,
        [[5, 6, 7], [8, 9]],
        token_dataset,
        as_lists,
        features,
        {"targets": 4},
        with_eos=False,
    )
    assert out == [{"targets": [5, 6, 7, 1]}, {"targets": [8, 9, 1]}]


def test_full_lm_leaves_room_for_eos_when_targets_append_it(token_dataset, as_lists, features32100):
    out = run(
        preprocessors.full_lm,
        [[5, 6, 7], [8, 9]],
        token_dataset,
        as_lists,
        features32100,
        {"targets": 4},
        with_eos=False,
    )
    assert [e["targets"] for e in out] == [[5, 6, 7], [1, 8, 9], [1]]


# ------------------------------------------------------------------------ the random path


@pytest.fixture(scope="module")
def long_docs():
    rng = np.random.default_rng(0)
    return [rng.integers(3, 30000, size=int(n)).tolist() for n in rng.integers(50, 900, size=60)]


def test_bert_style_replacement_proportions(token_dataset, as_lists, features32100, long_docs):
    """BERT's own 80/10/10 split (mask_rate=0.8; the default is the paper's 90/10)."""
    out = run(
        preprocessors.bert_style,
        long_docs,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 512, "targets": 512},
        with_eos=False,
        noise_density=0.5,
        mask_rate=0.8,
    )
    inputs = np.concatenate([e["inputs"] for e in out])
    targets = np.concatenate([e["targets"] for e in out])
    assert len(inputs) == len(targets) > 20000
    masked = inputs == M
    changed = (inputs != targets) & ~masked
    assert abs(masked.mean() - 0.5 * 0.8) < 0.02
    assert abs(changed.mean() - 0.5 * 0.1) < 0.01
    assert inputs[changed].min() >= 3 and inputs[changed].max() < 32000  # ordinary pieces only


def test_bert_style_paper_variant_has_no_kept_noise(
    token_dataset, as_lists, features32100, long_docs
):
    """The default: the paper's 90% mask / 10% random of the corrupted tokens."""
    out = run(
        preprocessors.bert_style,
        long_docs,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 512, "targets": 512},
        with_eos=False,
    )
    inputs = np.concatenate([e["inputs"] for e in out])
    targets = np.concatenate([e["targets"] for e in out])
    corrupted = (inputs != targets).mean()
    assert abs(corrupted - 0.15) < 0.01  # every noise token is masked or swapped
    assert abs((inputs == M).mean() - 0.135) < 0.01


def test_deshuffle_random_path_permutes_whole_segments(
    token_dataset, as_lists, features32100, long_docs
):
    out = run(
        preprocessors.deshuffle,
        long_docs,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 64, "targets": 64},
        with_eos=False,
    )
    assert len(out) > 100
    moved = 0
    for e in out:
        assert sorted(e["inputs"]) == sorted(e["targets"]) and len(e["targets"]) <= 63
        moved += e["inputs"] != e["targets"]
    assert moved >= len(out) - 2  # only 1- or 2-token tail segments may come out unchanged


def test_prefix_lm_random_split_points(token_dataset, as_lists, features32100, long_docs):
    out = run(
        preprocessors.prefix_lm,
        long_docs,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 64, "targets": 64},
        with_eos=False,
    )
    prefixes = []
    for e in out:
        length = len(e["inputs"]) + len(e["targets"])
        assert length <= 63 and len(e["targets"]) >= 1
        assert len(e["inputs"]) >= 1 or length == 1  # a 1-token tail segment has no prefix
        if len(e["inputs"]) + len(e["targets"]) == 63:
            prefixes.append(len(e["inputs"]))
    assert len(prefixes) > 200
    assert 25 < np.mean(prefixes) < 37  # uniform on [1, 62]: mean 31.5
    assert min(prefixes) <= 5 and max(prefixes) >= 58


@pytest.mark.parametrize("objective", ["iid_noise_replace_spans", "iid_noise_drop_tokens"])
def test_iid_objectives_noise_density(objective, token_dataset, as_lists, features32100, long_docs):
    out = run(
        getattr(preprocessors, objective),
        long_docs,
        token_dataset,
        as_lists,
        features32100,
        {"inputs": 256, "targets": 256},
        with_eos=False,
        noise_density=0.25,
    )
    if objective == "iid_noise_drop_tokens":
        noise_tokens = sum(len(e["targets"]) for e in out)
        total = noise_tokens + sum(len(e["inputs"]) for e in out)
    else:
        noise_tokens = sum(sum(t < 32000 for t in e["targets"]) for e in out)
        total = sum(sum(t < 32000 for t in e["inputs"] + e["targets"]) for e in out)
    assert total == sum(len(d) for d in long_docs)
    assert abs(noise_tokens / total - 0.25) < 0.01


# -------------------------------------------------------------------------------- bad input


def test_span_corruption_short_targets_error_names_both_numbers(token_dataset, features32100):
    with pytest.raises(ValueError) as error:
        preprocessors.span_corruption(
            token_dataset([[5]]),
            sequence_length={"inputs": 512, "targets": 100},
            output_features=features32100,
        )
    assert "114" in str(error.value) and "100" in str(error.value)


def test_span_corruption_needs_sentinels(token_dataset):
    features = {"targets": seqio.Feature(seqio.PassThroughVocabulary(32000, eos_id=1))}
    with pytest.raises(ValueError, match="extra ids"):
        preprocessors.span_corruption(
            token_dataset([[5]]),
            sequence_length={"inputs": 512, "targets": 114},
            output_features=features,
        )


def test_objectives_need_one_vocabulary(token_dataset, vocab32100):
    features = {
        "inputs": seqio.Feature(seqio.PassThroughVocabulary(100, eos_id=1)),
        "targets": seqio.Feature(vocab32100),
    }
    with pytest.raises(ValueError, match="share one vocabulary"):
        preprocessors.iid_noise_drop_tokens(
            token_dataset([[5]]),
            sequence_length={"inputs": 8, "targets": 8},
            output_features=features,
        )


@pytest.mark.parametrize("rates", [(0.9, 0.2), (-0.1, 0.1), (0.5, 1.5)])
def test_bert_style_rejects_bad_rates(rates, token_dataset, features32100):
    with pytest.raises(ValueError, match="mask_rate"):
        preprocessors.bert_style(
            token_dataset([[5]]),
            sequence_length={"inputs": 8, "targets": 8},
            output_features=features32100,
            mask_rate=rates[0],
            random_rate=rates[1],
        )


def test_sentinel_id_is_last_vocabulary_id(vocab32100):
    assert corruption.sentinel_id(vocab32100) == vocab32100.vocab_size - 1 == 32099


def test_too_many_spans_for_the_sentinels_is_an_error(token_dataset, as_lists, vocab32100):
    # i.i.d. noise at density 0.5 over 511 tokens makes ~128 spans, more than 100 sentinels.
    features = {"inputs": seqio.Feature(vocab32100), "targets": seqio.Feature(vocab32100)}
    docs = [list(range(3, 1000))]
    with pytest.raises(tf.errors.InvalidArgumentError, match="more noise spans"):
        run(
            preprocessors.iid_noise_replace_spans,
            docs,
            token_dataset,
            as_lists,
            features,
            {"inputs": 512, "targets": 512},
            with_eos=False,
            noise_density=0.5,
        )
