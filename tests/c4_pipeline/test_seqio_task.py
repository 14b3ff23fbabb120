"""The pipeline's output feeds a span-corruption seqio task and yields a packed batch.

The span-corruption objective is the task's default, `preprocessors.span_corruption`. The task's
plumbing (source, tokenization, EOS, packing) is also checked with a stand-in objective whose
output is known exactly.
"""

import numpy as np
import pytest
import sentencepiece as spm
import seqio
import tensorflow as tf

from t2t.data.tasks import c4_pipeline as c4_tasks

LENGTHS = {"inputs": 64, "targets": 16}
PACKED_FEATURES = sorted(
    [
        "encoder_input_tokens",
        "encoder_segment_ids",
        "encoder_positions",
        "decoder_target_tokens",
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_segment_ids",
        "decoder_positions",
    ]
)


def _surviving_texts(out):
    spec = {"text": tf.io.FixedLenFeature([], tf.string)}
    files = tf.io.gfile.glob(f"{out}/c4-train.tfrecord-*")
    return [
        tf.io.parse_single_example(r, spec)["text"].numpy().decode()
        for r in tf.data.TFRecordDataset(files)
    ]


@pytest.fixture(scope="module")
def vocabulary(wet_corpus, tmp_path_factory):
    fx = wet_corpus
    # A tiny SentencePiece model trained on the fixture's English text, with T5's special ids.
    corpus = tmp_path_factory.mktemp("spm") / "corpus.txt"
    corpus.write_text("\n".join(p.text for p in (fx.FARM, fx.BAKERY, fx.RUDE, fx.CODE)))
    prefix = str(corpus.parent / "tiny")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=prefix,
        vocab_size=120,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        hard_vocab_limit=False,
        num_threads=1,
        minloglevel=2,
    )
    return seqio.SentencePieceVocabulary(prefix + ".model", extra_ids=100)


@pytest.fixture(scope="module")
def task(c4_run, vocabulary):
    _, out = c4_run
    name = "c4_pipeline_test_span_corruption"
    registered = c4_tasks.register_c4_pipeline_task(name, str(out), vocabulary)
    yield registered, vocabulary, _surviving_texts(out)
    seqio.TaskRegistry.remove(name)


def _first_tokens_as_inputs(dataset, sequence_length, output_features):
    """Stand-in objective: 12 tokens of the text become inputs, the next 6 targets."""
    del sequence_length, output_features
    return dataset.map(lambda ex: {"inputs": ex["targets"][:12], "targets": ex["targets"][12:18]})


def test_task_plumbing_with_a_stand_in_objective(c4_run, vocabulary):
    _, out = c4_run
    name = "c4_pipeline_test_stand_in"
    registered = c4_tasks.register_c4_pipeline_task(
        name, str(out), vocabulary, objective=_first_tokens_as_inputs
    )
    try:
        lengths = {"inputs": 32, "targets": 16}
        examples = list(
            registered.get_dataset(lengths, split="train", shuffle=False).as_numpy_iterator()
        )
        documents = sorted(vocabulary.encode(t)[:18] for t in _surviving_texts(out))
        assert (
            sorted(list(ex["inputs"][:-1]) + list(ex["targets"][:-1]) for ex in examples)
            == documents
        )
        assert all(ex["inputs"][-1] == 1 and ex["targets"][-1] == 1 for ex in examples)
        dataset = registered.get_dataset(lengths, split="train", shuffle=False)
        batch = next(
            seqio.EncDecFeatureConverter(pack=True)(dataset, lengths).batch(1).as_numpy_iterator()
        )
        assert sorted(batch) == PACKED_FEATURES
        # Both documents' examples (13 + 13 input tokens, 7 + 7 target tokens) share one row.
        np.testing.assert_array_equal(
            batch["encoder_segment_ids"][0], [1] * 13 + [2] * 13 + [0] * 6
        )
        np.testing.assert_array_equal(batch["decoder_segment_ids"][0], [1] * 7 + [2] * 7 + [0] * 2)
    finally:
        seqio.TaskRegistry.remove(name)


