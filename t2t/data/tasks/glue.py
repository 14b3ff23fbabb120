"""GLUE: every sub-task with the paper's text format and metrics, and the concatenated mixture.

Registers `glue_<task>` for cola, sst2, mrpc, qqp, stsb, mnli (train), mnli_matched and
mnli_mismatched (validation/test), qnli, rte, wnli, ax (test only), and the mixture `glue`: the
training sub-tasks mixed in proportion to their sizes (one concatenated task, as the paper
fine-tunes on GLUE), with WNLI and the MNLI evaluation tasks at rate 0 (never trained on,
still evaluated). Text formats and postprocessors come from the `preprocessors` package, metric
functions from `t2t.metrics`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping, Sequence

import seqio

from t2t import metrics
from t2t.data import mixing, registry, vocab
from t2t.data.tasks import text

TFDS_VERSION = "2.0.0"
STANDARD_SPLITS = {"train": "train", "validation": "validation", "test": "test"}


@dataclasses.dataclass(frozen=True)
class ClassificationTask:
    """One GLUE-style sub-task: where its data is and how it is scored.

    Attributes:
      tfds_name: TFDS dataset with config and version (`glue/cola:2.0.0`); its config names the
        text format (`preprocessors.text_preprocessor`).
      metric_fns: seqio metric functions.
      splits: canonical split -> TFDS split.
    """

    tfds_name: str
    metric_fns: tuple[Callable, ...]
    splits: Mapping[str, str] = dataclasses.field(default_factory=lambda: dict(STANDARD_SPLITS))

    @property
    def config(self) -> str:
        """`glue/cola` for `glue/cola:2.0.0`."""
        return self.tfds_name.split(":")[0]


def _glue(config: str, metric_fns, **kwargs) -> ClassificationTask:
    return ClassificationTask(f"glue/{config}:{TFDS_VERSION}", tuple(metric_fns), **kwargs)


MNLI_MATCHED = {"validation": "validation_matched", "test": "test_matched"}
MNLI_MISMATCHED = {"validation": "validation_mismatched", "test": "test_mismatched"}
SUBTASKS = {
    "glue_cola": _glue("cola", [metrics.matthews_corrcoef]),
    "glue_sst2": _glue("sst2", [metrics.accuracy]),
    "glue_mrpc": _glue("mrpc", [metrics.accuracy_and_f1]),
    "glue_qqp": _glue("qqp", [metrics.accuracy_and_f1]),
    "glue_stsb": _glue("stsb", [metrics.pearson_and_spearman]),
    "glue_mnli": _glue("mnli", [metrics.accuracy], splits={"train": "train"}),
    "glue_mnli_matched": _glue("mnli", [metrics.accuracy], splits=MNLI_MATCHED),
    "glue_mnli_mismatched": _glue("mnli", [metrics.accuracy], splits=MNLI_MISMATCHED),
    "glue_qnli": _glue("qnli", [metrics.accuracy]),
    "glue_rte": _glue("rte", [metrics.accuracy]),
    "glue_wnli": _glue("wnli", [metrics.accuracy]),
    # The diagnostic set has only unlabeled test data (scored by the GLUE server).
    "glue_ax": _glue("ax", [], splits={"test": "test"}),
}
TRAIN_TASKS = (
    "glue_cola",
    "glue_sst2",
    "glue_mrpc",
    "glue_qqp",
    "glue_stsb",
    "glue_mnli",
    "glue_qnli",
    "glue_rte",
)
EVAL_ONLY_TASKS = ("glue_wnli", "glue_mnli_matched", "glue_mnli_mismatched")


def classification_postprocessor(config: str) -> Callable:
    """Label word -> class id (-1 for anything else); STS-B text -> float."""
    import preprocessors
    from preprocessors import postprocessors

    if config == "glue/stsb":
        return postprocessors.string_to_float
    labels = preprocessors.CLASSIFICATION_FORMATS[config].label_names
    return functools.partial(postprocessors.string_label_to_class_id, label_classes=labels)


def supervised_preprocessors(formatter: Callable) -> list[Callable]:
    """Format raw records into text, tokenize, cache point, append EOS."""
    return [
        formatter,
        seqio.preprocessors.tokenize,
        seqio.CacheDatasetPlaceholder(),
        seqio.preprocessors.append_eos_after_trim,
    ]


def register_tfds_task(
    name: str,
    tfds_name: str,
    formatter: Callable,
    vocabulary: seqio.Vocabulary,
    *,
    metric_fns: Sequence[Callable] = (),
    postprocess_fn: Callable | None = None,
    splits: Mapping[str, str] | None = None,
) -> seqio.Task:
    """Registers a supervised task over a TFDS dataset (GLUE, SuperGLUE, SQuAD, CNN/DM, WMT):
    records formatted into text by `formatter`, then `supervised_preprocessors`.

    Args:
      name: the task name; a task t2t registered under it before is replaced.
      tfds_name: e.g. "glue/cola:2.0.0".
      formatter: record -> {"inputs", "targets"} text (a `preprocessors` function).
      vocabulary: tokenizes both features.
      metric_fns, postprocess_fn: as `seqio.Task` takes them.
      splits: task split -> TFDS split (default `STANDARD_SPLITS`).
    """
    return registry.add_task(
        name,
        __name__,
        source=seqio.TfdsDataSource(tfds_name, splits=dict(splits or STANDARD_SPLITS)),
        preprocessors=supervised_preprocessors(formatter),
        postprocess_fn=postprocess_fn,
        metric_fns=list(metric_fns),
        output_features=text.output_features(vocabulary),
    )


def register_classification_task(
    name: str,
    task: ClassificationTask,
    vocabulary: seqio.Vocabulary,
    postprocess_fn: Callable | None = None,
) -> seqio.Task:
    """Registers one GLUE/SuperGLUE classification task (replacing an older one of `name`).

    `postprocess_fn` defaults to `classification_postprocessor(task.config)`.
    """
    import preprocessors

    return register_tfds_task(
        name,
        task.tfds_name,
        preprocessors.text_preprocessor(task.tfds_name),
        vocabulary,
        metric_fns=task.metric_fns,
        splits=task.splits,
        postprocess_fn=postprocess_fn or classification_postprocessor(task.config),
    )


def register(vocabulary: seqio.Vocabulary | None = None) -> list[str]:
    """Registers every GLUE task and the `glue` mixture; returns the names."""
    vocabulary = vocabulary or vocab.default_vocabulary()
    for name, task in SUBTASKS.items():
        register_classification_task(name, task, vocabulary)
    registry.add_mixture(
        "glue",
        [(name, mixing.examples_proportional()) for name in TRAIN_TASKS]
        + [(name, 0.0) for name in EVAL_ONLY_TASKS],
        __name__,
    )
    return [*SUBTASKS, "glue"]


TASKS = register()
