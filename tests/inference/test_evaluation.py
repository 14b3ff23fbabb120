"""`t2t.evaluation`: the seqio evaluator callable, best-checkpoint selection, and `t2t eval` over a
model directory whose checkpoints differ in a known way.

Known quality: task `eval_test_a`'s targets are the greedy outputs of parameter set A (computed
by uncached forward passes), task `eval_test_b`'s those of B. The checkpoint holding A scores
100% accuracy on task a and the one holding B on task b; a third, C, matches neither.
"""

import functools
import glob
import json
import os

import numpy as np
import pytest
import seqio

from t2t import cli, evaluation, inference, metrics, models

from .conftest import random_params, uncached_greedy, write_model_dir

INPUTS = [
    "Return the absolute value of a number.",
    "The quick brown fox jumps over the lazy dog.",
    "Open file and return a corresponding file object.",
    "if x == 1: return y",
    "Create a new dictionary with keys from iterable.",
]
LENGTH = 5
TASKS = ("eval_test_a", "eval_test_b")
STEPS = {100: "b", 200: "a", 300: "c"}


def mean_log_likelihood(targets, scores):
    """A score metric (seqio calls it with the targets' log-likelihoods)."""
    return {"mean_log_likelihood": float(np.mean(scores))}


@pytest.fixture(scope="module")
def setup(tmp_path_factory, config, params_a, params_b, vocabulary, vocabulary_file):
    from t2t.data.tasks import text

    model = models.model_for(config)
    params = {"a": params_a, "b": params_b, "c": random_params(config, 2)}
    input_ids = [list(vocabulary.encode(t)) + [1] for t in INPUTS]
    root = tmp_path_factory.mktemp("eval")
    targets, paths = {}, {}
    for name, key in zip(TASKS, "ab"):
        outputs = uncached_greedy(model, [params[key]], input_ids, LENGTH)
        targets[name] = [vocabulary.decode(tokens) for tokens in outputs]
        path = paths[name] = root / f"{name}.tsv"
        path.write_text("".join(f"{i}\t{t}\n" for i, t in zip(INPUTS, targets[name])))
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name,
            source=seqio.TextLineDataSource({"validation": str(path)}),
            preprocessors=[
                functools.partial(text.parse_tsv, field_names=("inputs", "targets")),
                seqio.preprocessors.tokenize,
                seqio.preprocessors.append_eos_after_trim,
            ],
            output_features=text.output_features(vocabulary),
            metric_fns=[metrics.accuracy, mean_log_likelihood],
        )
    assert targets[TASKS[0]] != targets[TASKS[1]]
    model_dir = write_model_dir(
        root / "run", config, {step: params[key] for step, key in STEPS.items()}, vocabulary_file
    )
    return model, params, model_dir, paths


def test_evaluator_returns_flat_task_metrics(setup, vocabulary):
    model, params, _, paths = setup
    lines = []
    lengths = {"inputs": 64, "targets": 32}
    evaluator = evaluation.Evaluator(
        model,
        list(TASKS),
        batch_size=2,
        task_feature_lengths=lengths,
        max_decode_length=LENGTH,
        console=lines.append,
    )
    result = evaluator(params["a"], 7)
    assert sorted(result) == sorted(
        f"{t}/{m}" for t in TASKS for m in ("accuracy", "mean_log_likelihood")
    )
    assert result["eval_test_a/accuracy"] == 100.0
    assert result["eval_test_b/accuracy"] < 100.0
    # The score metric sees the targets' log-likelihoods, as the predictor computes them.
    for task in TASKS:
        examples = inference.read_examples(str(paths[task]))
        scores = [
            r["score"]
            for r in inference.score_examples(
                evaluator.predictor,
                params["a"],
                vocabulary,
                examples,
                inputs_length=lengths["inputs"],
                targets_length=lengths["targets"],
            )
        ]
        np.testing.assert_allclose(
            result[f"{task}/mean_log_likelihood"], np.mean(scores), rtol=1e-5
        )
    assert evaluator.history == {7: result}
    assert "eval step 7" in lines[0] and "eval_test_a" in lines[0]


