"""GLUE and SuperGLUE classification tasks as text-to-text pairs (paper section 2.4, Appendix D).

An example becomes `"<task> <feature>: <text> <feature>: <text> ..."` -> label word, with the
features in the data set's order (sorted by name unless the task fixes an order) and the label words
of the TFDS `ClassLabel`. The layout matches the `t5` package's GLUE preprocessor on the same TFDS
records; `tests/preprocessors/test_formats.py` checks it against outputs of that package.

Records are TFDS-shaped: `glue/<config>` gives string features, `label` (int64 class id, -1 on
test splits) and `idx` (int32); `super_glue/<config>` likewise, with `idx` a dict for MultiRC.
"""

import dataclasses
import functools
from typing import Callable, Dict, Optional, Sequence, Tuple

import tensorflow as tf

UNKNOWN_LABEL = "<unk>"  # the target of unlabeled (test split) examples


@dataclasses.dataclass(frozen=True)
class ClassificationFormat:
    """How one TFDS GLUE/SuperGLUE config is written as text.

    Attributes:
        benchmark_name: the task prefix of the inputs.
        label_names: label words by class id (the TFDS `ClassLabel` names).
        feature_names: text features in input order; None sorts all features but label and idx.
    """

    benchmark_name: str
    label_names: Tuple[str, ...]
    feature_names: Optional[Tuple[str, ...]] = None


_NLI3 = ("entailment", "neutral", "contradiction")
_NLI2 = ("entailment", "not_entailment")
_BOOL = ("False", "True")

# TFDS config name -> format. The diagnostic sets are cast as the task they were built for: GLUE's
# AX as MNLI, SuperGLUE's AX-b and AX-g as RTE.
CLASSIFICATION_FORMATS: Dict[str, ClassificationFormat] = {
    "glue/cola": ClassificationFormat("cola", ("unacceptable", "acceptable")),
    "glue/sst2": ClassificationFormat("sst2", ("negative", "positive")),
    "glue/mrpc": ClassificationFormat("mrpc", ("not_equivalent", "equivalent")),
    "glue/qqp": ClassificationFormat("qqp", ("not_duplicate", "duplicate")),
    "glue/mnli": ClassificationFormat("mnli", _NLI3),
    "glue/mnli_matched": ClassificationFormat("mnli", _NLI3),
    "glue/mnli_mismatched": ClassificationFormat("mnli", _NLI3),
    "glue/qnli": ClassificationFormat("qnli", _NLI2),
    "glue/rte": ClassificationFormat("rte", _NLI2),
    "glue/wnli": ClassificationFormat("wnli", ("not_entailment", "entailment")),
    "glue/ax": ClassificationFormat("mnli", _NLI3),
    "super_glue/boolq": ClassificationFormat("boolq", _BOOL),
    "super_glue/cb": ClassificationFormat("cb", ("entailment", "contradiction", "neutral")),
    "super_glue/copa": ClassificationFormat("copa", ("choice1", "choice2")),
    "super_glue/multirc": ClassificationFormat(
        "multirc", _BOOL, ("question", "answer", "paragraph")
    ),
    "super_glue/rte": ClassificationFormat("rte", _NLI2),
    "super_glue/wic": ClassificationFormat("wic", _BOOL, ("sentence1", "sentence2", "word")),
    "super_glue/axb": ClassificationFormat("rte", _NLI2),
    "super_glue/axg": ClassificationFormat("rte", _NLI2),
}