def test_missing_shards_and_duplicate_names_are_refused(c4_run, vocabulary, tmp_path):
    with pytest.raises(ValueError, match="python -m c4_pipeline"):
        c4_tasks.register_c4_pipeline_task("c4_pipeline_test_empty", str(tmp_path), vocabulary)
    _, out = c4_run
    name = "c4_pipeline_test_twice"
    c4_tasks.register_c4_pipeline_task(
        name, str(out), vocabulary, objective=_first_tokens_as_inputs
    )
    try:
        with pytest.raises(ValueError, match="already registered"):
            c4_tasks.register_c4_pipeline_task(name, str(out), vocabulary)
    finally:
        seqio.TaskRegistry.remove(name)


def _contains(haystack, needle):
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def test_examples_are_span_corrupted_surviving_text(task):
    registered, vocabulary, texts = task
    assert set(registered.splits) == {"train"}  # The pipeline wrote no validation split.
    documents = [vocabulary.encode(t) for t in texts]
    assert len(documents) == 2
    dataset = registered.get_dataset(LENGTHS, split="train", shuffle=False, seed=0)
    examples = list(dataset.as_numpy_iterator())
    assert examples
    first_sentinel = vocabulary.vocab_size - 1
    for ex in examples:
        inputs, targets = list(ex["inputs"]), list(ex["targets"])
        assert inputs[-1] == 1 and targets[-1] == 1  # EOS after the objective
        assert first_sentinel in inputs and targets[0] == first_sentinel
        # Put every target span back after its sentinel: the original tokens come back.
        spans, current = {}, None
        for token in targets[:-1]:
            if token >= vocabulary.vocab_size - 100:
                current = token
                spans[current] = []
            else:
                spans[current].append(token)
        restored = []
        for token in inputs[:-1]:
            restored += spans[token] if token in spans else [token]
        assert any(_contains(a + b, restored) for a in documents for b in documents if a is not b)


def _check_packed_rows(batch):
    """Packing invariants: positions restart and decoder inputs shift within each segment."""
    for row in range(batch["encoder_input_tokens"].shape[0]):
        for prefix in ("encoder", "decoder"):
            segments, positions = (
                batch[f"{prefix}_segment_ids"][row],
                batch[f"{prefix}_positions"][row],
            )
            for segment in set(segments[segments > 0]):
                in_segment = segments == segment
                np.testing.assert_array_equal(positions[in_segment], np.arange(in_segment.sum()))
        targets, inputs = batch["decoder_target_tokens"][row], batch["decoder_input_tokens"][row]
        segments = batch["decoder_segment_ids"][row]
        for segment in set(segments[segments > 0]):
            in_segment = segments == segment
            np.testing.assert_array_equal(
                inputs[in_segment], np.concatenate([[0], targets[in_segment][:-1]])
            )
    np.testing.assert_array_equal(
        batch["decoder_loss_weights"], (batch["decoder_target_tokens"] > 0).astype(np.int32)
    )


def test_packed_batch(task):
    registered, _, _ = task
    dataset = registered.get_dataset(LENGTHS, split="train", shuffle=False, seed=0)
    examples = list(dataset.as_numpy_iterator())
    packed = seqio.EncDecFeatureConverter(pack=True)(dataset, LENGTHS)
    batch = next(packed.batch(2).as_numpy_iterator())
    assert sorted(batch) == PACKED_FEATURES
    assert batch["encoder_input_tokens"].shape == (2, 64)
    assert batch["decoder_target_tokens"].shape == (2, 16)
    # Concatenated documents are cut so that inputs fill a row exactly (EOS included).
    assert (batch["encoder_segment_ids"][0] == 1).all()
    _check_packed_rows(batch)
    # Packing loses no token and no example.
    rows = next(packed.batch(len(examples)).as_numpy_iterator())
    assert (rows["encoder_segment_ids"] > 0).sum() == sum(len(ex["inputs"]) for ex in examples)
    assert (rows["decoder_segment_ids"] > 0).sum() == sum(len(ex["targets"]) for ex in examples)
    segments = sum(len(set(row[row > 0])) for row in rows["encoder_segment_ids"])
    assert segments == len(examples)
