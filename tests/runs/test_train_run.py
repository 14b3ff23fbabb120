"""`t2t train` end to end on the built-in corpus: the demo's loss falls, a diverging run and a
wrong attention kernel stop with messages, and fine-tuning reports the task's metric. (Killed
runs resuming exactly: tests/object_store/test_train_on_gcs.py, SIGKILL during a save, and
benchmarks/fault_injection.py at scale, local and in a bucket.)

Real data pipeline (seqio task, span corruption, packing), real gin files, real checkpoints;
the network is shrunk by gin bindings so the whole module takes about a minute on 2 cores.
"""

import os
import subprocess

import jax
import numpy as np
import pytest

from t2t import cli, models, provenance, runs
from t2t.trainer import loop, reporting

DEMO = "gin/experiments/tiny_builtin_demo.gin"
FINETUNE = "gin/experiments/tiny_builtin_finetune.gin"
MICRO = "gin/models/micro.gin"  # the suite's shrunk network
SMALL = [  # a smaller batch than the demo's, same data and objective
    "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 16}",
    "BATCH_SIZE = 8",
    "t2t.runs.LoopOptions.progress = False",
    "t2t.runs.EvalOptions.num_predictions = 0",
]


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


def _train(model_dir, *bindings):
    runs.configure([DEMO, MICRO], [f"MODEL_DIR = '{model_dir}'", *SMALL, *bindings])
    return runs.train()


def _head_commit():
    """The commit of the checkout these tests run from (None outside one)."""
    done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _losses(model_dir):
    return dict(reporting.read_scalars(os.path.join(model_dir, "train"))["loss"])


def test_demo_loss_falls_well_below_its_start(tmp_path, capsys):
    """The demo configuration (shrunk) on 40 steps: from ~ln(vocab) to well below."""
    argv = [
        "train",
        f"--gin_file={DEMO}",
        f"--gin_file={MICRO}",
        f"--gin.MODEL_DIR='{tmp_path}'",
        *[f"--gin.{b.replace(' = ', '=', 1)}" for b in SMALL],
        "--gin.TRAIN_STEPS=40",
        "--gin.t2t.runs.EvalOptions.every=40",
        "--gin.t2t.runs.CheckpointOptions.every=40",
    ]
    code = cli.main(argv)
    assert code == 0
    losses = _losses(tmp_path)
    assert sorted(losses) == list(range(1, 41))
    first, last = losses[1], np.mean([losses[s] for s in range(36, 41)])
    assert first > 0.9 * np.log(2048)  # starts near a uniform guess over the vocabulary
    assert last < first - 1.5, (first, last)
    printed = capsys.readouterr().out
    assert "trained steps 0 -> 40" in printed and "builtin_span_corruption/loss" in printed
    for name in ("config.gin", "model_config.json", loop.LOSS_CURVE_FILE):
        assert os.path.getsize(tmp_path / name) > 0
    assert "TRAIN_STEPS = 40" in (tmp_path / "config.gin").read_text()
    # The same command again finds the run finished: it says so and trains nothing.
    assert cli.main(argv) == 0
    assert "nothing to train: the model directory is already at step 40" in capsys.readouterr().out
    assert sorted(_losses(tmp_path)) == list(range(1, 41))
    # Each start left what it ran on: the step it started at, the code and the cores.
    starts = provenance.read(str(tmp_path))
    assert [start["step"] for start in starts] == [0, 40]
    assert starts[0]["cpu_threads"] == len(os.sched_getaffinity(0))
    assert starts[0]["cpu"] == provenance.cpu()  # the processor XLA compiled for
    assert starts[0]["packages"]["jax"] == jax.__version__
    assert starts[0]["t2t"]["commit"] == _head_commit()


