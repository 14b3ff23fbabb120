"""Each fine-tuning method as `t2t train` runs it: from a pretrained checkpoint of the built-in
corpus, a few steps on the built-in supervised task with the method's gin file, then the saved
parameters compared bit for bit with the pretrained ones: exactly the intended ones moved.

The network is the suite's micro one (gin/models/micro.gin), so each run takes seconds.
"""

import gin
import jax
import numpy as np
import pytest

from t2t import runs
from t2t.checkpoints import model_dir as model_dir_lib

DEMO = "gin/experiments/tiny_builtin_demo.gin"
FINETUNE = "gin/experiments/tiny_builtin_finetune.gin"
MICRO = "gin/models/micro.gin"  # the suite's shrunk network (1 + 1 layers)
SMALL = [
    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
    "BATCH_SIZE = 8",
    "t2t.runs.LoopOptions.progress = False",
    "t2t.runs.EvalOptions.num_predictions = 0",
]


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    path = tmp_path_factory.mktemp("pretrained")
    runs.configure(
        [DEMO, MICRO],
        [f"MODEL_DIR = '{path}'", *SMALL, "TRAIN_STEPS = 2", "t2t.runs.EvalOptions.every = None"],
    )
    runs.train()
    return str(path)


def finetune(pretrained, model_dir, method_files, *bindings, steps=3):
    runs.configure(
        [FINETUNE, *method_files],
        [
            f"INIT_CHECKPOINT = '{pretrained}'",
            f"MODEL_DIR = '{model_dir}'",
            f"TRAIN_STEPS = {steps}",
            "BATCH_SIZE = 8",
            "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
            "t2t.runs.EvalOptions.every = None",
            "t2t.runs.EvalOptions.evaluators = []",
            "t2t.runs.LoopOptions.progress = False",
            "t2t.runs.EvalOptions.num_predictions = 0",
            "t2t.runs.LoopOptions.log_every = 1",
            *bindings,
        ],
    )
    return runs.train()


def flat_params(model_dir):
    directory = model_dir_lib.ModelDir(model_dir)
    params, metadata = directory.restore_params(None, config=directory.config())
    leaves = jax.tree_util.tree_flatten_with_path(params.to_pure_dict())[0]
    return {"/".join(str(k.key) for k in path): np.asarray(v) for path, v in leaves}, metadata


def is_norm(path):
    return path.endswith("norm/scale")


# method gin file, extra bindings, which parameters may move (path -> bool), additions' prefix
METHODS = {
    "adapters": (
        ["gin/finetuning/adapters.gin"],  # in two microbatches, too
        ["ADAPTER_SIZE = 4", "t2t.runs.LoopOptions.num_microbatches = 2"],
        lambda p: "adapter" in p or is_norm(p),
    ),
    "lora": (["gin/finetuning/lora.gin"], ["LORA_RANK = 2"], lambda p: "lora_" in p),
    "prompt_tuning": (
        ["gin/finetuning/prompt_tuning.gin"],
        ["PROMPT_LENGTH = 3"],
        lambda p: p.startswith("prompt/"),
    ),
    "feature_extraction": (
        ["gin/finetuning/feature_extraction.gin"],
        [],
        lambda p: p.startswith("decoder/"),
    ),
    "new_decoder": (
        ["gin/finetuning/feature_extraction_new_decoder.gin"],
        ["t2t.runs.checkpoint_model_config.num_decoder_layers = 2"],
        lambda p: p.startswith("decoder/"),
    ),
}


@pytest.fixture(scope="module")
def straight_lora(pretrained, tmp_path_factory):
    """3 LoRA steps without a stop: the lora case below and the resume test's reference."""
    path = tmp_path_factory.mktemp("lora")
    files, bindings, _ = METHODS["lora"]
    return path, finetune(pretrained, path, files, *bindings)