def test_eval_over_a_model_dir_picks_the_best_checkpoint_per_task(setup, capsys):
    model_dir = setup[2]
    # gin/runs/eval.gin evaluates every checkpoint; flags override its other bindings.
    code = cli.main(
        [
            "eval",
            "--gin_file=gin/runs/eval.gin",
            f"--gin.MODEL_DIR='{model_dir}'",
            f"--gin.t2t.runs.evaluate.tasks={list(TASKS)!r}",
            "--batch_size=4",
            f"--max_decode_length={LENGTH}",
        ]
    )
    assert code == 0
    with open(os.path.join(model_dir, "eval", evaluation.RESULTS_FILE)) as f:
        results = json.load(f)
    assert sorted(results["steps"]) == ["100", "200", "300"]
    best = results["best"]["tasks"]
    assert best["eval_test_a"]["best_step"] == 200 and best["eval_test_a"]["score"] > 0
    assert best["eval_test_a"]["best_per_metric"]["accuracy"] == {"step": 200, "value": 100.0}
    assert best["eval_test_b"]["best_per_metric"]["accuracy"] == {"step": 100, "value": 100.0}
    for step in ("100", "300"):
        assert results["steps"][step]["eval_test_a/accuracy"] < 100.0
    out = capsys.readouterr().out
    assert "best checkpoint per task" in out and "eval_test_b" in out
    assert glob.glob(os.path.join(model_dir, "eval", "events.out.tfevents.*"))


def test_best_checkpoints_worked_example():
    # The docstring's example.
    history = {100: {"a/accuracy": 50.0, "b/f1": 70.0}, 200: {"a/accuracy": 60.0, "b/f1": 65.0}}
    best = evaluation.best_checkpoints(history)["tasks"]
    assert (best["a"]["best_step"], best["a"]["score"]) == (200, 60.0)
    assert (best["b"]["best_step"], best["b"]["score"]) == (100, 70.0)


def test_best_checkpoints_average_metric_pairs_and_minimize_losses():
    history = {
        1: {"mrpc/accuracy": 80.0, "mrpc/f1": 90.0, "lm/loss": 3.0},
        2: {"mrpc/accuracy": 86.0, "mrpc/f1": 85.0, "lm/loss": 2.5},
        3: {"mrpc/accuracy": 70.0, "mrpc/f1": 91.0, "lm/loss": 2.7},
    }
    best = evaluation.best_checkpoints(history)["tasks"]
    assert best["mrpc"]["best_step"] == 2  # mean 85.5 beats 85.0 and 80.5
    assert best["mrpc"]["best_per_metric"]["f1"] == {"step": 3, "value": 91.0}
    assert best["lm"]["best_step"] == 2 and best["lm"]["score"] == 2.5


def test_glue_average_of_best_checkpoints():
    tasks = {
        "cola": ["matthews_corrcoef"],
        "sst2": ["accuracy"],
        "mrpc": ["accuracy", "f1"],
        "stsb": ["pearson_corrcoef", "spearman_corrcoef"],
        "qqp": ["accuracy", "f1"],
        "mnli_matched": ["accuracy"],
        "mnli_mismatched": ["accuracy"],
        "qnli": ["accuracy"],
        "rte": ["accuracy"],
    }
    # Step 1 is best for every task but CoLA, whose best (40) is at step 2.
    history = {1: {}, 2: {}}
    for task, names in tasks.items():
        for name in names:
            history[1][f"glue_{task}/{name}"] = 80.0
            history[2][f"glue_{task}/{name}"] = 70.0
    history[1]["glue_cola/matthews_corrcoef"] = 30.0
    history[2]["glue_cola/matthews_corrcoef"] = 40.0
    history[1]["glue_mrpc/f1"] = 90.0
    report = evaluation.best_checkpoints(history)
    assert report["tasks"]["glue_cola"]["best_step"] == 2
    # metrics.glue_average's worked example: (40 + 80 + 85 + 80 * 5) / 8.
    assert report["averages"] == {"glue": pytest.approx(75.625)}


