"""The fault-injection harness's machinery at micro scale (its runs are a script with committed
results, benchmarks/results/fault_injection*.json): the chain and study it stops are valid t2t
inputs, it finds every model directory of a chain or study, and its verdict fails on any
difference in a directory, a missing directory or a score."""

import importlib.util
import os
import signal

import numpy as np
import pytest

from t2t import cli
from t2t.studies import runner  # noqa: F401 (its configurables exist before a run locks gin)

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "fault_injection", os.path.join(REPO, "benchmarks", "fault_injection.py")
)
harness = importlib.util.module_from_spec(spec)
spec.loader.exec_module(harness)


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


def _argv(target, tmp_path):
    path = harness.write_spec(target, str(tmp_path), steps=4, checkpoint_every=2)
    argv = harness.command(str(tmp_path / "run"), 4, 2, target, path)
    assert argv[1:4] == ["-m", "t2t.cli", target]
    return argv[3:]


def test_the_chain_it_stops_has_two_stages_and_passes_validation(tmp_path, capsys):
    assert cli.main([*_argv("chain", tmp_path), "--dry_run"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(commands) == 2
    assert "micro_run.gin" in commands[0] and "tiny_builtin_finetune.gin" in commands[1]
    assert all("TRAIN_STEPS=4" in c and "CheckpointOptions.every=2" in c for c in commands)


def test_the_study_it_stops_has_three_runs_and_passes_validation(tmp_path, capsys):
    assert cli.main([*_argv("study", tmp_path), "--print_commands"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(commands) == 3  # the shared pretraining, a fine-tuning, a run from scratch


def test_model_dirs_finds_every_stage_and_run_and_nothing_inside_them(tmp_path):
    for path in (
        "a/pretrain/checkpoints/2/x",
        "a/pretrain/train/events",
        "b/seed0/x/train/events",
        "c/eval/events",
        "d/damaged_checkpoints/3/x",
    ):
        os.makedirs(tmp_path / os.path.dirname(path), exist_ok=True)
        (tmp_path / path).write_text("")
    assert harness.model_dirs(str(tmp_path)) == ["a/pretrain", "b/seed0/x", "d"]
    assert harness.model_dirs(str(tmp_path / "a" / "pretrain")) == ["."]


@pytest.mark.parametrize(
    "codes, number, process, expected",
    [
        ([0], None, 0, True),
        ([2], None, 0, True),  # a store that kept failing: a message
        ([1], None, 0, False),  # a bug
        ([-9], signal.SIGKILL, 0, True),
        ([75], signal.SIGTERM, 0, True),
        ([0, -9], signal.SIGKILL, 1, True),  # the peer had finished before the kill
        ([1, -9], signal.SIGKILL, 1, False),  # the peer reported a bug
        ([76, -9], signal.SIGKILL, 1, True),
        ([-9, -6], signal.SIGKILL, 0, True),  # process 0 lost: JAX ends the other at once
        ([75, 75], signal.SIGTERM, 1, True),
        ([76, 75], signal.SIGTERM, 1, True),  # stopped at once in start-up: its peer finds it lost
        ([75, 1], signal.SIGTERM, 1, False),
        ([-15], signal.SIGTERM, 0, True),  # before t2t's handler was set
    ],
)
def test_the_exit_codes_each_stop_expects(codes, number, process, expected):
    assert harness.expected_exit(codes, number, process) is expected


def _outcome(loss=1.0, accuracy=0.5, weight=0.0):
    evals = {"task/accuracy": [(2, accuracy)]}
    return {1: 2.0, 2: loss}, evals, [np.full((2, 2), weight, np.float32)]


@pytest.mark.parametrize(
    "change",
    ["loss", "eval", "params", "missing directory", "extra directory", "score", "step"],
)
def test_the_verdict_is_exact_only_when_everything_agrees(change):
    reference = {"pretrain": _outcome(), "finetune": _outcome(), "scores": {"arm/seed0": 0.25}}
    assert harness.same_all(reference, dict(reference))["exact"]
    got = dict(reference)
    if change == "loss":
        got["finetune"] = _outcome(loss=1.0 + 1e-7)
    elif change == "eval":
        got["finetune"] = _outcome(accuracy=0.75)
    elif change == "params":
        got["pretrain"] = _outcome(weight=1e-30)
    elif change == "missing directory":
        del got["finetune"]
    elif change == "extra directory":
        got["again"] = _outcome()
    elif change == "score":
        got["scores"] = {"arm/seed0": 0.5}
    else:
        losses, evals, params = _outcome()
        got["pretrain"] = ({**losses, 3: 0.5}, evals, params)
    assert not harness.same_all(got, reference)["exact"]


TWO_COMMANDS = """
import json, sys
from t2t import cli
assert cli.main(json.loads(sys.argv[1]) + ["--dry_run"]) == 0
sys.exit(cli.main(json.loads(sys.argv[2]) + ["--print_commands"]))
"""


def test_two_commands_in_one_process_a_study_after_a_chain(tmp_path):
    # The chain locks gin's configuration; the study's runner, imported after, registers its
    # configurables all the same (it raised "Attempted to add a new configurable after the
    # config was locked", exit 1).
    import json
    import subprocess
    import sys

    chain, study = _argv("chain", tmp_path), _argv("study", tmp_path)
    done = subprocess.run(
        [sys.executable, "-c", TWO_COMMANDS, json.dumps(chain), json.dumps(study)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": REPO},
        cwd=REPO,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "internal error" not in done.stderr


def test_a_sigterm_message_is_traced_to_its_model_directory():
    said = (
        "t2t chain: stopped by SIGTERM at step 5; its checkpoint is saved in "
        "/w/episode_0/finetune/checkpoints. Run the same command again to resume from it."
    )
    found = harness._SIGTERM_SAVED.search(said)
    assert int(found.group(1)) == 5
    assert harness._model_dir_of(found.group(2), "/w/episode_0") == "finetune"
    assert harness._model_dir_of("/w/run/checkpoints", "/w/run") == "."
    assert harness._model_dir_of("gs://b/episode_0/pretrain/checkpoints", "gs://b/episode_0") == (
        "pretrain"
    )