def test_a_diverging_run_exits_with_a_message_not_a_traceback(tmp_path, capsys):
    """A learning rate of 1e30 blows the parameters up in the first step: exit 1, no checkpoint."""
    code = cli.main(
        [
            "train",
            f"--gin_file={DEMO}",
            f"--gin_file={MICRO}",
            f"--gin.MODEL_DIR='{tmp_path}'",
            *[f"--gin.{b.replace(' = ', '=', 1)}" for b in SMALL],
            "--gin.TRAIN_STEPS=4",
            "--gin.t2t.runs.CheckpointOptions.every=2",
            "--gin.t2t.optim.inverse_sqrt.scale=1e30",
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "t2t train: error: Training stopped at step 1: " in err
    assert "no checkpoint was saved" in err and "start the run again" in err
    assert "Traceback" not in err and "In call to configurable" not in err
    assert not any((tmp_path / "checkpoints").glob("*/"))


def test_an_attention_kernel_off_the_formula_stops_the_run_before_it_trains(
    tmp_path, capsys, monkeypatch
):
    """`attention_check` refusing the device's kernels: exit 2 with its message, nothing
    trained; `check_attention=False` skips the check and trains."""
    from t2t.nn import attention_check

    def refuse(*args, **kwargs):
        raise attention_check.KernelMismatch("the encoder self-attention's bias gradient is off")

    monkeypatch.setattr(attention_check, "check", refuse)
    argv = [
        "train",
        f"--gin_file={DEMO}",
        f"--gin_file={MICRO}",
        f"--gin.MODEL_DIR='{tmp_path}'",
        *[f"--gin.{b.replace(' = ', '=', 1)}" for b in SMALL],
        "--gin.TRAIN_STEPS=2",
    ]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "bias gradient is off" in err and "Traceback" not in err
    assert not any((tmp_path / "checkpoints").glob("*/"))
    skip = ["--gin.t2t.runs.train.check_attention=False", "--gin.t2t.runs.EvalOptions.every=None"]
    assert cli.main([*argv, *skip]) == 0
    assert sorted(_losses(tmp_path)) == [1, 2]


def test_finetune_from_the_demo_reports_the_task_metric(tmp_path, monkeypatch):
    # Every path asks the model wrapper for its converter: training, evaluation, inference.
    asked = []
    own = models.BaseModel.feature_converter

    def spy(self, **kwargs):
        asked.append("inference" if kwargs.get("for_inference") else "training")
        return own(self, **kwargs)

    monkeypatch.setattr(models.BaseModel, "feature_converter", spy)
    pretrained = tmp_path / "pretrained"
    _train(pretrained, "TRAIN_STEPS = 4", "t2t.runs.EvalOptions.every = None")
    runs.configure(
        [FINETUNE],
        [
            f"INIT_CHECKPOINT = '{pretrained}'",
            f"MODEL_DIR = '{tmp_path / 'package'}'",
            "TRAIN_STEPS = 4",
            "BATCH_SIZE = 8",
            "TASK_FEATURE_LENGTHS = {'inputs': 64, 'targets': 8}",
            "t2t.runs.EvalOptions.every = 4",
            "t2t.runs.LoopOptions.progress = False",
            "t2t.runs.EvalOptions.num_predictions = 2",
            "t2t.runs.seqio_evaluator.num_examples = 16",
        ],
    )
    summary = runs.train()
    accuracy = summary["eval"]["builtin_package/accuracy"]
    assert 0.0 <= accuracy <= 100.0
    assert "builtin_package/loss" in summary["eval"]
    assert len(summary["predictions"]) == 2
    assert {"training", "inference"} <= set(asked)  # the train pipeline and the evaluator
    asked.clear()
    source = tmp_path / "in.jsonl"
    source.write_text('{"inputs": "Return the number of items."}\n')
    assert (
        cli.main(
            [
                "infer",
                f"--model_dir={tmp_path / 'package'}",
                f"--input_file={source}",
                f"--output_file={tmp_path / 'out.jsonl'}",
                "--max_decode_length=4",
            ]
        )
        == 0
    )
    assert asked == ["inference"]


def test_an_unquoted_string_binding_is_a_message_not_a_traceback(tmp_path, capsys):
    """`--gin.MODEL_DIR=runs/x` (no inner quotes) is not a Python literal: exit 2 saying how."""
    code = cli.main(["train", f"--gin_file={DEMO}", f"--gin.MODEL_DIR={tmp_path}/x"])
    assert code == 2
    err = capsys.readouterr().err
    assert "t2t train: error: gin could not parse a binding: " in err
    assert "quote strings inside the flag" in err
    assert "<ast." not in err and "Traceback" not in err
    assert not (tmp_path / "x").exists()

    bad = tmp_path / "bad.gin"  # the same mistake in a gin file names the file and line
    bad.write_text("include 'experiments/tiny_builtin_demo.gin'\nMODEL_DIR = runs/x\n")
    assert cli.main(["train", f"--gin_file={bad}"]) == 2
    err = capsys.readouterr().err
    assert f"gin could not parse {bad}, line 2: 'MODEL_DIR = runs/x'" in err
    assert "quote strings, e.g. MODEL_DIR = 'runs/x'" in err


@pytest.mark.parametrize(
    "given, expected",
    [
        ({}, "{home}/.cache/t2t/xla"),
        ({"T2T_CACHE_DIR": "/data/t2t"}, "/data/t2t/xla"),
        ({"T2T_CACHE_DIR": "/data/t2t", "T2T_COMPILATION_CACHE": "/fast/xla"}, "/fast/xla"),
        ({"T2T_COMPILATION_CACHE": "/fast/xla", "JAX_COMPILATION_CACHE_DIR": "/jax"}, "/jax"),
        ({"T2T_COMPILATION_CACHE": "OFF"}, None),
        ({"T2T_COMPILATION_CACHE": "gs://bucket/xla"}, "gs://bucket/xla"),
    ],
)
def test_the_command_keeps_compiled_programs_where_the_environment_says(
    given, expected, monkeypatch
):
    """`t2t`'s persistent compilation cache: JAX's own variable, then t2t's, then the cache
    root; `off` leaves JAX without one. (tests/test_wheel.py sees a run fill it, and
    tests/object_store/test_train_on_gcs.py one in the bucket.)"""
    for name in (
        "JAX_COMPILATION_CACHE_DIR",
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS",
        "JAX_COMPILATION_CACHE_MAX_SIZE",
        "T2T_COMPILATION_CACHE",
        "T2T_CACHE_DIR",
    ):
        monkeypatch.delenv(name, raising=False)  # and restored after
    monkeypatch.setenv("HOME", "/home/user")
    for name, value in given.items():
        monkeypatch.setenv(name, value)
    cli._persistent_compilation_cache()
    if expected is not None:
        expected = expected.format(home="/home/user")
    assert os.environ.get("JAX_COMPILATION_CACHE_DIR") == expected
    if expected and expected.startswith("gs://"):  # no size limit: its lock file needs a disk
        assert os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] == "-1"


@pytest.mark.parametrize(
    "tunables,libc,restarts",
    [
        (None, ("glibc", "2.36"), True),
        ("glibc.malloc.arena_max=2", ("glibc", "2.36"), False),  # the user's own, kept
        ("", ("glibc", "2.36"), False),  # set empty: kept too (glibc's defaults)
        (None, ("glibc", "2.31"), False),  # no hugetlb tunable before 2.35
        (None, ("", ""), False),  # not glibc (musl)
    ],
)
def test_the_command_restarts_itself_with_large_blocks_on_huge_pages(
    tunables, libc, restarts, monkeypatch
):
    """`t2t` runs itself again (exec, same arguments) with glibc's large blocks on huge pages,
    unless GLIBC_TUNABLES is set or the C library cannot take it. (tests/test_wheel.py sees an
    installed `t2t train` record it; benchmarks/cpu_huge_pages.py measures it.)"""
    import platform
    import sys

    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    if tunables is not None:
        monkeypatch.setenv("GLIBC_TUNABLES", tunables)
    monkeypatch.setattr(platform, "libc_ver", lambda: libc)
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setattr(sys, "orig_argv", ["python3", "/venv/bin/t2t", "train", "--x"])
    calls = []
    monkeypatch.setattr(os, "execve", lambda *args: calls.append(args))
    cli._restart_on_huge_pages()
    if restarts:
        [(path, argv, environment)] = calls
        assert path == sys.executable and argv == [sys.executable, "/venv/bin/t2t", "train", "--x"]
        assert environment["GLIBC_TUNABLES"] == cli.HUGE_PAGES == "glibc.malloc.hugetlb=1"
    else:
        assert calls == []
