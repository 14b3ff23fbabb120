"""Evaluation metrics of the T5 paper, as seqio metric functions.

seqio tasks attach metrics as callables `fn(targets, predictions) -> {name: value}` run on the
postprocessed targets and predictions of a whole evaluation split. This module provides every
metric the paper reports (docs/spec.md section 10), with values in percent (0-100) as the paper's
tables show them, and the GLUE / SuperGLUE benchmark averages computed the paper's way.

Conventions (those of the paper's own metric code, the `t5` package's `t5.evaluation.metrics`):
- Classification predictions come from postprocessors that map label words to class ids and
    anything else to an invalid id (e.g. -1). Accuracy counts an invalid prediction as wrong. Binary
    F1 (and MultiRC's F1a) turns it into the opposite of the target (a false positive on a negative
    example, a false negative on a positive one). Macro-F1 counts it as a miss of its target's
    class. Matthews correlation keeps it as a label of its own (scikit-learn's multiclass
    formula), as the reference does; `invalid="wrong"` gives the flip-to-wrong alternative.
- ROUGE does not stem words by default (the reference's scorer does not); `use_stemmer=True` is
    the alternative many summarization papers use.
- Library metrics are used as the paper used them: scikit-learn for F1 / Matthews, scipy for
    correlations, sacrebleu for BLEU, rouge-score for ROUGE.
"""

from __future__ import annotations

import collections
import re
import string
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import sacrebleu
import scipy.stats
import sklearn.metrics
from rouge_score import rouge_scorer

MetricFn = Callable[[Sequence[Any], Sequence[Any]], dict[str, float]]


def _check_lengths(targets: Sequence[Any], predictions: Sequence[Any]) -> None:
    if len(targets) != len(predictions):
        raise ValueError(
            f"Expected as many predictions as targets, got {len(predictions)} predictions for "
            f"{len(targets)} targets. Pass the predictions of the whole split, in target order."
        )
    if not len(targets):
        raise ValueError("Expected at least one target and prediction, got none.")


def _class_ids(values: Sequence[Any], what: str) -> np.ndarray:
    """Converts class labels to an int array, with a clear error for non-integer labels."""
    array = np.asarray(values)
    if array.dtype.kind not in "iub":
        raise TypeError(
            f"Expected integer class ids as {what} (use a postprocessor such as "
            f"string_label_to_class_id), got dtype {array.dtype} (first value {values[0]!r})."
        )
    return array.astype(np.int64)


