"""Metrics against independent computations: scikit-learn, scipy, sacrebleu, rouge-score, and
hand-worked values (invalid predictions counted as wrong)."""

import math

import numpy as np
import pytest
import sacrebleu
import scipy.stats
import sklearn.metrics
from rouge_score import rouge_scorer

from t2t import metrics

# Hand-made binary predictions with invalid labels (-1, 7) from a label postprocessor.
TARGETS = [1, 0, 1, 1, 0, 0, 1, 0, 1, 0]
PREDICTIONS = [1, 0, -1, 1, 1, -1, 1, 7, 0, 0]
# The same predictions with every invalid one replaced, by hand, by the wrong label.
PREDICTIONS_WRONG = [1, 0, 0, 1, 1, 1, 1, 1, 0, 0]


def test_accuracy_counts_invalid_as_wrong():
    got = metrics.accuracy(TARGETS, PREDICTIONS)["accuracy"]
    assert got == pytest.approx(100 * sklearn.metrics.accuracy_score(TARGETS, PREDICTIONS_WRONG))
    assert got == pytest.approx(50.0)  # 5 of 10 correct, counted by hand.


def test_accuracy_on_strings():
    assert metrics.accuracy(["a", "b", "c"], ["a", "x", "c"])["accuracy"] == pytest.approx(200 / 3)


def test_f1_invalid_is_false_positive_or_negative():
    got = metrics.f1(TARGETS, PREDICTIONS)["f1"]
    assert got == pytest.approx(100 * sklearn.metrics.f1_score(TARGETS, PREDICTIONS_WRONG))
    # By hand: TP 3 (idx 0, 3, 6), FP 3 (idx 4, 5, 7), FN 2 (idx 2, 8) -> F1 = 6 / 11.
    assert got == pytest.approx(100 * 6 / 11)


def test_accuracy_and_f1_has_both():
    assert set(metrics.accuracy_and_f1(TARGETS, PREDICTIONS)) == {"accuracy", "f1"}


def test_matthews_invalid_as_wrong_option():
    got = metrics.matthews_corrcoef(TARGETS, PREDICTIONS, invalid="wrong")["matthews_corrcoef"]
    expected = 100 * sklearn.metrics.matthews_corrcoef(TARGETS, PREDICTIONS_WRONG)
    assert got == pytest.approx(expected)
    # By hand: TP 3, TN 2, FP 3, FN 2 -> (6 - 6) / sqrt(...) = 0.
    assert got == pytest.approx(0.0)


def test_matthews_keeps_invalid_as_its_own_label_like_the_reference():
    # The t5 package scores CoLA with scikit-learn on the raw ids, so -1 is a third class.
    targets, predictions = [1, 0, 1, 0, 1, 0], [1, 0, -1, 0, 1, 1]
    got = metrics.matthews_corrcoef(targets, predictions)["matthews_corrcoef"]
    # Multiclass formula by hand: c = 4 correct of s = 6; true counts (0, 3, 3) and predicted
    # counts (1, 2, 3) over labels (-1, 0, 1): (4*6 - (0 + 6 + 9)) / sqrt((36 - 14) (36 - 18)).
    assert got == pytest.approx(100 * 9 / math.sqrt(22 * 18))
    wrong = metrics.matthews_corrcoef(targets, predictions, invalid="wrong")["matthews_corrcoef"]
    assert wrong == pytest.approx(100 / 3)  # [1, 0, 0, 0, 1, 1]: TP 2, TN 2, FP 1, FN 1.
    with pytest.raises(ValueError, match="invalid"):
        metrics.matthews_corrcoef(targets, predictions, invalid="ignore")


def test_macro_f1_three_classes_with_invalid():
    targets = [0, 1, 2, 2, 1, 0, 2, 1]
    predictions = [0, 2, 2, -1, 1, 0, 1, 5]
    got = metrics.macro_f1(targets, predictions, num_classes=3)["macro_f1"]
    # Per class by hand: class 0 TP2 -> F1 1; classes 1 and 2 TP1 FP1 FN2 -> 2/5 each.
    assert got == pytest.approx(100 * (1 + 0.4 + 0.4) / 3)
    expected = sklearn.metrics.f1_score(targets, predictions, labels=[0, 1, 2], average="macro")
    assert got == pytest.approx(100 * expected)
    both = metrics.accuracy_and_macro_f1(targets, predictions)
    assert both["accuracy"] == pytest.approx(50.0)


