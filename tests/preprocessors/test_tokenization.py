"""Batched tokenization equals seqio's tokenize; objectives run inside a seqio Task end to end."""

import functools
import pydoc_data.topics

import numpy as np
import pytest
import sentencepiece as spm
import seqio
import tensorflow as tf

import preprocessors

TEXTS = [
    "Thank you for inviting me to your party last week.",
    "",
    "Ünïcödé — “quotes” and emoji 🙂 survive.",
    "  leading and trailing spaces  ",
]


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    """A small SentencePiece unigram model trained on the interpreter's pydoc topics."""
    directory = tmp_path_factory.mktemp("spm")
    corpus = directory / "corpus.txt"
    corpus.write_text("\n".join(" ".join(t.split()) for t in pydoc_data.topics.topics.values()))
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(directory / "spm"),
        vocab_size=500,
        model_type="unigram",
        pad_id=0,
        eos_id=1,
        unk_id=2,
        bos_id=-1,
        minloglevel=2,
    )
    return seqio.SentencePieceVocabulary(str(directory / "spm.model"), extra_ids=100)


def _examples(dataset):
    return [
        {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in ex.items()}
        for ex in dataset.as_numpy_iterator()
    ]


@pytest.mark.parametrize("copy_pretokenized", [True, False])
def test_tokenize_equals_seqio_tokenize(vocabulary, copy_pretokenized):
    features = {"inputs": seqio.Feature(vocabulary), "targets": seqio.Feature(vocabulary)}
    records = tf.data.Dataset.from_tensor_slices(
        {"inputs": TEXTS, "targets": TEXTS[::-1], "idx": np.arange(4, dtype=np.int32)}
    )
    ours = preprocessors.tokenize(
        records, output_features=features, copy_pretokenized=copy_pretokenized, batch_size=3
    )
    reference = seqio.preprocessors.tokenize(
        records, output_features=features, copy_pretokenized=copy_pretokenized
    )
    assert _examples(ours) == _examples(reference)
    assert ours.element_spec["targets"].dtype == tf.int32


def test_tokenize_with_variable_length_features_takes_the_ragged_path(vocabulary):
    features = {"targets": seqio.Feature(vocabulary)}
    records = tf.data.Dataset.from_generator(
        lambda: iter([{"targets": t, "extra": list(range(i))} for i, t in enumerate(TEXTS)]),
        output_signature={
            "targets": tf.TensorSpec([], tf.string),
            "extra": tf.TensorSpec([None], tf.int32),
        },
    )
    ours = _examples(preprocessors.tokenize(records, output_features=features))
    reference = _examples(seqio.preprocessors.tokenize(records, output_features=features))
    assert ours == reference


def _span_corruption_task(vocabulary, tokenizer):
    features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    texts = [" ".join(t.split()) for _, t in sorted(pydoc_data.topics.topics.items())[:6]]

    def source(split, shuffle_files, seed=None):
        return tf.data.Dataset.from_tensor_slices({"text": texts})

    return seqio.Task(
        "prep_test_span_corruption",
        source=seqio.FunctionDataSource(source, splits=["train"]),
        preprocessors=[
            functools.partial(
                seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}
            ),
            tokenizer,
            preprocessors.span_corruption,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=features,
    )


def test_span_corruption_task_is_reproducible_and_packs(vocabulary):
    task = _span_corruption_task(vocabulary, preprocessors.tokenize)
    lengths = {"inputs": 64, "targets": 16}

    def examples(seed):
        ds = task.get_dataset(lengths, split="train", shuffle=False, seed=seed, use_cached=False)
        return _examples(ds)

    first, again, other = examples(1), examples(1), examples(2)
    assert first == again and first != other
    assert all(len(e["inputs"]) <= 64 and len(e["targets"]) <= 16 for e in first)
    assert sum(len(e["inputs"]) == 64 for e in first) >= len(first) - 1
    for e in first:
        assert e["inputs"][-1] == 1 and e["targets"][-1] == 1
        sentinels = [t for t in e["inputs"] if t >= vocabulary.vocab_size - 100]
        assert sentinels == [t for t in e["targets"] if t >= vocabulary.vocab_size - 100]

    ds = task.get_dataset(lengths, split="train", shuffle=False, seed=1, use_cached=False)
    packed = seqio.EncDecFeatureConverter(pack=True)(ds, lengths).batch(4)
    batch = next(iter(packed.as_numpy_iterator()))
    assert batch["encoder_input_tokens"].shape == (4, 64)
    assert batch["decoder_target_tokens"].shape == (4, 16)