def glue(
    dataset: tf.data.Dataset,
    benchmark_name: str,
    label_names: Sequence[str],
    feature_names: Optional[Sequence[str]] = None,
    id_key: Optional[str] = "idx",
) -> tf.data.Dataset:
    """Formats a GLUE/SuperGLUE classification record as `inputs`/`targets` text.

    Example (glue/qqp): {"question1": "Why?", "question2": "How?", "label": 1, "idx": 10} ->
    {"inputs": "qqp question1: Why? question2: How?", "targets": "duplicate", "idx": 10}.
    A label of -1 (test splits) gives the target "<unk>". MultiRC (benchmark "multirc") also
    drops `<br>` and `<b>` markup and returns `idx/paragraph`, `idx/question`, `idx/answer`.

    Args:
        dataset: TFDS-shaped records.
        benchmark_name: the task prefix.
        label_names: label words by class id.
        feature_names: text features in input order; None uses all features but `label` and
            `idx`, sorted by name.
        id_key: the feature passed through as `idx`; None passes none.

    Returns:
        A dataset of {"inputs": string, "targets": string, "idx": ...}.
    """
    keys = _feature_order(dataset, feature_names)
    labels = tf.constant(list(label_names))

    def format_example(x):
        parts = [benchmark_name]
        for key in keys:
            parts += [f"{key}:", x[key]]
        inputs = tf.strings.join(parts, separator=" ")
        out = {}
        if benchmark_name == "multirc":
            inputs = tf.strings.regex_replace(inputs, "<br>", " ")
            inputs = tf.strings.regex_replace(inputs, "<(/)?b>", "")
            for part in ("paragraph", "question", "answer"):
                out[f"idx/{part}"] = x["idx"][part]
        elif id_key:
            out["idx"] = x[id_key]
        out["inputs"] = inputs
        out["targets"] = label_word(x["label"], labels)
        return out

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def stsb(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """STS-B: the similarity score rounded to the nearest 0.2 and written with one decimal.

    Example: {"sentence1": "A cat.", "sentence2": "A dog.", "label": 3.25, "idx": 0} ->
    {"inputs": "stsb sentence1: A cat. sentence2: A dog.", "targets": "3.2", "idx": 0}
    (3.25 * 5 = 16.25 rounds to 16, and 16 / 5 = 3.2).
    """

    def format_example(x):
        inputs = tf.strings.join(
            ["stsb sentence1:", x["sentence1"], "sentence2:", x["sentence2"]], separator=" "
        )
        # NOTE: round(5 * score) / 5 in float32 with half-to-even rounding, as the t5 package does.
        score = tf.round(tf.cast(x["label"], tf.float32) * 5) / 5
        return {
            "inputs": inputs,
            "targets": tf.strings.as_string(score, precision=1),
            "idx": x["idx"],
        }

    return dataset.map(format_example, num_parallel_calls=tf.data.AUTOTUNE)


def label_word(label: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
    """The label word of a class id; "<unk>" for -1 (unlabeled)."""
    label = tf.cast(label, tf.int32)
    safe = tf.maximum(label, 0)
    return tf.where(label < 0, tf.constant(UNKNOWN_LABEL), tf.gather(labels, safe))


def text_preprocessor(tfds_name: str) -> Callable[[tf.data.Dataset], tf.data.Dataset]:
    """The formatting preprocessor of a TFDS GLUE/SuperGLUE classification config.

    Example: `text_preprocessor("glue/mnli")` is `glue` with prefix "mnli", label words
    entailment / neutral / contradiction, features sorted (hypothesis, premise).

    Args:
        tfds_name: "glue/<config>" or "super_glue/<config>" (a version suffix is ignored), or
            "glue/stsb".

    Returns:
        A dataset -> dataset function.

    Raises:
        ValueError: for a name without a classification format, listing the known names.
    """
    name = tfds_name.split(":")[0]
    if name == "glue/stsb":
        return stsb
    if name not in CLASSIFICATION_FORMATS:
        raise ValueError(
            f"no text format for {tfds_name!r}; known: {sorted(CLASSIFICATION_FORMATS) + ['glue/stsb']} "
            "(WSC, DPR and ReCoRD have their own functions in preprocessors.superglue)"
        )
    spec = CLASSIFICATION_FORMATS[name]
    return functools.partial(
        glue,
        benchmark_name=spec.benchmark_name,
        label_names=spec.label_names,
        feature_names=spec.feature_names,
    )


def _feature_order(
    dataset: tf.data.Dataset, feature_names: Optional[Sequence[str]]
) -> Tuple[str, ...]:
    spec = dataset.element_spec
    if not isinstance(spec, dict) or "label" not in spec:
        raise ValueError(f"expected TFDS GLUE/SuperGLUE records with a 'label' feature, got {spec}")
    keys = tuple(feature_names) if feature_names else tuple(sorted(set(spec) - {"label", "idx"}))
    missing = [k for k in keys if k not in spec]
    if missing:
        raise ValueError(f"features {missing} are not in the records (they have {sorted(spec)})")
    return keys