def test_correlations_against_scipy():
    targets = [0.0, 1.2, 3.4, 5.0, 2.2, 4.8]
    predictions = [0.4, 1.0, 3.0, 4.6, -1.0, 5.0]  # -1: an unparseable prediction's default.
    got = metrics.pearson_and_spearman(targets, predictions)
    pearson = scipy.stats.pearsonr(targets, predictions)[0]
    assert got["pearson_corrcoef"] == pytest.approx(100 * pearson)
    assert got["spearman_corrcoef"] == pytest.approx(
        100 * scipy.stats.spearmanr(targets, predictions)[0]
    )
    # Spearman by hand: prediction ranks 2 3 4 5 1 6 vs target ranks 1 2 4 6 3 5, sum d^2 = 8.
    assert got["spearman_corrcoef"] == pytest.approx(100 * (1 - 6 * 8 / (6 * 35)))


def test_multirc_f1a_over_all_answers_and_em_per_question():
    targets = [
        {"group": 0, "value": 1},
        {"group": 0, "value": 0},
        {"group": 0, "value": 1},
        {"group": 1, "value": 0},
        {"group": 1, "value": 1},
        {"group": 2, "value": 1},
    ]
    predictions = [{"value": 1}, {"value": 0}, {"value": 1}, 0, -1, 1]
    got = metrics.multirc_f1a_em(targets, predictions)
    # Question 1 has an invalid prediction on a positive option (a false negative).
    values = [1, 0, 1, 0, 1, 1]
    assert got["f1a"] == pytest.approx(100 * sklearn.metrics.f1_score(values, [1, 0, 1, 0, 0, 1]))
    assert got["f1a"] == pytest.approx(100 * 6 / 7)  # TP 3, FN 1, FP 0.
    assert got["exact_match"] == pytest.approx(100 * 2 / 3)


def test_squad_normalization_example():
    assert metrics.normalize_answer("The  Eiffel-Tower!") == "eiffeltower"
    assert metrics.normalize_answer("An apple, a day") == "apple day"


def test_squad_em_f1_max_over_answers():
    targets = [["Denver Broncos", "The Denver Broncos"], ["Santa Clara, California"], ["1990s"]]
    predictions = ["the Denver broncos.", "Santa Clara", "in the 1980s"]
    got = metrics.squad_em_f1(targets, predictions)
    # By hand: EM 1, 0, 0; F1 1, 2*(1*2/3)/(1+2/3) = 0.8, 0.
    assert got["em"] == pytest.approx(100 / 3)
    assert got["f1"] == pytest.approx(100 * (1 + 0.8 + 0) / 3)


def test_record_em_f1_single_string_target():
    targets = [["Obama", "Barack Obama"], "Paris"]
    got = metrics.record_em_f1(targets, ["barack obama", "paris, France"])
    # By hand: EM 1, 0; F1 1 and 2*(1/2*1)/(1/2+1) = 2/3.
    assert got["em"] == pytest.approx(50.0)
    assert got["f1"] == pytest.approx(100 * (1 + 2 / 3) / 2)


def test_bleu_matches_sacrebleu_with_paper_settings():
    targets = ["Das Haus ist klein.", "Der Hund bellt laut, aber er beißt nicht.", "Ich bin hier."]
    predictions = ["Das Haus ist gross.", "Der Hund bellt laut, er beißt nicht.", "Ich war hier!"]
    got = metrics.bleu(targets, predictions)["bleu"]
    expected = sacrebleu.metrics.BLEU(smooth_method="exp", tokenize="intl").corpus_score(
        predictions, [targets]
    )
    assert got == pytest.approx(expected.score)
    assert 0 < got < 100
    assert metrics.bleu(targets, targets)["bleu"] == pytest.approx(100.0)


def test_bleu_multiple_references():
    targets = [["the cat sat", "a cat sat down"], ["it is raining", "it rains"]]
    predictions = ["a cat sat down", "it rains"]
    assert metrics.bleu(targets, predictions)["bleu"] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="same number of references"):
        metrics.bleu([["a"], ["b", "c"]], ["a", "b"])


