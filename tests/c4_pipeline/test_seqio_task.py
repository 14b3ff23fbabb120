"""The pipeline's output feeds a span-corruption seqio task and yields a packed batch."""

import numpy as np
import pytest
import seqio
import sentencepiece as spm
import tensorflow as tf

from t2t.data.tasks import c4_pipeline as c4_tasks

preprocessors = pytest.importorskip("preprocessors")
if not hasattr(preprocessors, "span_corruption"):
    pytest.skip("preprocessors.span_corruption is not available yet", allow_module_level=True)

LENGTHS = {"inputs": 64, "targets": 16}


def _surviving_texts(out):
    spec = {"text": tf.io.FixedLenFeature([], tf.string)}
    files = tf.io.gfile.glob(f"{out}/c4-train.tfrecord-*")
    return [
        tf.io.parse_single_example(r, spec)["text"].numpy().decode() for r in tf.data.TFRecordDataset(files)
    ]


@pytest.fixture(scope="module")
def task(c4_run, wet_corpus, tmp_path_factory):
    root, out = c4_run
    fx = wet_corpus
    # A tiny SentencePiece model trained on the fixture's English text, with T5's special ids.
    corpus = tmp_path_factory.mktemp("spm") / "corpus.txt"
    corpus.write_text("\n".join(p.text for p in (fx.FARM, fx.BAKERY, fx.RUDE, fx.CODE)))
    prefix = str(corpus.parent / "tiny")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=prefix, vocab_size=120, model_type="unigram",
        pad_id=0, eos_id=1, unk_id=2, bos_id=-1, hard_vocab_limit=False, num_threads=1,
        minloglevel=2,
    )
    vocabulary = seqio.SentencePieceVocabulary(prefix + ".model", extra_ids=100)
    name = "c4_pipeline_test_span_corruption"
    registered = c4_tasks.register_c4_pipeline_task(name, str(out), vocabulary)
    yield registered, vocabulary, _surviving_texts(out)
    seqio.TaskRegistry.remove(name)


def _contains(haystack, needle):
    n = len(needle)
    return any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def test_examples_are_span_corrupted_surviving_text(task):
    registered, vocabulary, texts = task
    assert set(registered.splits) == {"train"}  # The pipeline wrote no validation split.
    documents = [vocabulary.encode(t) for t in texts]
    assert len(documents) == 2
    examples = list(registered.get_dataset(LENGTHS, split="train", shuffle=False, seed=0).as_numpy_iterator())
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


def test_packed_batch(task):
    registered, _, _ = task
    dataset = registered.get_dataset(LENGTHS, split="train", shuffle=False, seed=0)
    packed = seqio.EncDecFeatureConverter(pack=True)(dataset, LENGTHS)
    batch = next(packed.batch(2).as_numpy_iterator())
    assert sorted(batch) == sorted([
        "encoder_input_tokens", "encoder_segment_ids", "encoder_positions",
        "decoder_target_tokens", "decoder_input_tokens", "decoder_loss_weights",
        "decoder_segment_ids", "decoder_positions",
    ])
    assert batch["encoder_input_tokens"].shape == (2, 64)
    assert batch["decoder_target_tokens"].shape == (2, 16)
    assert batch["encoder_segment_ids"].max() >= 2  # at least two examples packed in a row
    np.testing.assert_array_equal(
        batch["decoder_loss_weights"], (batch["decoder_target_tokens"] > 0).astype(np.int32)
    )
