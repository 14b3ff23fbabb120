"""Tasks on the built-in corpus (Python's own documentation): pretrain, fine-tune, evaluate offline.

Importing this module builds the corpus and its vocabulary into the cache on first use (about
10 s, see `t2t.data.builtin.cache`) and registers:
  - `builtin_<objective>` for every objective of `text.OBJECTIVES` (`builtin_span_corruption`
    is the T5 default), on the prose documents;
  - `builtin_summarize`: a docstring's body -> its one-line summary (ROUGE), the offline
    stand-in for CNN/Daily Mail;
  - `builtin_package`: a docstring -> the top-level standard-library package it belongs to
    (accuracy), the offline stand-in for a GLUE-style classification task;
  - mixtures `builtin_supervised` (the two supervised tasks) and `builtin_multitask` (those and
    span corruption), examples-proportional, for offline multi-task runs, and for each
    supervised task `builtin_leave_one_out_<task>`: `builtin_multitask` without it (the
    paper's leave-one-out training, Table 12).
"""

from __future__ import annotations

import functools

import seqio
import tensorflow as tf

from t2t import metrics
from t2t.data import mixtures, vocab
from t2t.data.builtin import cache
from t2t.data.tasks import text

SUPERVISED_TASKS = ("builtin_summarize", "builtin_package")
MIXTURES = ("builtin_supervised", "builtin_multitask")


@seqio.map_over_dataset
def format_summarize(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """{"body", "summary"} -> inputs "summarize: <body>", targets "<summary>"."""
    return {"inputs": tf.strings.join(["summarize: ", example["body"]]), "targets": example["summary"]}


@seqio.map_over_dataset
def format_package(example: dict[str, tf.Tensor]) -> dict[str, tf.Tensor]:
    """{"docstring", "package"} -> inputs "package docstring: <text>", targets "<package>"."""
    inputs = tf.strings.join(["package docstring: ", example["docstring"]])
    return {"inputs": inputs, "targets": example["package"]}


def _counts(corpus: cache.BuiltinCorpus, key: str, field: str) -> dict[str, int]:
    return {split: corpus.stats[f"{key}_{split}"][field] for split in cache.SPLITS}


def _register_supervised(name, paths, counts, fields, formatter, metric_fns, vocabulary):
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource(paths, num_input_examples=counts),
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


def register_supervised(corpus: cache.BuiltinCorpus, vocabulary: seqio.Vocabulary) -> list[str]:
    """Registers `builtin_summarize` and `builtin_package`; returns their names."""
    _register_supervised(
        "builtin_summarize",
        {split: corpus.summarize_path(split) for split in cache.SPLITS},
        _counts(corpus, "summarize", "examples"),
        ("body", "summary"),
        format_summarize,
        [metrics.rouge],
        vocabulary,
    )
    _register_supervised(
        "builtin_package",
        {split: corpus.package_path(split) for split in cache.SPLITS},
        _counts(corpus, "package", "examples"),
        ("docstring", "package"),
        format_package,
        [metrics.accuracy],
        vocabulary,
    )
    return list(SUPERVISED_TASKS)


def register_pretraining(
    corpus: cache.BuiltinCorpus, vocabulary: seqio.Vocabulary, objectives=text.OBJECTIVES
) -> list[str]:
    """Registers `builtin_<objective>` for each objective; returns the names."""
    source = seqio.TextLineDataSource(
        {split: corpus.corpus_path(split) for split in cache.SPLITS},
        num_input_examples=_counts(corpus, "corpus", "documents"),
    )
    names = []
    for objective in objectives:
        name = f"builtin_{objective}"
        text.register_pretraining_task(
            name, source, objective, vocabulary, source_preprocessors=[text.line_to_text]
        )
        names.append(name)
    return names


def register(cache_dir: str | None = None) -> list[str]:
    """Builds (if needed) the corpus under `cache_dir` and registers every built-in task."""
    corpus = cache.get_or_build(cache_dir)
    vocabulary = vocab.load_vocabulary(corpus.vocabulary_path)
    names = register_pretraining(corpus, vocabulary) + register_supervised(corpus, vocabulary)
    multitask = ("builtin_span_corruption", *SUPERVISED_TASKS)
    mixture_tasks = {"builtin_supervised": SUPERVISED_TASKS, "builtin_multitask": multitask}
    for left_out in SUPERVISED_TASKS:
        name = f"builtin_leave_one_out_{left_out[len('builtin_'):]}"
        mixture_tasks[name] = tuple(t for t in multitask if t != left_out)
    for name, tasks in mixture_tasks.items():
        seqio.MixtureRegistry.remove(name)
        seqio.MixtureRegistry.add(name, list(tasks), default_rate=mixtures.examples_proportional())
    return names + list(mixture_tasks)


TASKS = register()