@pytest.mark.parametrize("use_stemmer", [False, True])
def test_rouge_matches_rouge_score_mean(use_stemmer):
    targets = ["the cats are sitting on the mat .", "police said the man was arrested ."]
    predictions = ["a cat sat on the mat .", "the man was arrested by police ."]
    got = (
        metrics.rouge(targets, predictions, use_stemmer=True)
        if use_stemmer
        else metrics.rouge(targets, predictions)
    )  # the default: no stemming, as the paper
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=use_stemmer)
    per_example = [scorer.score(t, p) for t, p in zip(targets, predictions)]
    for name in ("rouge1", "rouge2", "rougeL"):
        expected = 100 * np.mean([s[name].fmeasure for s in per_example])
        assert got[name] == pytest.approx(expected)
    # rouge-score drops punctuation: 7 target and 6 predicted words. Unstemmed they share "on the
    # mat" (F = 2 * 3 / 13); stemmed, "cats" matches "cat" too (F = 2 * 4 / 13).
    first = got["rouge1"] * 2 / 100 - scorer.score(targets[1], predictions[1])["rouge1"].fmeasure
    assert first == pytest.approx(8 / 13 if use_stemmer else 6 / 13)


def test_rouge_lsum_splits_sentences():
    target = "the cat sat . the dog ran ."
    prediction = "the dog ran . the cat sat ."
    got = metrics.rouge([target], [prediction])
    # Sentence-level LCS: each sentence is matched in full, unlike the single-sequence rougeL.
    assert got["rougeLsum"] == pytest.approx(100.0)
    assert got["rougeL"] < 100.0


def test_glue_average_worked_example():
    scores = {
        task: {"accuracy": 80.0, "f1": 80.0, "pearson_corrcoef": 80.0, "spearman_corrcoef": 80.0}
        for task in (
            "sst2",
            "mrpc",
            "stsb",
            "qqp",
            "mnli_matched",
            "mnli_mismatched",
            "qnli",
            "rte",
        )
    }
    scores["cola"] = {"matthews_corrcoef": 40.0}
    scores["mrpc"]["f1"] = 90.0
    scores["wnli"] = {"accuracy": 0.0}  # Left out of the average.
    assert metrics.glue_average(scores) == pytest.approx(75.625)


def test_glue_average_mnli_is_one_group():
    scores = {t: {"accuracy": 50.0} for t in ("sst2", "qnli", "rte", "mnli_matched")}
    scores.update(
        mrpc={"accuracy": 50.0, "f1": 50.0},
        qqp={"accuracy": 50.0, "f1": 50.0},
        stsb={"pearson_corrcoef": 50.0, "spearman_corrcoef": 50.0},
        cola={"matthews_corrcoef": 50.0},
        mnli_mismatched={"accuracy": 90.0},
    )
    # Groups: 7 at 50 and MNLI at (50 + 90) / 2 = 70 -> (350 + 70) / 8.
    assert metrics.glue_average(scores) == pytest.approx(52.5)


def test_superglue_average_and_missing_metric_error():
    scores = {
        "boolq": {"accuracy": 60.0},
        "cb": {"accuracy": 90.0, "macro_f1": 70.0},
        "copa": {"accuracy": 60.0},
        "multirc": {"f1a": 70.0, "exact_match": 30.0},
        "record": {"em": 60.0, "f1": 60.0},
        "rte": {"accuracy": 60.0},
        "wic": {"accuracy": 60.0},
        "wsc": {"accuracy": 60.0},
    }
    # Groups: boolq 60, cb 80, copa 60, multirc 50, record 60, rte 60, wic 60, wsc 60.
    assert metrics.superglue_average(scores) == pytest.approx(490 / 8)
    del scores["wsc"]
    with pytest.raises(ValueError, match="wsc/accuracy"):
        metrics.superglue_average(scores)


def test_clear_errors():
    with pytest.raises(ValueError, match="as many predictions as targets"):
        metrics.accuracy([1, 0], [1])
    with pytest.raises(TypeError, match="integer class ids"):
        metrics.f1(["True", "False"], ["True", "True"])
    with pytest.raises(TypeError, match="'group'"):
        metrics.multirc_f1a_em([1, 0], [1, 0])


def test_percent_scale_of_perfect_predictions():
    assert metrics.f1([1, 0, 1], [1, 0, 1])["f1"] == pytest.approx(100.0)
    perfect = metrics.matthews_corrcoef([1, 0, 1], [1, 0, 1])
    assert perfect["matthews_corrcoef"] == pytest.approx(100.0)
    assert math.isclose(metrics.pearson_corrcoef([1, 2, 3], [2, 4, 6])["pearson_corrcoef"], 100.0)