def _binary_invalid_as_wrong(
    targets: Sequence[Any], predictions: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    """Returns binary targets and predictions where invalid predictions are flipped to wrong.

    Example: targets [1, 0, 1, 0], predictions [1, -1, -1, 0] -> predictions [1, 1, 0, 0].
    """
    _check_lengths(targets, predictions)
    targets = _class_ids(targets, "targets")
    predictions = _class_ids(predictions, "predictions")
    if not np.isin(targets, (0, 1)).all():
        raise ValueError(
            f"Expected binary targets in {{0, 1}}, got {sorted(set(targets.tolist()))}."
        )
    invalid = ~np.isin(predictions, (0, 1))
    return targets, np.where(invalid, 1 - targets, predictions)


def accuracy(targets: Sequence[Any], predictions: Sequence[Any]) -> dict[str, float]:
    """Percentage of predictions equal to their target (any comparable values, invalid = wrong)."""
    _check_lengths(targets, predictions)
    correct = [target == prediction for target, prediction in zip(targets, predictions)]
    return {"accuracy": 100.0 * float(np.mean(correct))}


def f1(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """Binary F1 of the positive class 1 (MRPC, QQP); invalid predictions count as wrong."""
    targets, predictions = _binary_invalid_as_wrong(targets, predictions)
    return {"f1": 100.0 * float(sklearn.metrics.f1_score(targets, predictions, zero_division=0))}


def accuracy_and_f1(targets: Sequence[int], predictions: Sequence[int]) -> dict[str, float]:
    """Accuracy and binary F1 together (the MRPC and QQP metric pair)."""
    return {**accuracy(targets, predictions), **f1(targets, predictions)}


def macro_f1(
    targets: Sequence[int], predictions: Sequence[int], num_classes: int = 3
) -> dict[str, float]:
    """Unweighted mean of the per-class F1 over classes `0..num_classes-1` (CB uses 3 classes).

    An invalid prediction is a miss (false negative) for its target's class and no class's hit.
    """
    _check_lengths(targets, predictions)
    targets = _class_ids(targets, "targets")
    predictions = _class_ids(predictions, "predictions")
    score = sklearn.metrics.f1_score(
        targets, predictions, labels=list(range(num_classes)), average="macro", zero_division=0
    )
    return {"macro_f1": 100.0 * float(score)}


def accuracy_and_macro_f1(
    targets: Sequence[int], predictions: Sequence[int], num_classes: int = 3
) -> dict[str, float]:
    """Accuracy and macro-F1 together (the CB metric pair)."""
    return {**accuracy(targets, predictions), **macro_f1(targets, predictions, num_classes)}


MATTHEWS_INVALID = ("label", "wrong")


def matthews_corrcoef(
    targets: Sequence[int], predictions: Sequence[int], invalid: str = "label"
) -> dict[str, float]:
    """Matthews correlation (CoLA), x100.

    Args:
        invalid: what an invalid prediction (neither 0 nor 1) is. "label" (the reference's
            behaviour, the default): a class of its own, scored with scikit-learn's multiclass
            formula on the raw ids. "wrong": the opposite of its target, then the binary formula.
            The two differ; e.g. targets [1, 0, 1, 0, 1, 0] and predictions [1, 0, -1, 0, 1, 1]
            give 45.2 ("label") and 33.3 ("wrong").
    """
    if invalid not in MATTHEWS_INVALID:
        raise ValueError(f"Expected invalid in {MATTHEWS_INVALID}, got {invalid!r}.")
    if invalid == "wrong":
        targets, predictions = _binary_invalid_as_wrong(targets, predictions)
    else:
        _check_lengths(targets, predictions)
        targets = _class_ids(targets, "targets")
        predictions = _class_ids(predictions, "predictions")
    score = sklearn.metrics.matthews_corrcoef(targets, predictions)
    return {"matthews_corrcoef": 100.0 * float(score)}


def _floats(values: Sequence[Any], what: str) -> np.ndarray:
    try:
        return np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError) as error:
        raise TypeError(
            f"Expected numbers as {what} (use a postprocessor such as string_to_float), got "
            f"{values[0]!r}..."
        ) from error


def pearson_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Pearson correlation x100 (STS-B). Unparseable predictions arrive as a default value."""
    _check_lengths(targets, predictions)
    result = scipy.stats.pearsonr(_floats(targets, "targets"), _floats(predictions, "predictions"))
    return {"pearson_corrcoef": 100.0 * float(result[0])}


def spearman_corrcoef(targets: Sequence[float], predictions: Sequence[float]) -> dict[str, float]:
    """Spearman rank correlation x100 (STS-B)."""
    _check_lengths(targets, predictions)
    result = scipy.stats.spearmanr(_floats(targets, "targets"), _floats(predictions, "predictions"))
    return {"spearman_corrcoef": 100.0 * float(result[0])}


def pearson_and_spearman(
    targets: Sequence[float], predictions: Sequence[float]
) -> dict[str, float]:
    """Both STS-B correlations."""
    return {**pearson_corrcoef(targets, predictions), **spearman_corrcoef(targets, predictions)}


def _value(item: Any) -> Any:
    return item["value"] if isinstance(item, Mapping) else item


def multirc_f1a_em(
    targets: Sequence[Mapping[str, Any]], predictions: Sequence[Any]
) -> dict[str, float]:
    """MultiRC F1a (binary F1 over all answer options) and exact match per question.

    Args:
        targets: one `{"group": question_id, "value": 0 | 1}` per answer option.
        predictions: per answer option, a class id or `{"value": class id}` (invalid ids are wrong).

    Returns:
        `f1a`: F1 of the positive class over all answer options; `exact_match`: percentage of
        questions (answer options grouped by `group`) whose options are all predicted correctly.
    """
    _check_lengths(targets, predictions)
    if not all(isinstance(t, Mapping) and {"group", "value"} <= set(t) for t in targets):
        raise TypeError(
            "Expected MultiRC targets as {'group': question_id, 'value': label} dicts, got "
            f"{targets[0]!r}. Use the MultiRC postprocessor that keeps the question id."
        )
    values, predicted = _binary_invalid_as_wrong(
        [t["value"] for t in targets], [_value(p) for p in predictions]
    )
    all_correct: dict[Any, bool] = collections.defaultdict(lambda: True)
    for target, value, prediction in zip(targets, values, predicted):
        all_correct[target["group"]] &= bool(value == prediction)
    return {
        "f1a": 100.0 * float(sklearn.metrics.f1_score(values, predicted, zero_division=0)),
        "exact_match": 100.0 * float(np.mean(list(all_correct.values()))),
    }


def normalize_answer(text: str) -> str:
    """SQuAD answer normalization: lowercase, drop punctuation and articles, collapse whitespace.

    Example: "The  Eiffel-Tower!" -> "eiffeltower".
    """
    text = text.lower()
    text = "".join(char for char in text if char not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _token_f1(target: str, prediction: str) -> float:
    target_tokens = normalize_answer(target).split()
    prediction_tokens = normalize_answer(prediction).split()
    common = collections.Counter(target_tokens) & collections.Counter(prediction_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(prediction_tokens)
    recall = num_same / len(target_tokens)
    return 2 * precision * recall / (precision + recall)


def _answers(target: str | Sequence[str]) -> list[str]:
    answers = [target] if isinstance(target, str) else list(target)
    if not answers:
        raise ValueError("Expected at least one gold answer per example, got an empty list.")
    return answers


def _qa_em_f1(
    targets: Sequence[str | Sequence[str]], predictions: Sequence[str]
) -> dict[str, float]:
    """Exact match and token F1 after normalization, each the max over an example's answers."""
    _check_lengths(targets, predictions)
    em, f1_scores = [], []
    for target, prediction in zip(targets, predictions):
        answers = _answers(target)
        em.append(max(float(normalize_answer(a) == normalize_answer(prediction)) for a in answers))
        f1_scores.append(max(_token_f1(a, prediction) for a in answers))
    return {"em": 100.0 * float(np.mean(em)), "f1": 100.0 * float(np.mean(f1_scores))}


def squad_em_f1(
    targets: Sequence[str | Sequence[str]], predictions: Sequence[str]
) -> dict[str, float]:
    """SQuAD exact match and F1 (percent); targets are each example's list of gold answers."""
    return _qa_em_f1(targets, predictions)


def record_em_f1(
    targets: Sequence[str | Sequence[str]], predictions: Sequence[str]
) -> dict[str, float]:
    """ReCoRD exact match and F1 (percent): SQuAD scoring, max over the gold entity answers."""
    return _qa_em_f1(targets, predictions)


def bleu(targets: Sequence[str | Sequence[str]], predictions: Sequence[str]) -> dict[str, float]:
    """Corpus BLEU of detokenized text through sacrebleu with the paper's settings.

    NOTE: exponential smoothing and the "intl" tokenizer, case-sensitive, no effective order, as
    T5 reported BLEU (docs/spec.md section 10).

    Args:
        targets: one reference string per example, or a list of references per example (the same
            number for every example).
        predictions: one hypothesis string per example.
    """
    _check_lengths(targets, predictions)
    references = [[t] if isinstance(t, str) else list(t) for t in targets]
    num_refs = {len(r) for r in references}
    if len(num_refs) != 1:
        raise ValueError(
            "Expected the same number of references for every example, got counts "
            f"{sorted(num_refs)}."
        )
    streams = [list(stream) for stream in zip(*references)]  # [num_refs][examples]
    score = sacrebleu.corpus_bleu(
        list(predictions),
        streams,
        smooth_method="exp",
        smooth_value=0.0,
        force=False,
        lowercase=False,
        tokenize="intl",
        use_effective_order=False,
    )
    return {"bleu": float(score.score)}


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL", "rougeLsum")


def _sentence_per_line(summary: str) -> str:
    # NOTE: rougeLsum splits summaries at newlines. Summaries whose sentences arrive on one line
    # (detokenized model output) get a newline after each " . ", as T5's ROUGE setup does.
    return summary.replace(" . ", " .\n")


def rouge(
    targets: Sequence[str], predictions: Sequence[str], use_stemmer: bool = False
) -> dict[str, float]:
    """ROUGE-1/2/L and summary-level L F-measure x100, mean over examples.

    Words are not stemmed by default, as in the paper's metric code; `use_stemmer=True` applies
    the Porter stemmer ("cats" then matches "cat"), which raises scores by a few points. T5
    aggregated with rouge-score's bootstrap aggregator and reported its middle estimate; the plain
    mean reported here is that estimate without resampling noise.
    """
    _check_lengths(targets, predictions)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=use_stemmer)
    totals = collections.defaultdict(float)
    for target, prediction in zip(targets, predictions):
        scores = scorer.score(_sentence_per_line(target), _sentence_per_line(prediction))
        for name in ROUGE_TYPES:
            totals[name] += scores[name].fmeasure
    return {name: 100.0 * totals[name] / len(targets) for name in ROUGE_TYPES}


