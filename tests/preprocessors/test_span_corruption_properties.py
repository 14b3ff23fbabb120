"""Properties of span corruption over random documents and lengths (docs/spec.md section 4)."""

import numpy as np
import pytest
import seqio
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

import preprocessors

# Shrinking re-runs TensorFlow pipelines for minutes; a failing example is reported as drawn.
NO_SHRINK = (Phase.explicit, Phase.reuse, Phase.generate)
VOCAB_SIZE = 32100
FIRST_SENTINEL = VOCAB_SIZE - 1


def _sentinels(tokens):
    return [t for t in tokens if t >= VOCAB_SIZE - 100]


def _reconstruct(inputs, targets):
    """The raw segment: each input sentinel i replaced by the noise tokens after sentinel i."""
    noise_spans, current = {}, None
    for t in targets:
        if t >= VOCAB_SIZE - 100:
            current = t
            noise_spans[current] = []
        else:
            noise_spans[current].append(t)
    out = []
    for t in inputs:
        out.extend(noise_spans[t] if t >= VOCAB_SIZE - 100 else [t])
    return out


def _span_corruption(docs, lengths, seed, token_dataset, as_lists, features, **knobs):
    with seqio.map_seed_manager(seed):
        ds = preprocessors.span_corruption(
            token_dataset(docs), sequence_length=lengths, output_features=features, **knobs
        )
    return as_lists(ds)


@settings(
    max_examples=8,
    deadline=None,
    phases=NO_SHRINK,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    docs=st.lists(st.lists(st.integers(3, 999), max_size=300), min_size=1, max_size=12),
    inputs_length=st.integers(8, 128),
    noise_density=st.sampled_from([0.1, 0.15, 0.25, 0.5]),
    mean_span=st.sampled_from([2.0, 3.0, 5.0, 10.0]),
    seed=st.integers(0, 1000),
)
def test_span_corruption_properties(
    docs, inputs_length, noise_density, mean_span, seed, token_dataset, as_lists, features32100
):
    assume(any(docs))
    raw_length, targets_length = preprocessors.random_spans_helper(
        inputs_length, noise_density, mean_span
    )
    out = _span_corruption(
        docs,
        {"inputs": inputs_length, "targets": targets_length},
        seed,
        token_dataset,
        as_lists,
        features32100,
        noise_density=noise_density,
        mean_noise_span_length=mean_span,
    )
    segments = []
    for e in out:
        inputs, targets = e["inputs"], e["targets"]
        segment = _reconstruct(inputs, targets)
        segments.append(segment)
        n = len(segment)
        # Outputs never exceed the requested lengths (one token is left for EOS).
        assert len(inputs) <= inputs_length - 1 and len(targets) <= targets_length - 1
        # Sentinel counts agree and count down from <extra_id_0>.
        assert _sentinels(inputs) == _sentinels(targets)
        num_spans = len(_sentinels(inputs))
        assert _sentinels(inputs) == list(range(FIRST_SENTINEL, FIRST_SENTINEL - num_spans, -1))
        # The noise fraction and the span count follow the formulas exactly.
        num_noise = len(targets) - num_spans
        if n >= 2:
            expected_noise = min(max(round(n * noise_density), 1), n - 1)
            assert num_noise == expected_noise
            assert num_spans == min(max(round(expected_noise / mean_span), 1), n - expected_noise)
        assert n >= 2  # 1-token tails are dropped
        # Full segments fill the inputs and the targets exactly, except at density 0.5: there
        # the helper (as the t5 package's) takes one raw token off when the targets would be
        # longer than the inputs, which can leave each of them one token short.
        if n == raw_length:
            slack = 1 if noise_density == 0.5 else 0
            assert inputs_length - slack <= len(inputs) + 1 <= inputs_length
            assert targets_length - slack <= len(targets) + 1 <= targets_length
        assert n <= raw_length
    # Nothing lost or reordered: the segments are the documents, concatenated (a 1-token tail of
    # the stream is dropped).
    stream = sum(docs, [])
    if len(stream) % raw_length == 1:
        stream = stream[:-1]
    assert sum(segments, []) == stream


@pytest.fixture(scope="module")
def docs():
    rng = np.random.default_rng(1)
    return [rng.integers(3, 30000, size=int(n)).tolist() for n in rng.integers(1, 700, size=40)]


def test_same_seed_same_output_other_seed_other_output(
    docs, token_dataset, as_lists, features32100
):
    lengths = {"inputs": 128, "targets": 32}
    first = _span_corruption(docs, lengths, 7, token_dataset, as_lists, features32100)
    again = _span_corruption(docs, lengths, 7, token_dataset, as_lists, features32100)
    other = _span_corruption(docs, lengths, 8, token_dataset, as_lists, features32100)
    assert first == again
    assert first != other
    assert [len(e["inputs"]) for e in first] == [len(e["inputs"]) for e in other]


def test_default_lengths_512_114(docs, token_dataset, as_lists, features32100):
    out = _span_corruption(
        docs, {"inputs": 512, "targets": 114}, 3, token_dataset, as_lists, features32100
    )
    full = [e for e in out if len(_reconstruct(e["inputs"], e["targets"])) == 568]
    assert len(full) == len(out) - 1  # 40 documents make one group; only its tail is short
    for e in full:
        assert (len(e["inputs"]), len(e["targets"]), len(_sentinels(e["inputs"]))) == (511, 113, 28)


def test_unconcatenated_documents_split_on_their_own(docs, token_dataset, as_lists, features32100):
    out = _span_corruption(
        docs,
        {"inputs": 512, "targets": 114},
        3,
        token_dataset,
        as_lists,
        features32100,
        concatenate_documents=False,
    )
    lengths = [len(_reconstruct(e["inputs"], e["targets"])) for e in out]
    expected = []
    for d in docs:
        expected += [568] * (len(d) // 568) + ([len(d) % 568] if len(d) % 568 > 1 else [])
    assert lengths == expected
