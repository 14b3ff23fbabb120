"""Tasks on the built-in corpus (Python's own documentation): pretrain, fine-tune, evaluate offline.

Importing this module registers the tasks below and reads nothing. The corpus, its vocabulary and
its benchmark are built into the cache (about 10 s, see `t2t.data.builtin.cache`) the first time
a task is read or counted, or its vocabulary used; later runs find them there. Registers:
  - `builtin_<objective>` for every objective of `text.OBJECTIVES` (`builtin_span_corruption`
    is the T5 default), on the prose documents;
  - `builtin_unfiltered_span_corruption`: span corruption on the same sources without the
    prose filter (`t2t.data.builtin.unfiltered`), the counterpart of the paper's unfiltered C4
    (Table 8);
  - `builtin_summarize`: a docstring's body -> its one-line summary (ROUGE), the offline
    stand-in for CNN/Daily Mail;
  - `builtin_package`: a docstring -> the top-level standard-library package it belongs to
    (accuracy), the offline stand-in for a GLUE-style classification task;
  - the GLUE-shaped benchmark (`t2t.data.builtin.benchmark`): `builtin_order` (acceptability),
    `builtin_next` (a large sentence-pair task), `builtin_next_in_document` (a small related one,
    800 training examples), `builtin_similarity` (regression, Pearson/Spearman), and the
    mixture `builtin_glue` of those with `builtin_package` and `builtin_summarize`; and that
    suite with span corruption under the paper's mixing strategies, `builtin_glue_mt_equal`,
    `builtin_glue_mt_k<K>` and `builtin_glue_mt_t<T>`, the suite alone
    (`builtin_glue_supervised`) and without each task
    (`builtin_glue_mt_without_builtin_<task>`);
  - mixtures `builtin_supervised` (the two supervised tasks) and `builtin_multitask` (those and
    span corruption), examples-proportional, for offline multi-task runs, and for each
    supervised task `builtin_leave_one_out_<task>`: `builtin_multitask` without it (the
    paper's leave-one-out training, Table 12).
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping

import seqio
import tensorflow as tf

from t2t import metrics
from t2t.data import mixing, registry, vocab
from t2t.data.builtin import benchmark, cache, unfiltered
from t2t.data.tasks import text

SUPERVISED_TASKS = ("builtin_summarize", "builtin_package")
# The GLUE-shaped benchmark (`t2t.data.builtin.benchmark`): task -> (input prefix, metrics).
BENCHMARK_TASKS = {
    "builtin_order": ("order", [metrics.accuracy, metrics.matthews_corrcoef]),
    "builtin_next": ("next", [metrics.accuracy]),
    "builtin_next_in_document": ("next_in_document", [metrics.accuracy]),
    "builtin_similarity": ("similarity", [metrics.pearson_and_spearman]),
}
# The suite `builtin_glue` averages (GLUE's way: each task's metrics first, then the tasks).
SUITE = (
    "builtin_order",
    "builtin_next",
    "builtin_next_in_document",
    "builtin_similarity",
    "builtin_package",
    "builtin_summarize",
)
# Multi-task mixtures of span corruption and the suite, for the paper's mixing comparisons
# (Table 11) at this corpus's scale: the tasks have 800-8,000 training examples (span
# corruption ~2,600 at the demo's lengths), so K spans 2^10 .. 2^14 instead of 2^16 .. 2^21.
MIXING_K = (2**10, 2**12, 2**14)
MIXING_TEMPERATURES = (2, 4, 8)  # with K = 2^14
MIXTURES = ("builtin_supervised", "builtin_multitask")


@seqio.map_over_dataset
def format_summarize(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """{"body", "summary"} -> inputs "summarize: <body>", targets "<summary>"."""
    return {
        "inputs": tf.strings.join(["summarize: ", example["body"]]),
        "targets": example["summary"],
    }


@seqio.map_over_dataset
def format_package(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """{"docstring", "package"} -> inputs "package docstring: <text>", targets "<package>"."""
    inputs = tf.strings.join(["package docstring: ", example["docstring"]])
    return {"inputs": inputs, "targets": example["package"]}


def _built(root: str) -> cache.BuiltinCorpus:
    """The corpus under cache root `root`, built first if it is not there (once per cache)."""
    if not os.path.exists(
        os.path.join(cache.corpus_directory(root), "stats.json")
    ):  # local path: corpus cache
        print(
            f"Building the built-in corpus and its vocabulary under {root} (once, about 10 s; "
            "`t2t cache` builds it ahead of time).",
            file=sys.stderr,
            flush=True,
        )
    return cache.get_or_build(root)


def _corpus_counts(root: str, key: str, field: str) -> dict[str, int]:
    stats = _built(root).stats
    return {split: stats[f"{key}_{split}"][field] for split in cache.SPLITS}


def _unfiltered_counts(root: str) -> dict[str, int]:
    stats = unfiltered.stats(_built(root))
    return {split: stats[f"corpus_{split}"]["documents"] for split in cache.SPLITS}


def _benchmark_counts(root: str, task: str) -> dict[str, int]:
    stats = benchmark.stats(_built(root))
    return {split: stats[f"{task}_{split}"]["examples"] for split in cache.SPLITS}


class BuiltOnUse(seqio.TextLineDataSource):
    """Text lines of files the built-in corpus makes; the files are built the first time the
    source is read, listed or counted, not when its task is registered.

    Args:
      paths: split -> file (where the build writes it).
      counts: returns split -> number of lines, building the files first if needed (a picklable
        callable: seqio's Beam caching ships sources to workers).
    """

    def __init__(self, paths: Mapping[str, str], counts):
        super().__init__(dict(paths))
        self._counts = counts

    def num_input_examples(self, split: str) -> int:
        return self._counts()[split]

    def list_shards(self, split: str):
        self._counts()
        return super().list_shards(split)


class CorpusVocabulary(seqio.SentencePieceVocabulary):
    """The built-in corpus's SentencePiece model: its file is built when first read."""

    def __init__(self, root: str, extra_ids: int = vocab.NUM_SENTINELS):
        self._root = root
        super().__init__(
            cache.BuiltinCorpus(cache.corpus_directory(root)).vocabulary_path, extra_ids=extra_ids
        )

    @property
    def _sentencepiece_model_file(self) -> str:
        return _built(self._root).vocabulary_path

    @_sentencepiece_model_file.setter
    def _sentencepiece_model_file(self, value: str) -> None:
        del value  # decided by the cache root, above


def _register_supervised(name, paths, counts, fields, formatter, metric_fns, vocabulary):
    registry.add_task(
        name,
        __name__,
        source=BuiltOnUse(paths, counts),
        preprocessors=[
            functools.partial(text.parse_tsv, field_names=fields),
            formatter,
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(vocabulary),
        metric_fns=metric_fns,
    )


def register_supervised(root: str, vocabulary: seqio.Vocabulary) -> list[str]:
    """Registers `builtin_summarize` and `builtin_package`; returns their names."""
    corpus = cache.BuiltinCorpus(cache.corpus_directory(root))  # paths only: nothing is read
    _register_supervised(
        "builtin_summarize",
        {split: corpus.summarize_path(split) for split in cache.SPLITS},
        functools.partial(_corpus_counts, root, "summarize", "examples"),
        ("body", "summary"),
        format_summarize,
        [metrics.rouge],
        vocabulary,
    )
    _register_supervised(
        "builtin_package",
        {split: corpus.package_path(split) for split in cache.SPLITS},
        functools.partial(_corpus_counts, root, "package", "examples"),
        ("docstring", "package"),
        format_package,
        [metrics.accuracy],
        vocabulary,
    )
    return list(SUPERVISED_TASKS)


def _format_benchmark(prefix: str, fields: tuple[str, ...]):
    """TSV fields -> inputs "<prefix> sentence1: <a> sentence2: <b>" (GLUE's text format),
    targets the label."""

    @seqio.map_over_dataset
    def format_example(example):
        parts = [prefix]
        for field in fields:
            parts += [f" {field}: ", example[field]]
        return {"inputs": tf.strings.join(parts), "targets": example["label"]}

    return format_example


def register_benchmark(root: str, vocabulary: seqio.Vocabulary) -> list[str]:
    """Registers the benchmark's tasks (`BENCHMARK_TASKS`); returns their names."""
    from preprocessors import postprocessors

    directory = cache.corpus_directory(root)
    for name, (task, metric_fns) in BENCHMARK_TASKS.items():
        fields = benchmark.FIELDS[task]
        labels = benchmark.LABELS.get(task)
        postprocess = (
            functools.partial(postprocessors.string_label_to_class_id, label_classes=labels)
            if labels
            else postprocessors.string_to_float
        )
        registry.add_task(
            name,
            __name__,
            source=BuiltOnUse(
                {split: benchmark.task_path(directory, task, split) for split in cache.SPLITS},
                functools.partial(_benchmark_counts, root, task),
            ),
            preprocessors=[
                functools.partial(text.parse_tsv, field_names=(*fields, "label")),
                _format_benchmark(task, fields),
                seqio.preprocessors.tokenize,
                seqio.CacheDatasetPlaceholder(),
                seqio.preprocessors.append_eos_after_trim,
            ],
            output_features=text.output_features(vocabulary),
            postprocess_fn=postprocess,
            metric_fns=metric_fns,
        )
    return list(BENCHMARK_TASKS)


def register_pretraining(
    root: str, vocabulary: seqio.Vocabulary, objectives=text.OBJECTIVES
) -> list[str]:
    """Registers `builtin_<objective>` for each objective, and span corruption on the unfiltered
    corpus; returns the names."""
    corpus = cache.BuiltinCorpus(cache.corpus_directory(root))  # paths only: nothing is read
    source = BuiltOnUse(
        {split: corpus.corpus_path(split) for split in cache.SPLITS},
        functools.partial(_corpus_counts, root, "corpus", "documents"),
    )
    names = []
    for objective in objectives:
        name = f"builtin_{objective}"
        text.register_pretraining_task(
            name, source, objective, vocabulary, source_preprocessors=[text.line_to_text]
        )
        names.append(name)
    directory = cache.corpus_directory(root)
    text.register_pretraining_task(
        "builtin_unfiltered_span_corruption",
        BuiltOnUse(
            {split: unfiltered.corpus_path(directory, split) for split in cache.SPLITS},
            functools.partial(_unfiltered_counts, root),
        ),
        "span_corruption",
        vocabulary,
        source_preprocessors=[text.line_to_text],
    )
    return [*names, "builtin_unfiltered_span_corruption"]


def vocabulary(cache_dir: str | None = None) -> seqio.SentencePieceVocabulary:
    """The built-in corpus's SentencePiece vocabulary (1,948 pieces + 100 sentinels = 2,048
    ids, the tiny preset's `vocab_size`), built under `cache_dir` (default `$T2T_CACHE_DIR`)
    the first time it is read, offline: the vocabulary for your own tasks on a machine
    without network, where seqio's default (T5's, on gs://) cannot be read."""
    root = os.path.abspath(cache_dir or cache.cache_root())  # local path: corpus cache
    return CorpusVocabulary(root)


def register(cache_dir: str | None = None) -> list[str]:
    """Registers every built-in task on the corpus under `cache_dir` (default
    `$T2T_CACHE_DIR`, read now); the corpus is built when first used."""
    root = os.path.abspath(cache_dir or cache.cache_root())  # local path: corpus cache
    vocabulary = CorpusVocabulary(root)  # the same as `vocabulary(cache_dir)`
    names = (
        register_pretraining(root, vocabulary)
        + register_supervised(root, vocabulary)
        + register_benchmark(root, vocabulary)
    )
    multitask = ("builtin_span_corruption", *SUPERVISED_TASKS)
    mixture_tasks = {
        "builtin_supervised": SUPERVISED_TASKS,
        "builtin_multitask": multitask,
        "builtin_glue": SUITE,
    }
    for left_out in SUPERVISED_TASKS:
        name = f"builtin_leave_one_out_{left_out[len('builtin_') :]}"
        mixture_tasks[name] = tuple(t for t in multitask if t != left_out)
    for name, tasks in mixture_tasks.items():
        registry.add_mixture(
            name, list(tasks), __name__, default_rate=mixing.examples_proportional()
        )
    return names + list(mixture_tasks) + _register_mixing()


def _register_mixing() -> list[str]:
    """`builtin_glue_mt_equal`, `_k<K>` (examples-proportional) and `_t<T>` (temperature):
    span corruption and the suite; `builtin_glue_supervised` and `builtin_glue_mt_without_<task>`
    at K = 2^12."""
    tasks = ["builtin_span_corruption", *SUITE]
    rates = {"builtin_glue_mt_equal": 1.0}
    for k in MIXING_K:
        rates[f"builtin_glue_mt_k{k}"] = mixing.examples_proportional(k)
    for t in MIXING_TEMPERATURES:
        rates[f"builtin_glue_mt_t{t}"] = mixing.examples_proportional(MIXING_K[-1], temperature=t)
    mixture_tasks = {name: tasks for name in rates}
    # Table 12: supervised multi-task pre-training (no span corruption), and leave-one-out.
    middle = mixing.examples_proportional(MIXING_K[1])
    rates["builtin_glue_supervised"] = middle
    mixture_tasks["builtin_glue_supervised"] = list(SUITE)
    for left_out in SUITE:
        name = f"builtin_glue_mt_without_{left_out}"
        rates[name] = middle
        mixture_tasks[name] = [t for t in tasks if t != left_out]
    for name, rate in rates.items():
        registry.add_mixture(name, mixture_tasks[name], __name__, default_rate=rate)
    return list(rates)


TASKS = register()