# Benchmark averages (paper Tables 14 and 16): a group's score is the mean of its metrics, the
# benchmark score the unweighted mean over groups. MNLI's matched and mismatched accuracies form
# one group; WNLI is left out of GLUE.
GLUE_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "cola": (("cola", "matthews_corrcoef"),),
    "sst2": (("sst2", "accuracy"),),
    "mrpc": (("mrpc", "accuracy"), ("mrpc", "f1")),
    "stsb": (("stsb", "pearson_corrcoef"), ("stsb", "spearman_corrcoef")),
    "qqp": (("qqp", "accuracy"), ("qqp", "f1")),
    "mnli": (("mnli_matched", "accuracy"), ("mnli_mismatched", "accuracy")),
    "qnli": (("qnli", "accuracy"),),
    "rte": (("rte", "accuracy"),),
}
SUPERGLUE_GROUPS: dict[str, tuple[tuple[str, str], ...]] = {
    "boolq": (("boolq", "accuracy"),),
    "cb": (("cb", "accuracy"), ("cb", "macro_f1")),
    "copa": (("copa", "accuracy"),),
    "multirc": (("multirc", "f1a"), ("multirc", "exact_match")),
    "record": (("record", "em"), ("record", "f1")),
    "rte": (("rte", "accuracy"),),
    "wic": (("wic", "accuracy"),),
    "wsc": (("wsc", "accuracy"),),
}


