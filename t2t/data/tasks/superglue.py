"""SuperGLUE: every sub-task (with WSC in the paper's referent-noun format, plus DPR) and its mixture.

Registers `super_glue_<task>` for boolq, cb, copa, multirc, record, rte, wic, the WSC pair
`super_glue_wsc_simple_train` (trained on the examples whose candidate is the referent) and
`super_glue_wsc_simple_eval`, the diagnostics axb / axg (test only, cast as RTE), `dpr_simple`
(the Definite Pronoun Resolution data the paper adds to WSC training), and the mixture
`super_glue`: training tasks mixed in proportion to their sizes, WSC evaluation at rate 0.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import seqio

from t2t import metrics
from t2t.data import mixing, registry, vocab
from t2t.data.tasks import glue

TFDS_VERSION = "1.0.2"
DPR_TFDS_NAME = "definite_pronoun_resolution:1.1.0"
CLASSIFICATION = {
    "super_glue_boolq": ("boolq", [metrics.accuracy]),
    "super_glue_cb": ("cb", [metrics.accuracy_and_macro_f1]),
    "super_glue_copa": ("copa", [metrics.accuracy]),
    "super_glue_multirc": ("multirc", [metrics.multirc_f1a_em]),
    "super_glue_rte": ("rte", [metrics.accuracy]),
    "super_glue_wic": ("wic", [metrics.accuracy]),
    # The diagnostics have only unlabeled test data (scored by the SuperGLUE server).
    "super_glue_axb": ("axb", []),
    "super_glue_axg": ("axg", []),
}
TEST_ONLY = {"super_glue_axb", "super_glue_axg"}
TRAIN_TASKS = (
    "super_glue_boolq",
    "super_glue_cb",
    "super_glue_copa",
    "super_glue_multirc",
    "super_glue_record",
    "super_glue_rte",
    "super_glue_wic",
    "super_glue_wsc_simple_train",
    "dpr_simple",
)
EVAL_ONLY_TASKS = ("super_glue_wsc_simple_eval",)


def _tfds(config: str) -> str:
    return f"super_glue/{config}:{TFDS_VERSION}"


def record_metric(
    targets: Sequence[Mapping[str, Any]], predictions: Sequence[Mapping[str, Any]]
) -> dict:
    """ReCoRD EM/F1 over distinct queries.

    ReCoRD yields one example per correct answer, so a query with k answers is predicted k times;
    the `record` postprocessor tags each with its (passage, query) group and every gold answer.
    The first prediction of each group is scored against all of its answers.

    Example: targets [{"group": (0, 1), "value": ["Ann", "Anne"]}] * 2, predictions
    [{"value": "anne"}, {"value": "Bob"}] -> one query, exact match 100.
    """
    if len(targets) != len(predictions):
        raise ValueError(
            f"Expected as many predictions as targets, got {len(predictions)} and {len(targets)}."
        )
    first: dict[Any, tuple[list[str], str]] = {}
    for target, prediction in zip(targets, predictions):
        first.setdefault(target["group"], (target["value"], prediction["value"]))
    answers, predicted = zip(*first.values())
    return metrics.record_em_f1(list(answers), list(predicted))


def _register_classification(vocabulary) -> list[str]:
    from preprocessors import postprocessors

    for name, (config, metric_fns) in CLASSIFICATION.items():
        splits = {"test": "test"} if name in TEST_ONLY else dict(glue.STANDARD_SPLITS)
        task = glue.ClassificationTask(_tfds(config), tuple(metric_fns), splits)
        # MultiRC's targets keep their question id so exact match is computed per question.
        postprocess_fn = postprocessors.multirc if config == "multirc" else None
        glue.register_classification_task(name, task, vocabulary, postprocess_fn)
    return list(CLASSIFICATION)


def _register_special(vocabulary) -> list[str]:
    import preprocessors
    from preprocessors import postprocessors

    glue.register_tfds_task(
        "super_glue_record",
        _tfds("record"),
        preprocessors.record,
        vocabulary,
        metric_fns=[record_metric],
        postprocess_fn=postprocessors.record,
    )
    wsc_train = functools.partial(preprocessors.wsc_simple, correct_referent_only=True)
    glue.register_tfds_task(
        "super_glue_wsc_simple_train",
        _tfds("wsc.fixed"),
        wsc_train,
        vocabulary,
        metric_fns=[metrics.accuracy],
        postprocess_fn=postprocessors.wsc_simple,
        splits={"train": "train"},
    )
    glue.register_tfds_task(
        "super_glue_wsc_simple_eval",
        _tfds("wsc.fixed"),
        preprocessors.wsc_simple,
        vocabulary,
        metric_fns=[metrics.accuracy],
        postprocess_fn=postprocessors.wsc_simple,
        splits={"validation": "validation", "test": "test"},
    )
    # DPR's target is always the referent: score the predicted noun phrase as exact text.
    glue.register_tfds_task(
        "dpr_simple",
        DPR_TFDS_NAME,
        preprocessors.dpr_simple,
        vocabulary,
        metric_fns=[metrics.accuracy],
        splits={"train": "train", "test": "test"},
    )
    return [
        "super_glue_record",
        "super_glue_wsc_simple_train",
        "super_glue_wsc_simple_eval",
        "dpr_simple",
    ]


def register(vocabulary: seqio.Vocabulary | None = None) -> list[str]:
    """Registers every SuperGLUE task and the `super_glue` mixture; returns the names."""
    vocabulary = vocabulary or vocab.default_vocabulary()
    names = _register_classification(vocabulary) + _register_special(vocabulary)
    registry.add_mixture(
        "super_glue",
        [(name, mixing.examples_proportional()) for name in TRAIN_TASKS]
        + [(name, 0.0) for name in EVAL_ONLY_TASKS],
        __name__,
    )
    return [*names, "super_glue"]


TASKS = register()
