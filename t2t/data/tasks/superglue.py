"""SuperGLUE: every sub-task (with WSC in the paper's referent-noun format, plus DPR) and its mixture.

Registers `super_glue_<task>` for boolq, cb, copa, multirc, record, rte, wic, the WSC pair
`super_glue_wsc_simple_train` (trained on the examples whose candidate is the referent) and
`super_glue_wsc_simple_eval`, the diagnostics axb / axg (test only), `dpr_simple` (the Definite
Pronoun Resolution data the paper adds to WSC training), and the mixture `super_glue`:
training tasks mixed in proportion to their sizes, the WSC evaluation task at rate 0.
"""

from __future__ import annotations

import functools

import seqio

from t2t import metrics
from t2t.data import mixtures, vocab
from t2t.data.tasks import glue, text

TFDS_VERSION = "1.0.2"
DPR_TFDS_NAME = "definite_pronoun_resolution:1.1.0"
# Per task: (TFDS config, metric fns, field order of the text format when not the default).
_CLASSIFICATION = {
    "boolq": ("boolq", [metrics.accuracy], None),
    "cb": ("cb", [metrics.accuracy_and_macro_f1], None),
    "copa": ("copa", [metrics.accuracy], None),
    "rte": ("rte", [metrics.accuracy], None),
    "wic": ("wic", [metrics.accuracy], ("sentence1", "sentence2", "word")),
}
TRAIN_TASKS = ("super_glue_boolq", "super_glue_cb", "super_glue_copa", "super_glue_multirc",
               "super_glue_record", "super_glue_rte", "super_glue_wic",
               "super_glue_wsc_simple_train", "dpr_simple")
EVAL_ONLY_TASKS = ("super_glue_wsc_simple_eval",)
TEST_ONLY_TASKS = ("super_glue_axb", "super_glue_axg")


def _tfds(config: str) -> str:
    return f"super_glue/{config}:{TFDS_VERSION}"


def _add(name, tfds_name, processors, postprocess_fn, metric_fns, vocabulary, splits=None):
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TfdsDataSource(tfds_name, splits=dict(splits or glue.STANDARD_SPLITS)),
        preprocessors=processors,
        postprocess_fn=postprocess_fn,
        metric_fns=metric_fns,
        output_features=text.output_features(vocabulary),
    )


def _register_classification(vocabulary) -> list[str]:
    import preprocessors

    names = []
    for task, (config, metric_fns, feature_names) in _CLASSIFICATION.items():
        labels = glue.label_names(_tfds(config))
        formatter = functools.partial(
            preprocessors.glue, benchmark_name=task, label_names=labels, feature_names=feature_names)
        postprocess_fn = functools.partial(preprocessors.string_label_to_class_id, label_classes=labels)
        names.append(f"super_glue_{task}")
        _add(names[-1], _tfds(config), glue.supervised_preprocessors(formatter), postprocess_fn,
             metric_fns, vocabulary)
    # The diagnostics are scored as RTE (the paper evaluates them with its RTE model).
    for task, config in (("axb", "axb"), ("axg", "axg")):
        labels = glue.label_names(_tfds(config))
        formatter = functools.partial(preprocessors.glue, benchmark_name="rte", label_names=labels)
        postprocess_fn = functools.partial(preprocessors.string_label_to_class_id, label_classes=labels)
        names.append(f"super_glue_{task}")
        _add(names[-1], _tfds(config), glue.supervised_preprocessors(formatter), postprocess_fn,
             [], vocabulary, splits={"test": "test"})
    return names


def _register_special(vocabulary) -> list[str]:
    import preprocessors

    labels = glue.label_names(_tfds("multirc"))
    multirc_format = functools.partial(
        preprocessors.glue, benchmark_name="multirc", label_names=labels,
        feature_names=("question", "answer", "paragraph"))
    _add("super_glue_multirc", _tfds("multirc"), glue.supervised_preprocessors(multirc_format),
         preprocessors.multirc, [metrics.multirc_f1a_em], vocabulary)
    _add("super_glue_record", _tfds("record"), glue.supervised_preprocessors(preprocessors.record),
         preprocessors.record_postprocess, [metrics.record_em_f1], vocabulary)
    wsc_train = functools.partial(preprocessors.wsc_simple, correct_referent_only=True)
    _add("super_glue_wsc_simple_train", _tfds("wsc.fixed"), glue.supervised_preprocessors(wsc_train),
         preprocessors.wsc_simple_postprocess, [metrics.accuracy], vocabulary, splits={"train": "train"})
    wsc_eval = functools.partial(preprocessors.wsc_simple, correct_referent_only=False)
    _add("super_glue_wsc_simple_eval", _tfds("wsc.fixed"), glue.supervised_preprocessors(wsc_eval),
         preprocessors.wsc_simple_postprocess, [metrics.accuracy], vocabulary,
         splits={"validation": "validation", "test": "test"})
    _add("dpr_simple", DPR_TFDS_NAME, glue.supervised_preprocessors(preprocessors.dpr_simple),
         preprocessors.wsc_simple_postprocess, [metrics.accuracy], vocabulary,
         splits={"train": "train", "test": "test"})
    return ["super_glue_multirc", "super_glue_record", "super_glue_wsc_simple_train",
            "super_glue_wsc_simple_eval", "dpr_simple"]


def register(vocabulary: seqio.Vocabulary | None = None) -> list[str]:
    """Registers every SuperGLUE task and the `super_glue` mixture; returns the names."""
    vocabulary = vocabulary or vocab.default_vocabulary()
    names = _register_classification(vocabulary) + _register_special(vocabulary)
    seqio.MixtureRegistry.remove("super_glue")
    seqio.MixtureRegistry.add(
        "super_glue",
        [(name, mixtures.examples_proportional()) for name in TRAIN_TASKS]
        + [(name, 0.0) for name in EVAL_ONLY_TASKS],
    )
    return [*names, "super_glue"]


TASKS = register()