@pytest.mark.parametrize("method", list(METHODS))
def test_only_the_methods_parameters_move(pretrained, tmp_path, method, request):
    files, bindings, may_move = METHODS[method]
    if method == "lora":
        tmp_path, summary = request.getfixturevalue("straight_lora")
    else:
        summary = finetune(pretrained, tmp_path, files, *bindings)
    assert summary["last_step"] == 3 and np.isfinite(summary["last_loss"])
    before, _ = flat_params(pretrained)
    after, metadata = flat_params(tmp_path)
    described = metadata["finetuning"]
    moved = {p for p in after if p not in before or not np.array_equal(before[p], after[p])}
    assert moved == {p for p in after if may_move(p)}, sorted(
        moved ^ {p for p in after if may_move(p)}
    )
    assert 0 < described["trainable_parameters"] < described["total_parameters"]
    if method == "new_decoder":  # a new, deeper decoder: not the pretrained one
        assert "decoder/layers_1/mlp/wo/kernel" in after
        assert metadata["initialized_from"]["initialized"]
    if method == "prompt_tuning":
        assert len(metadata["initialized_from"]["prompt_tokens"]) == 3


def test_a_lora_run_resumes_and_continues_exactly(pretrained, straight_lora, tmp_path):
    """Resume composes with the method: 3 steps straight equal 2 steps, stop, 1 more."""
    files, bindings, _ = METHODS["lora"]
    finetune(pretrained, tmp_path / "resumed", files, *bindings, steps=2)
    finetune(pretrained, tmp_path / "resumed", files, *bindings)
    straight, _ = flat_params(straight_lora[0])
    resumed, _ = flat_params(tmp_path / "resumed")
    assert straight.keys() == resumed.keys()
    for path in straight:
        np.testing.assert_array_equal(straight[path], resumed[path], err_msg=path)


SCRIPT = [0.50, 0.60, 0.58, 0.61, 0.59, 0.60, 0.90, 0.95]  # the monitors' docstring example


def scripted_evaluator(model, partitioner):
    """Reports SCRIPT[i] at the i-th evaluation (one per step here), whatever the model."""
    del model, partitioner
    return lambda params, step: {"scripted/accuracy": SCRIPT[step - 1]}


# Registered at import (collection), before any test locks the gin configuration.
gin.external_configurable(scripted_evaluator, "scripted_evaluator")


def watched_run(pretrained, model_dir, *bindings, steps=8):
    return finetune(
        pretrained,
        model_dir,
        [],
        "t2t.runs.EvalOptions.every = 1",
        "t2t.runs.EvalOptions.evaluators = [@scripted_evaluator]",
        "t2t.runs.EvalOptions.tasks = []",
        "t2t.runs.CheckpointOptions.every = 100",
        *bindings,
        steps=steps,
    )


def test_early_stopping_stops_after_patience_and_keeps_the_best(pretrained, tmp_path, capsys):
    stop = [
        "t2t.runs.EvalOptions.early_stopping = @t2t.trainer.EarlyStopping()",
        "t2t.trainer.EarlyStopping.metric = 'scripted/accuracy'",
        "t2t.trainer.EarlyStopping.patience = 2",
    ]
    summary = watched_run(pretrained, tmp_path, *stop)
    assert summary["last_step"] == summary["stopped_early"] == 6
    assert summary["best"]["early_stopping"] == {"value": 0.61, "step": 4}
    directory = model_dir_lib.ModelDir(tmp_path)
    assert 4 in directory.steps() and 6 in directory.steps()  # the best and the last
    assert "stopping early" in capsys.readouterr().out
    again = watched_run(pretrained, tmp_path, *stop)  # a stopped run stays stopped
    assert again["first_step"] == again["last_step"] == 6
    assert "this run stopped early at step 6" in capsys.readouterr().out


def test_reduce_on_plateau_lowers_the_update_scale_after_patience(pretrained, tmp_path):
    from t2t.trainer import reporting

    watched_run(
        pretrained,
        tmp_path,
        "t2t.runs.EvalOptions.reduce_on_plateau = @t2t.trainer.ReduceOnPlateau()",
        "t2t.trainer.ReduceOnPlateau.metric = 'scripted/accuracy'",
        "t2t.trainer.ReduceOnPlateau.patience = 2",
        "t2t.trainer.ReduceOnPlateau.factor = 0.5",
    )
    scales = dict(reporting.read_scalars(str(tmp_path / "train"))["update_scale"])
    # Best 0.61 at eval 4; evals 5 and 6 do not improve: halved after eval 6, seen at step 7.
    assert [scales[s] for s in range(1, 9)] == [1, 1, 1, 1, 1, 1, 0.5, 0.5]