@pytest.mark.parametrize("gin_flags", [[], ["--gin_file=gin/runs/eval.gin"]])
def test_eval_step_flag_overrides_gin_and_explains_a_missing_step(setup, capsys, gin_flags):
    code = cli.main(
        ["eval", *gin_flags, f"--model_dir={setup[2]}", f"--tasks={TASKS[0]}", "--step=150"]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 150; saved steps: [100, 200, 300]" in err
    assert "In call to configurable" not in err  # gin's call-site note is not shown to users


LABELS = ["yes", "no", "maybe so"]


@pytest.fixture(scope="module")
def label_task(setup, vocabulary, tmp_path_factory):
    """A classification task whose every target is the label parameter set A scores highest."""
    from t2t.data.tasks import text

    model, params, _, _ = setup
    predictor = inference.Predictor(model, batch_size=4)
    pairs = [{"inputs": sentence, "targets": label} for sentence in INPUTS for label in LABELS]
    encoded, lengths = inference.encode_examples(
        pairs, vocabulary, inputs_length=64, targets_length=8
    )
    examples = inference.convert(model, encoded, lengths)
    scores = np.array(predictor.score(params["a"], examples)).reshape(len(INPUTS), len(LABELS))
    targets = [LABELS[i] for i in scores.argmax(axis=1)]
    path = tmp_path_factory.mktemp("labels") / "labels.tsv"
    path.write_text("".join(f"{i}\t{t}\n" for i, t in zip(INPUTS, targets)))
    name = "eval_test_labels"
    seqio.TaskRegistry.remove(name)
    seqio.TaskRegistry.add(
        name,
        source=seqio.TextLineDataSource({"validation": str(path)}),
        preprocessors=[
            functools.partial(text.parse_tsv, field_names=("inputs", "targets")),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(vocabulary),
        metric_fns=[metrics.accuracy],
    )
    return name, targets


def test_rank_classification_picks_the_likeliest_label(setup, label_task, vocabulary):
    model, params, _, _ = setup
    name, targets = label_task
    evaluator = evaluation.Evaluator(
        model,
        [name],
        batch_size=2,
        console=None,
        rank_classification=True,
        max_decode_length=LENGTH,
    )
    seen = {vocabulary.decode([t for t in row if t > 1]) for row in evaluator.candidates(name)}
    assert seen == set(targets)  # the labels of the split, nothing else
    assert evaluator(params["a"], 1)[f"{name}/accuracy"] == 100.0
    # An ensemble of A with itself ranks as A does; another parameter set does not.
    assert evaluator((params["a"], params["a"]), 2)[f"{name}/accuracy"] == 100.0
    assert evaluator(params["c"], 3)[f"{name}/accuracy"] < 100.0 or len(set(targets)) == 1


def test_rank_classification_refuses_tasks_it_cannot_rank(setup):
    model, _, _, _ = setup
    with pytest.raises(ValueError, match="not evaluated here"):
        evaluation.Evaluator(model, [TASKS[0]], console=None, rank_classification=["nope"])


def test_t2t_eval_evaluates_an_ensemble_and_ranks_labels(setup, label_task, capsys):
    _, _, model_dir, _ = setup
    name, _ = label_task
    # Checkpoint 200 holds A: an ensemble of it with itself is A; with 100 (B) it is not.
    assert (
        cli.main(
            [
                "eval",
                f"--model_dir={model_dir}",
                f"--tasks={TASKS[0]},{name}",
                "--checkpoints=200,200",
                f"--rank_classification={name}",
                f"--max_decode_length={LENGTH}",
                "--batch_size=2",
            ]
        )
        == 0
    )
    written = json.loads(
        open(os.path.join(model_dir, "eval", evaluation.ENSEMBLE_RESULTS_FILE)).read()
    )
    assert written["members"] == [f"{model_dir}:200", f"{model_dir}:200"]
    assert written["metrics"][f"{TASKS[0]}/accuracy"] == 100.0
    assert written["metrics"][f"{name}/accuracy"] == 100.0
    assert (
        cli.main(
            [
                "eval",
                f"--model_dir={model_dir}",
                f"--tasks={TASKS[0]}",
                "--checkpoints=200,100",
                f"--max_decode_length={LENGTH}",
            ]
        )
        == 0
    )
    mixed = json.loads(
        open(os.path.join(model_dir, "eval", evaluation.ENSEMBLE_RESULTS_FILE)).read()
    )
    assert mixed["members"][1] == f"{model_dir}:100"
    assert "ensemble" not in capsys.readouterr().err.lower()
