"""`t2t chain`: stages run in order, each from the previous stage's selected checkpoint, exactly;
a chain killed in the middle of a stage resumes and ends as an uninterrupted one; every chain
file under gin/chains/ parses stage by stage (dry run)."""

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from t2t import chain, cli
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.checkpoints.manager import CheckpointManager

from .test_runs import MICRO, SMALL, flat_params

CHAINS = sorted(glob.glob("gin/chains/*.gin"))
FINETUNE = "experiments/tiny_builtin_finetune.gin"
COMMON = [
    "TRAIN_STEPS = 3",
    "BATCH_SIZE = 8",
    "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}",
    "t2t.runs.EvalOptions.evaluators = []",
    "t2t.runs.LoopOptions.progress = False",
    "t2t.runs.EvalOptions.num_predictions = 0",
    "t2t.runs.LoopOptions.log_every = 1",
    "t2t.runs.CheckpointOptions.every = 1",
    "t2t.runs.EvalOptions.every = 1",
    "t2t.runs.EvalOptions.steps = 1",
]
STAGES = [
    {
        "name": "one",
        "gin_files": [FINETUNE],
        "bindings": [
            "MIXTURE_OR_TASK = 'builtin_summarize'",
            "EVAL_TASKS = ['builtin_summarize']",
            "t2t.runs.CheckpointOptions.best_metrics = {}",
        ],
        "select": "builtin_summarize/loss",
    },
    {
        "name": "two",
        "gin_files": [FINETUNE],
        "bindings": ["EVAL_TASKS = []", "t2t.runs.EvalOptions.every = None"],
    },
    {
        "name": "frozen",
        "gin_files": [FINETUNE],  # trains nothing: ends where it started
        "bindings": [
            "TRAIN_STEPS = 1",
            "EVAL_TASKS = []",
            "t2t.runs.EvalOptions.every = None",
            "t2t.runs.train.finetuning = @t2t.finetuning.FineTuning()",
            "t2t.finetuning.FineTuning.frozen = ['all']",
        ],
    },
]


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    from t2t import runs

    path = tmp_path_factory.mktemp("pretrained")
    runs.configure(
        ["gin/experiments/tiny_builtin_demo.gin", MICRO],
        [f"MODEL_DIR = '{path}'", *SMALL, "TRAIN_STEPS = 2", "t2t.runs.EvalOptions.every = None"],
    )
    runs.train()
    return str(path)


KILLED_CHAIN = textwrap.dedent("""
    import json, os, signal, sys
    from t2t import chain
    from t2t.data import pipeline

    kill_at = int(sys.argv[1])
    calls = {"n": 0}
    original = pipeline.InputPipeline.__next__

    def next_or_die(self):  # SIGKILL when training batch `kill_at` of the process is asked for
        calls["n"] += 1
        if calls["n"] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self)

    pipeline.InputPipeline.__next__ = next_or_die
    chain.run(sys.argv[2], json.loads(sys.argv[3]), init_checkpoint=sys.argv[4],
              bindings=json.loads(sys.argv[5]))
""")


