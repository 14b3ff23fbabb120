"""The built-in GLUE-shaped benchmark: deterministic files with the documented formats, each
task's examples as seqio makes them, its metric on a known prediction set, and the constant
baseline."""

import numpy as np
import pytest
import seqio

from t2t.data.builtin import benchmark
from t2t.studies import baselines


@pytest.fixture(scope="module")
def corpus(builtin_corpus, builtin_tasks):
    benchmark.get_or_build(builtin_corpus)
    return builtin_corpus


def rows(corpus, task, split):
    with open(benchmark.task_path(corpus.directory, task, split), encoding="utf-8") as f:
        return [line.rstrip("\n").split("\t") for line in f]


def test_sentence_rule_and_word_shuffle_worked_examples():
    document = "Open a file. It returns a file object for the given path name. Ok."
    assert benchmark.sentences(document) == ["It returns a file object for the given path name."]
    import random

    swapped = benchmark.shuffle_words("a b c d e f", random.Random(0))
    assert sorted(swapped.split()) == list("abcdef") and swapped != "a b c d e f"


def test_files_have_the_documented_shapes_and_balanced_labels(corpus):
    stats = benchmark.stats(corpus)
    for task in benchmark.TASKS:
        for split in benchmark.SPLITS:
            found = rows(corpus, task, split)
            assert len(found) == stats[f"{task}_{split}"]["examples"] > 100
            assert all(len(r) == len(benchmark.FIELDS[task]) + 1 for r in found)
            if task in benchmark.LABELS:
                labels = [r[-1] for r in found]
                assert set(labels) == set(benchmark.LABELS[task])
                assert 0.35 < labels.count(labels[0]) / len(labels) < 0.65
    assert stats["next_in_document_train"]["examples"] <= 1000 < stats["next_train"]["examples"]
    scores = [float(r[-1]) for r in rows(corpus, "similarity", "train")]
    assert min(scores) == 0.0 and max(scores) == 5.0
    for sentence, copy, score in rows(corpus, "similarity", "train")[:50]:
        kept = sum(a == b for a, b in zip(sentence.split(), copy.split()))
        # The score is 5 x the share of positions kept, rounded to 0.2 (a replacement may
        # happen to repeat the word it replaces).
        assert kept / len(sentence.split()) * 5 >= float(score) - 0.1 - 1e-6
    # `next` and `next_in_document` join a sentence's beginning to its own ending (`next`) or
    # to the ending of a sentence of another document / of the same document (`other`).
    documents = [line for line in open(corpus.corpus_path("train"), encoding="utf-8")]
    for task in ("next", "next_in_document"):
        for first, second, label in rows(corpus, task, "train")[:60]:
            assert len(first.split()) >= 3 and len(second.split()) >= 3
            with_first = [d for d in documents if first in d]
            joined = any(f"{first} {second}" in d for d in with_first)
            assert joined == (label == "next")
            if label == "other":
                assert any(second in d for d in with_first) == (task == "next_in_document")


@pytest.mark.parametrize(
    "task, prefix",
    [
        ("builtin_order", "order sentence: "),
        ("builtin_next", "next sentence1: "),
        ("builtin_next_in_document", "next_in_document sentence1: "),
        ("builtin_similarity", "similarity sentence1: "),
    ],
)
def test_tasks_format_text_to_text_examples(corpus, task, prefix):
    provider = seqio.get_mixture_or_task(task)
    example = next(
        provider.get_dataset(
            {"inputs": 256, "targets": 8}, split="validation", shuffle=False
        ).as_numpy_iterator()
    )
    inputs = example["inputs_pretokenized"].decode()
    assert inputs.startswith(prefix)
    if task != "builtin_order":
        assert " sentence2: " in inputs
    vocabulary = provider.output_features["targets"].vocabulary
    assert (
        vocabulary.decode(example["targets"].tolist()) == example["targets_pretokenized"].decode()
    )


def test_metrics_on_a_known_prediction_set(corpus):
    order = seqio.get_mixture_or_task("builtin_order")
    post = order.postprocess_fn
    targets = [post(t, is_target=True) for t in ["acceptable", "unacceptable"] * 2]
    predictions = [post(p) for p in ["acceptable", "acceptable", "unacceptable", "maybe"]]
    results = {}
    for fn in order.predict_metric_fns:
        results.update(fn(targets, predictions))
    assert targets == [0, 1, 0, 1] and predictions == [0, 0, 1, -1]
    assert results["accuracy"] == 25.0
    similarity = seqio.get_mixture_or_task("builtin_similarity")
    values = {}
    for fn in similarity.predict_metric_fns:
        values.update(
            fn([1.0, 2.0, 3.0], [similarity.postprocess_fn(p) for p in ["1.2", "2.0", "4.4"]])
        )
    assert values["spearman_corrcoef"] == pytest.approx(100.0)
    assert values["pearson_corrcoef"] == pytest.approx(
        100 * np.corrcoef([1, 2, 3], [1.2, 2.0, 4.4])[0, 1]
    )


def test_constant_baselines(corpus):
    order = baselines.constant_baseline("builtin_order")
    labels = [r[-1] for r in rows(corpus, "order", "validation")]
    majority = max(
        set(r[-1] for r in rows(corpus, "order", "train")),
        key=[r[-1] for r in rows(corpus, "order", "train")].count,
    )
    assert order["accuracy"] == pytest.approx(100 * labels.count(majority) / len(labels))
    assert order["matthews_corrcoef"] == 0.0
    assert baselines.constant_baseline("builtin_similarity") == {
        "pearson_corrcoef": 0.0,
        "spearman_corrcoef": 0.0,
    }
    assert baselines.task_score({"a": 10.0, "b": float("nan")}) == 5.0
