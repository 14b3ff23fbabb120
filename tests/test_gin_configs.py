"""Every gin file under gin/ parses, finalizes and builds the objects it configures.

Models build their TransformerConfig and model wrapper; objectives name registered tasks with
their feature lengths; run and experiment files build everything `t2t.runs.train` (or
evaluate/infer/export) would receive: network config, model, optimizer on a small parameter
tree, learning-rate schedule. Big presets are built as configs only (no parameters).
"""

import dataclasses
import glob
import json
import os
import re

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import seqio
from flax import nnx

from t2t import models, runs
from t2t import nn as t2t_nn
from t2t.checkpoints import hf
from t2t.nn.config import TransformerConfig
from t2t.runs.externals import EXTERNALS

GIN_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "gin")
FILES = sorted(os.path.relpath(p, GIN_DIR) for p in glob.glob(os.path.join(GIN_DIR, "*/*.gin")))
TRAIN_FILES = [f for f in FILES if f.startswith(("experiments/", "runs/pretrain", "runs/finetune"))]


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    """The gin files import t2t.data.tasks.builtin: point it at the session's built corpus."""
    return builtin_tasks


@pytest.fixture(scope="module")
def hf_directory(tmp_path_factory):
    """A tiny HF T5 directory (random weights, written by the exporter) to fine-tune from."""
    config = t2t_nn.get_preset(
        "tiny",
        vocab_size=256,
        d_model=32,
        d_ff=64,
        num_heads=2,
        d_kv=16,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    model = t2t_nn.build(config, nnx.Rngs(params=0))
    directory = str(tmp_path_factory.mktemp("hf_tiny"))
    hf.export_hf(directory, config, nnx.state(model, nnx.Param))
    return directory


def _parse(files, bindings=()):
    runs.configure(files, list(bindings), finalize=True)


def test_includes_resolve_beside_importable_directories_of_the_same_name(tmp_path, monkeypatch):
    """`make demo` writes runs/demo; `include 'runs/pretrain.gin'` must still find gin/runs/."""
    for name in ("runs", "models"):  # importable as namespace packages, like a model directory
        (tmp_path / name / "demo").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    _parse(["experiments/tiny_builtin_demo.gin"], ["MODEL_DIR = '/tmp/unused'"])
    assert gin.query_parameter("%TRAIN_STEPS") == 500


def test_a_misspelt_macro_binding_is_refused_with_a_suggestion():
    with pytest.raises(
        ValueError,
        match=r"TRAIN_STEP = \.\.\. sets a gin macro that no configuration "
        r"refers to .*Did you mean TRAIN_STEPS\?",
    ):
        _parse(
            ["experiments/tiny_builtin_demo.gin"], ["MODEL_DIR = '/tmp/unused'", "TRAIN_STEP = 10"]
        )
    with pytest.raises(ValueError, match=r"Did you mean TRAIN_STEPS\?"):  # bound as well
        _parse(
            ["experiments/tiny_builtin_demo.gin"],
            ["MODEL_DIR = '/tmp/unused'", "TRAIN_STEPS = 10", "TRAIN_STEP = 10"],
        )
    # Bound macros that the files use (directly, or through another macro) are accepted.
    _parse(
        ["experiments/tiny_builtin_demo.gin"],
        ["MODEL_DIR = '/tmp/unused'", "TRAIN_STEPS = 10", "BATCH_SIZE = 4"],
    )
    assert gin.query_parameter("t2t.runs.train.train_steps") is not None
    assert gin.query_parameter("%TRAIN_STEPS") == 10


def test_a_misspelt_parameter_binding_is_refused_with_a_suggestion():
    """Issue 33: gin's own message named the parameter it did not know and nothing else. For
    `train`, the fields of its option groups are candidates too."""
    with pytest.raises(
        ValueError,
        match=r"named 'batchsize'(.|\n)*Did you mean t2t\.runs\.DataOptions\.batch_size\?",
    ):
        _parse(
            ["experiments/tiny_builtin_demo.gin"],
            ["MODEL_DIR = '/tmp/unused'", "t2t.runs.train.batchsize = 4"],
        )
    with pytest.raises(
        ValueError,
        match=r"t2t\.runs\.train takes: model_dir, train_steps, data, (.|\n)*"
        r"t2t\.runs\.DataOptions\.mixture_or_task",
    ):
        _parse(
            ["experiments/tiny_builtin_demo.gin"],
            ["MODEL_DIR = '/tmp/unused'", "t2t.runs.train.zzzzzz = 4"],
        )
    with pytest.raises(ValueError, match=r"Did you mean t2t\.runs\.CheckpointOptions\.keep\?"):
        _parse(
            ["experiments/tiny_builtin_demo.gin"],
            ["MODEL_DIR = '/tmp/unused'", "t2t.runs.CheckpointOptions.kep = 4"],
        )


@pytest.mark.parametrize(
    "old, new",
    [
        ("checkpoint_every", "t2t.runs.CheckpointOptions.every"),
        ("eval_tasks", "t2t.runs.EvalOptions.tasks"),
        ("max_train_examples", "t2t.runs.DataOptions.max_examples"),
        ("log_every", "t2t.runs.LoopOptions.log_every"),
    ],
)
def test_an_option_bound_by_its_former_name_says_where_it_went(old, new):
    with pytest.raises(ValueError, match=rf"t2t\.runs\.train\.{old} is now {re.escape(new)} "):
        _parse(
            ["experiments/tiny_builtin_demo.gin"],
            ["MODEL_DIR = '/tmp/unused'", f"t2t.runs.train.{old} = 5"],
        )


def test_every_former_option_names_an_existing_field():
    from t2t.runs.train_run import MOVED_OPTIONS, OPTION_GROUPS

    fields = {
        f"t2t.runs.{group.__name__}.{field.name}"
        for group in OPTION_GROUPS
        for field in dataclasses.fields(group)
    }
    assert set(MOVED_OPTIONS.values()) <= fields
    assert len(set(MOVED_OPTIONS.values())) == len(MOVED_OPTIONS)


def test_the_four_kinds_are_all_there():
    kinds = {f.split("/")[0] for f in FILES}
    assert kinds >= {"models", "runs", "objectives", "experiments"}
    presets = {os.path.basename(f)[:-4] for f in FILES if f.startswith("models/")}
    assert presets >= set(t2t_nn.PRESETS), (
        f"presets without a gin file: {set(t2t_nn.PRESETS) - presets}"
    )
    runs_ = {os.path.basename(f)[:-4] for f in FILES if f.startswith("runs/")}
    assert runs_ >= {"pretrain", "finetune", "eval"}


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith("models/")])
def test_model_files_build_their_network(name):
    with open(os.path.join("gin", name)) as f:
        overlay = "MODEL_CONFIG" not in f.read()  # micro.gin: overrides on a preset file's
    _parse(["models/tiny.gin", name] if overlay else [name])
    config = gin.query_parameter("MODEL_CONFIG/macro.value").scoped_configurable_fn()
    assert isinstance(config, TransformerConfig)
    model = models.model_for(config)
    assert model.config is config
    bound = gin.get_bindings("t2t.nn.get_preset")
    overrides = {k: v for k, v in bound.items() if k != "name"}
    # the named preset, with exactly the fields the file overrides changed
    assert config == t2t_nn.get_preset(bound["name"]).replace(**overrides)
    preset = os.path.basename(name)[:-4]
    if preset in t2t_nn.PRESETS:
        assert bound["name"] == preset


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith("objectives/")])
def test_objective_files_name_registered_tasks(name):
    _parse([name])
    task_name = gin.query_parameter("MIXTURE_OR_TASK/macro.value")
    lengths = gin.query_parameter("TASK_FEATURE_LENGTHS/macro.value")
    provider = seqio.get_mixture_or_task(task_name)
    assert set(lengths) <= set(provider.output_features), (task_name, lengths)
    assert all(isinstance(v, int) and v > 0 for v in lengths.values())