def test_a_chain_starts_each_stage_from_the_selection_and_resumes_exactly(pretrained, tmp_path):
    bindings = COMMON  # the network is the pretrained one's (the suite's micro network)
    straight = tmp_path / "straight"
    result = chain.run(str(straight), STAGES, init_checkpoint=pretrained, bindings=bindings)
    one, two, frozen = result["stages"]
    # Stage one kept its best checkpoint by eval loss; two started from exactly that step.
    manager = CheckpointManager(one["model_dir"], read_only=True)
    losses = {s: manager.metrics(s)["builtin_summarize/loss"] for s in manager.all_steps()}
    manager.close()
    assert len(losses) == 3  # every step evaluated and kept (the best, and the last two)
    best = min(losses, key=losses.get)
    assert one["selected_step"] == best
    assert model_dir_lib.ModelDir(two["model_dir"]).metadata()["initialized_from"] == {
        "kind": "t2t",
        "path": one["model_dir"],
        "step": best,
    }
    assert two["init_checkpoint"] == f"{one['model_dir']}@best:builtin_summarize/loss"
    # The frozen stage's parameters are its initial ones: stage two's last, bit for bit.
    last_two, _ = flat_params(two["model_dir"])
    start_frozen, _ = flat_params(frozen["model_dir"])
    assert last_two.keys() == start_frozen.keys()
    for path in last_two:
        np.testing.assert_array_equal(last_two[path], start_frozen[path], err_msg=path)
    record = json.loads((straight / chain.CHAIN_FILE).read_text())
    assert [s["name"] for s in record["stages"]] == ["one", "two", "frozen"]

    # Killed in stage two (its second training batch: stage one read three), then resumed.
    resumed = tmp_path / "resumed"
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    killed = subprocess.run(
        [
            sys.executable,
            "-c",
            KILLED_CHAIN,
            "5",
            str(resumed),
            json.dumps(STAGES),
            pretrained,
            json.dumps(bindings),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    again = chain.run(str(resumed), STAGES, init_checkpoint=pretrained, bindings=bindings)
    assert again["stages"][0]["skipped"] and not again["stages"][1]["skipped"]
    for stage in ("two", "frozen"):
        expected, _ = flat_params(straight / stage)
        got, _ = flat_params(resumed / stage)
        for path in expected:
            np.testing.assert_array_equal(got[path], expected[path], err_msg=f"{stage} {path}")


@pytest.mark.parametrize("path", CHAINS, ids=[os.path.basename(p) for p in CHAINS])
def test_every_chain_file_parses_stage_by_stage(path, tmp_path, capsys, hf_tiny):
    flags = [f"--gin.MODEL_DIR='{tmp_path}'"]
    with open(path) as f:
        if "INIT_CHECKPOINT = %gin.REQUIRED" in f.read():
            flags.append(f"--gin.INIT_CHECKPOINT='{hf_tiny}'")
    assert cli.main(["chain", f"--gin_file={path}", "--dry_run", *flags]) == 0
    commands = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t train")
    ]
    assert len(commands) >= 2
    assert all("--gin.MODEL_DIR=" in c for c in commands)
    assert all("--gin.INIT_CHECKPOINT=" in c for c in commands[1:])


@pytest.fixture(scope="module")
def hf_tiny(tmp_path_factory):
    from flax import nnx

    import t2t.nn as tn
    from t2t.checkpoints import hf

    config = tn.get_preset(
        "tiny",
        vocab_size=256,
        d_model=32,
        d_ff=64,
        num_heads=2,
        d_kv=16,
        num_encoder_layers=1,
        num_decoder_layers=1,
    )
    directory = str(tmp_path_factory.mktemp("hf_tiny"))
    hf.export_hf(directory, config, nnx.state(tn.build(config, nnx.Rngs(params=0)), nnx.Param))
    return directory


def test_a_stage_prefixed_binding_reaches_that_stage_only():
    split = chain._split_bindings(
        [
            "two: TRAIN_STEPS = 9",
            "BATCH_SIZE = 8",
            "t2t.runs.CheckpointOptions.best_metrics = {'a/b': 'max'}",
        ],
        ["one", "two"],
    )
    assert split["one"] == [
        "BATCH_SIZE = 8",
        "t2t.runs.CheckpointOptions.best_metrics = {'a/b': 'max'}",
    ]
    assert split["two"] == [
        "TRAIN_STEPS = 9",
        "BATCH_SIZE = 8",
        "t2t.runs.CheckpointOptions.best_metrics = {'a/b': 'max'}",
    ]


def test_checkpoint_specs_name_a_step(tmp_path):
    from t2t.trainer import sources

    assert sources.resolve("/runs/a@1200") == ("/runs/a", 1200)
    assert sources.resolve("/runs/a@last") == ("/runs/a", None)
    assert sources.resolve("/runs/a") == ("/runs/a", None)
    odd = tmp_path / "name@3"  # an existing directory is taken as it is
    odd.mkdir()
    assert sources.resolve(str(odd)) == (str(odd), None)
    with pytest.raises(ValueError, match="No checkpoint of .* was saved with 'x/accuracy'"):
        sources.best_step(str(tmp_path), "x/accuracy")


@pytest.mark.parametrize(
    "stage_two, message",
    [
        ({"gin_files": ["experiments/no_such_file.gin"]}, "no_such_file.gin"),
        ({"bindings": ["MIXTURE_OR_TASK = 'builtin_summarise'"]}, "builtin_summarize"),
        (
            {"bindings": ["t2t.runs.train.batchsize = 4"]},
            "Did you mean t2t.runs.DataOptions.batch_size",
        ),
    ],
)
def test_a_broken_later_stage_is_refused_before_the_first_stage_trains(
    pretrained, tmp_path, capsys, stage_two, message
):
    """Issue 33: a typo in stage 2 exited 2 only after stage 1 had trained (hours, for real
    stages). Every stage is now checked first: gin files, bindings, tasks."""
    stages = [dict(STAGES[0]), {**STAGES[1], **stage_two}]
    if "bindings" in stage_two:
        stages[1]["bindings"] = [*STAGES[1]["bindings"], *stage_two["bindings"]]
    argv = [
        "chain",
        "--gin_file=gin/chains/stilts_builtin.gin",
        f"--gin.MODEL_DIR='{tmp_path / 'chain'}'",
        f"--gin.INIT_CHECKPOINT='{pretrained}'",
        f"--gin.t2t.chain.run.stages={stages!r}",
        *[f"--stage_gin={b}" for b in [*SMALL[:6], *COMMON]],
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Chain stage 'two'" in err and message in err and "Traceback" not in err, err
    assert not (tmp_path / "chain" / "one").exists()  # nothing trained


def test_a_chain_from_a_missing_checkpoint_is_refused(tmp_path, capsys):
    with pytest.raises(Exception, match="INIT_CHECKPOINT .* does not exist"):
        chain.validate(str(tmp_path), STAGES, init_checkpoint=str(tmp_path / "nowhere"))


def test_a_stage_command_line_turns_import_and_include_lines_into_flags():
    from t2t import chain

    line = chain.command_line(
        ["experiments/tiny_builtin_demo.gin"],
        ["import my_tasks", "include 'models/micro.gin'", "MODEL_DIR = 'runs/x'"],
    )
    assert line == (
        "t2t train --gin_file=experiments/tiny_builtin_demo.gin --import=my_tasks "
        "--gin_file=models/micro.gin \"--gin.MODEL_DIR='runs/x'\""
    )
