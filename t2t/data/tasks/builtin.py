"""Tasks on the built-in corpus (Python's own documentation): pretrain, fine-tune, evaluate offline.

Importing this module builds the corpus and its vocabulary into the cache on first use (about
10 s, see `t2t.data.builtin.cache`) and registers:
  - `builtin_<objective>` for every objective of `text.OBJECTIVES` (`builtin_span_corruption`
    is the T5 default), on the prose documents;
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

import seqio
import tensorflow as tf

from t2t import metrics
from t2t.data import mixtures, vocab
from t2t.data.builtin import benchmark, cache
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
SUITE = ("builtin_order", "builtin_next", "builtin_next_in_document", "builtin_similarity",
         "builtin_package", "builtin_summarize")
# Multi-task mixtures of span corruption and the suite, for the paper's mixing comparisons
# (Table 11) at this corpus's scale: the tasks have 800-8,000 training examples (span
# corruption ~2,600 at the demo's lengths), so K spans 2^10 .. 2^14 instead of 2^16 .. 2^21.
MIXING_K = (2**10, 2**12, 2**14)
MIXING_TEMPERATURES = (2, 4, 8)  # with K = 2^14
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


def register_benchmark(corpus: cache.BuiltinCorpus, vocabulary: seqio.Vocabulary) -> list[str]:
    """Registers the benchmark's tasks (`BENCHMARK_TASKS`); returns their names."""
    from preprocessors import postprocessors

    built = benchmark.stats(corpus)
    for name, (task, metric_fns) in BENCHMARK_TASKS.items():
        fields = benchmark.FIELDS[task]
        labels = benchmark.LABELS.get(task)
        postprocess = (functools.partial(postprocessors.string_label_to_class_id,
                                         label_classes=labels) if labels
                       else postprocessors.string_to_float)
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name,
            source=seqio.TextLineDataSource(
                {split: benchmark.task_path(corpus.directory, task, split)
                 for split in cache.SPLITS},
                num_input_examples={split: built[f"{task}_{split}"]["examples"]
                                    for split in cache.SPLITS}),
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
    names = (register_pretraining(corpus, vocabulary) + register_supervised(corpus, vocabulary)
             + register_benchmark(corpus, vocabulary))
    multitask = ("builtin_span_corruption", *SUPERVISED_TASKS)
    mixture_tasks = {"builtin_supervised": SUPERVISED_TASKS, "builtin_multitask": multitask,
                     "builtin_glue": SUITE}
    for left_out in SUPERVISED_TASKS:
        name = f"builtin_leave_one_out_{left_out[len('builtin_'):]}"
        mixture_tasks[name] = tuple(t for t in multitask if t != left_out)
    for name, tasks in mixture_tasks.items():
        seqio.MixtureRegistry.remove(name)
        seqio.MixtureRegistry.add(name, list(tasks), default_rate=mixtures.examples_proportional())
    return names + list(mixture_tasks) + _register_mixing()


def _register_mixing() -> list[str]:
    """`builtin_glue_mt_equal`, `_k<K>` (examples-proportional) and `_t<T>` (temperature):
    span corruption and the suite; `builtin_glue_supervised` and `builtin_glue_mt_without_<task>`
    at K = 2^12."""
    tasks = ["builtin_span_corruption", *SUITE]
    rates = {"builtin_glue_mt_equal": 1.0}
    for k in MIXING_K:
        rates[f"builtin_glue_mt_k{k}"] = mixtures.examples_proportional(k)
    for t in MIXING_TEMPERATURES:
        rates[f"builtin_glue_mt_t{t}"] = mixtures.examples_proportional(MIXING_K[-1],
                                                                         temperature=t)
    mixture_tasks = {name: tasks for name in rates}
    # Table 12: supervised multi-task pre-training (no span corruption), and leave-one-out.
    middle = mixtures.examples_proportional(MIXING_K[1])
    rates["builtin_glue_supervised"] = middle
    mixture_tasks["builtin_glue_supervised"] = list(SUITE)
    for left_out in SUITE:
        name = f"builtin_glue_mt_without_{left_out}"
        rates[name] = middle
        mixture_tasks[name] = [t for t in tasks if t != left_out]
    for name, rate in rates.items():
        seqio.MixtureRegistry.remove(name)
        seqio.MixtureRegistry.add(name, mixture_tasks[name], default_rate=rate)
    return list(rates)


TASKS = register()