def _train_bindings(name, hf_directory, tmp_path):
    files = [name] if not name.startswith("runs/pretrain") else ["models/tiny.gin", name]
    bindings = [f"MODEL_DIR = '{tmp_path}'"]
    with open(os.path.join(GIN_DIR, name)) as f:  # fine-tuning runs start from a checkpoint
        if name == "runs/finetune.gin" or "include 'runs/finetune.gin'" in f.read():
            bindings.append(f"INIT_CHECKPOINT = '{hf_directory}'")
    if name.startswith(("runs/", "studies/profiles/")):  # the data: an objective or experiment
        bindings += [
            "MIXTURE_OR_TASK = 'builtin_package'",
            "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
            "import t2t.data.tasks.builtin",
        ]
    _parse(files, bindings)
    bound = dict(gin.get_bindings("t2t.runs.train"))
    groups = {name: EXTERNALS[f"t2t.runs.{name}"]() for name in ("DataOptions", "EvalOptions")}
    groups["CheckpointOptions"] = EXTERNALS["t2t.runs.CheckpointOptions"]()  # each checks itself
    data = groups["DataOptions"]
    bound.update({field.name: getattr(data, field.name) for field in dataclasses.fields(data)})
    return bound


@pytest.mark.parametrize("name", TRAIN_FILES)
def test_train_files_build_model_optimizer_and_schedule(name, hf_directory, tmp_path):
    bound = _train_bindings(name, hf_directory, tmp_path)
    assert bound["model_dir"] == str(tmp_path)
    assert seqio.get_mixture_or_task(bound["mixture_or_task"]) is not None
    config = bound["model_config"]
    assert isinstance(config, TransformerConfig)
    model = bound["model_fn"](config)
    assert isinstance(model, models.BaseModel)

    rate = bound["learning_rate"]
    values = [float(rate(s)) for s in (0, 1, 100)] if callable(rate) else [float(rate)]
    assert all(np.isfinite(v) and v > 0 for v in values), values
    tx = bound["optimizer"](learning_rate=rate)
    assert isinstance(tx, optax.GradientTransformation)
    params = {"kernel": jnp.ones((4, 256)), "bias": jnp.ones((3,))}
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)

    for evaluator in bound.get("evaluators", ()):
        assert callable(evaluator)
    assert bound["train_steps"] > 0 and bound["batch_size"] > 0