def _benchmark_average(
    scores: Mapping[str, Mapping[str, float]],
    groups: Mapping[str, tuple[tuple[str, str], ...]],
    benchmark: str,
) -> float:
    missing = [
        f"{task}/{metric}"
        for members in groups.values()
        for task, metric in members
        if metric not in scores.get(task, {})
    ]
    if missing:
        tasks = sorted({task for members in groups.values() for task, _ in members})
        raise ValueError(
            f"The {benchmark} average needs every sub-task's metrics; missing {missing}. Pass "
            f"{{task: {{metric: value}}}} with tasks {tasks}."
        )
    group_means = [
        np.mean([scores[task][metric] for task, metric in members]) for members in groups.values()
    ]
    return float(np.mean(group_means))


def glue_average(scores: Mapping[str, Mapping[str, float]]) -> float:
    """The paper's average GLUE score from `{task: {metric: value}}` (WNLI ignored).

    Tasks are named `cola, sst2, mrpc, stsb, qqp, mnli_matched, mnli_mismatched, qnli, rte` with
    the metric names this module returns. Example: if every metric is 80 except CoLA's Matthews
    correlation at 40 and MRPC's F1 at 90, MRPC's group is 85 and the average is
    (40 + 80 + 85 + 80 * 5) / 8 = 75.625.
    """
    return _benchmark_average(scores, GLUE_GROUPS, "GLUE")


def superglue_average(scores: Mapping[str, Mapping[str, float]]) -> float:
    """The paper's average SuperGLUE score from `{task: {metric: value}}`.

    Tasks are named `boolq, cb, copa, multirc, record, rte, wic, wsc`.
    """
    return _benchmark_average(scores, SUPERGLUE_GROUPS, "SuperGLUE")