# Files launched on accelerators at the paper's scale, and the CPU runs (demo, tests' tiny runs).
ACCELERATOR_TRAIN_FILES = [
    "experiments/t5_1_1_base_c4.gin",
    "experiments/t5_base_c4_baseline.gin",
    "experiments/t5_1_1_xxl_c4_pod.gin",
    "experiments/hf_t5_finetune_glue.gin",
    "studies/profiles/t5_base_finetune.gin",
    "studies/profiles/t5_base_scratch.gin",
]
CPU_TRAIN_FILES = [
    "experiments/tiny_builtin_demo.gin",
    "experiments/tiny_builtin_finetune.gin",
    "experiments/tiny_builtin_scratch.gin",
]


@pytest.mark.parametrize("name", ACCELERATOR_TRAIN_FILES + CPU_TRAIN_FILES)
def test_paper_scale_files_compute_in_bfloat16_and_cpu_runs_in_float32(
    name, hf_directory, tmp_path
):
    """T5X's accelerator convention (bfloat16 activations and matmuls, float32 parameters) in
    every shipped file that launches a paper-sized run; float32 where a CPU trains."""
    config = _train_bindings(name, hf_directory, tmp_path)["model_config"]
    want = "bfloat16" if name in ACCELERATOR_TRAIN_FILES else "float32"
    assert (config.dtype, config.param_dtype) == (want, "float32")


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith("models/t5_")])
def test_paper_preset_files_compute_in_bfloat16(name):
    _parse([name])
    config = gin.query_parameter("MODEL_CONFIG/macro.value").scoped_configurable_fn()
    assert (config.dtype, config.param_dtype) == ("bfloat16", "float32")


def test_hf_finetune_takes_the_network_of_the_checkpoint(hf_directory, tmp_path):
    bound = _train_bindings("experiments/hf_t5_finetune_glue.gin", hf_directory, tmp_path)
    with open(os.path.join(hf_directory, hf.CONFIG_FILE)) as f:
        assert bound["model_config"].d_model == json.load(f)["d_model"] == 32
    assert bound["init_checkpoint"] == hf_directory


@pytest.mark.parametrize(
    "name,function",
    [("runs/eval.gin", "evaluate"), ("runs/infer.gin", "infer"), ("runs/export.gin", "export")],
)
def test_eval_infer_export_files_bind_their_run_function(name, function, tmp_path):
    _parse([name], [f"MODEL_DIR = '{tmp_path}'"])
    bound = gin.get_bindings(f"t2t.runs.{function}")
    assert bound["model_dir"] == str(tmp_path)


@pytest.mark.parametrize("name", [f for f in FILES if f.startswith("finetuning/")])
def test_finetuning_files_bind_a_method_that_wraps_the_optimizer(name, hf_directory, tmp_path):
    """Each method file, included after a fine-tuning run, builds its network (with its
    additions), its FineTuning, and an optimizer over the real parameters."""
    from t2t.finetuning import FineTuning, depths_of_config

    runs.configure(
        ["runs/finetune.gin", name],
        [
            f"MODEL_DIR = '{tmp_path}'",
            f"INIT_CHECKPOINT = '{hf_directory}'",
            "MIXTURE_OR_TASK = 'builtin_package'",
            "import t2t.data.tasks.builtin",
            "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
        ],
        finalize=True,
    )
    bound = gin.get_bindings("t2t.runs.train")
    method, config = bound["finetuning"], bound["model_config"]
    assert isinstance(method, FineTuning) and not method.is_plain
    params = nnx.state(t2t_nn.build(config, nnx.Rngs(params=0)), nnx.Param)
    tx = method.wrap(
        bound["optimizer"](learning_rate=bound["learning_rate"]), depths_of_config(config)
    )
    updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    assert jax.tree.structure(updates) == jax.tree.structure(params)
    fraction = method.describe(params)["trainable_fraction"]
    additions = {"adapters": "adapter_size", "lora": "lora_rank", "prompt_tuning": "prompt_length"}
    stem = os.path.basename(name)[:-4]
    if stem in additions:
        assert additions[stem] in config.additions and fraction < 0.5
        pack = gin.get_bindings("t2t.runs.DataOptions").get("pack")
        assert stem != "prompt_tuning" or pack is False
    else:
        assert config.additions == {} and 0 < fraction <= 1
