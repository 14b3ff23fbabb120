"""`t2t study` at micro scale: a 2 x 2 x 1 grid of a few steps runs, is killed, resumes without
rerunning finished runs, and aggregates; `--print_commands` lists runs that, run one by one,
give the same scores; every study file under gin/studies/ parses stage by stage."""

import glob
import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap

import gin
import pytest

from t2t import cli, runs
from t2t.studies import runner

SMALL = [  # a smaller network and shorter runs than the builtin_tiny profile's
    "include 'models/micro.gin'",
    "BATCH_SIZE = 8",
    "t2t.runs.LoopOptions.log_every = 1",
    "t2t.runs.seqio_evaluator.num_examples = 16",
]
MICRO = textwrap.dedent("""
    include 'studies/profiles/builtin_tiny.gin'
    PRETRAIN_STEPS = ["TRAIN_STEPS = 2", "t2t.runs.CheckpointOptions.every = 2"]
    FINETUNE_BINDINGS = ["TRAIN_STEPS = 2", "t2t.runs.EvalOptions.every = 2",
                         "t2t.runs.CheckpointOptions.every = 1",
                         "t2t.runs.EvalOptions.num_predictions = 0", "t2t.runs.LoopOptions.progress = False"]
    t2t.studies.run.tasks = ["builtin_order"]
    t2t.studies.run.seeds = [0, 1]
    t2t.studies.run.name = "micro"
    t2t.studies.run.bindings = %SMALL
    t2t.studies.run.task_feature_lengths = {"builtin_order": {"inputs": 32, "targets": 4}}
    t2t.studies.run.arms = [
        {"name": "pre-trained", "stages": [
            {"name": "pretrain", "gin_files": [%PRETRAIN],
             "bindings": [%PRETRAIN_STEPS, %PRETRAIN_BINDINGS,
                          "TASK_FEATURE_LENGTHS = {'inputs': 32, 'targets': 8}"],
             "share": "study"},
            {"name": "finetune", "gin_files": [%FINETUNE], "bindings": [%FINETUNE_BINDINGS]}]},
        {"name": "no pre-training", "stages": [
            {"name": "scratch", "gin_files": [%SCRATCH], "bindings": [%FINETUNE_BINDINGS]}]},
    ]
    t2t.studies.run.paper = {"table": "1", "column": "GLUE",
                             "rows": {"pre-trained": "Baseline average",
                                      "no pre-training": "No pre-training"}}
""")
STUDIES = sorted(glob.glob("gin/studies/*.gin"))


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


@pytest.fixture
def micro(tmp_path):
    path = tmp_path / "micro.gin"
    path.write_text(f"SMALL = {SMALL!r}\n" + MICRO)
    return str(path)


KILLED_STUDY = textwrap.dedent("""
    import os, signal, sys
    from t2t import cli
    from t2t.data import pipeline

    calls = {"n": 0}
    original = pipeline.InputPipeline.__next__

    def next_or_die(self):  # SIGKILL at the process's `kill_at`-th training batch
        calls["n"] += 1
        if calls["n"] == int(sys.argv[1]):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self)

    pipeline.InputPipeline.__next__ = next_or_die
    cli.main(sys.argv[2:])
""")


def scores(study_dir):
    with open(os.path.join(study_dir, "study.json")) as f:
        result = json.load(f)
    return result, {
        (arm, seed): json.load(open(path))["score"] for arm, seed, path in _score_files(study_dir)
    }


def _score_files(study_dir):
    for path in glob.glob(
        os.path.join(study_dir, "*", "seed*", "builtin_order", runner.SCORE_FILE)
    ):
        parts = path.split(os.sep)
        yield parts[-4], parts[-3], path


def test_a_study_is_killed_resumes_and_aggregates(micro, tmp_path, capsys):
    study_dir = tmp_path / "study"
    argv = ["study", f"--gin_file={micro}", f"--study_dir={study_dir}"]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    # Killed in the third run (per seed a pretraining of 2 and a fine-tuning of 2 batches came
    # before).
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_STUDY, "9", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    first = {(arm, seed) for arm, seed, _ in _score_files(study_dir)}
    assert first == {("pre-trained", "seed0"), ("pre-trained", "seed1")}
    before = {p: os.path.getmtime(p) for _, _, p in _score_files(study_dir)}

    assert cli.main(argv) == 0
    printed = capsys.readouterr().out
    assert "run 3/4" in printed and "(2 done before, ETA " in printed and "run 1/4" not in printed
    assert all(os.path.getmtime(p) == t for p, t in before.items())  # not rerun
    result, found = scores(study_dir)
    assert len(found) == 4 and result["missing"] == []
    assert result["arms"]["pre-trained"]["suite"]["n"] == 2
    assert result["paper"]["compared"] == 1
    for name in ("study.md", "study.png", "baselines.json"):
        assert os.path.getsize(study_dir / name) > 0
    assert "| constant baseline |" in (study_dir / "study.md").read_text()

    # Each stage trained here recorded its steps and wall time; the killed one only what the
    # resuming invocation trained. A third seed's plan is timed from them.
    records = [
        r
        for path in glob.glob(str(study_dir / "**" / "chain.json"), recursive=True)
        for r in json.load(open(path))["stages"]
        if not r.get("skipped")
    ]
    assert {r["train_steps"] for r in records} == {2}
    assert {r["task"] for r in records} == {"builtin_span_corruption", "builtin_order"}
    assert all(0 < r["trained_steps"] <= 2 and r["seconds"] > 0 for r in records)
    assert all(r["stopped_seconds"] == 0 for r in records)  # none was stopped (t2t.stopwatch)
    assert cli.main([*argv, "--seeds=0,1,2", "--plan"]) == 0
    printed = capsys.readouterr().out
    assert "Wall time: 2 runs left, 3 stages to train (6 steps): about" in printed
    assert "scratch on builtin_order: 1 x 2 steps at" in printed
    assert "(median of 2 timed)" in printed and "closer estimate" not in printed

    # Seed 0's run of the arm without pretraining, printed and run command by command, gives
    # the same score (one arm: the printed pretraining is a command like any other).
    by_hand = [*argv[:2], f"--study_dir={tmp_path / 'by_hand'}", "--seeds=0"]
    assert cli.main([*by_hand, "--print_commands"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(commands) == 3  # the shared pretraining, then one run per arm
    assert cli.main([*by_hand, "--arms=no pre-training", "--print_commands"]) == 0
    scratch = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(scratch) == 1 and scratch[0] in commands
    assert cli.main(shlex.split(scratch[0])[1:]) == 0
    assert cli.main([*by_hand, "--arms=no pre-training", "--aggregate_only"]) == 0
    again, _ = scores(tmp_path / "by_hand")
    assert (
        again["arms"]["no pre-training"]["tasks"]["builtin_order"]["mean"]
        == found[("no_pre-training", "seed0")]
    )


@pytest.mark.parametrize("path", STUDIES, ids=[os.path.basename(p) for p in STUDIES])
def test_every_study_file_parses_and_builds_its_stages(path):
    """Each arm's stages (for one task and seed) parse and finalize as the runs would."""
    runs.configure([path], [])
    bound = gin.get_bindings("t2t.studies.run")
    tasks, arms = bound["tasks"], bound["arms"]
    assert tasks and len({a["name"] for a in arms}) == len(arms) >= 2
    seen = set()
    for arm in arms:
        stages = runner.expand(
            arm,
            tasks[0],
            0,
            "/tmp/unused_study",
            bound.get("bindings", ()),
            bound.get("task_feature_lengths"),
            bound.get("corpus", "builtin"),
        )
        previous = None
        for stage in stages:
            bindings = [f"MODEL_DIR = '{stage.directory}'", *stage.bindings]
            if previous:
                bindings.append(f"INIT_CHECKPOINT = '{previous}'")
            key = (tuple(stage.gin_files), tuple(b for b in bindings if "MODEL_DIR" not in b))
            if key not in seen:
                seen.add(key)
                runs.configure(stage.gin_files, bindings)
                assert gin.query_parameter("t2t.runs.train.train_steps") is not None
            previous = stage.directory + "@last"
        runs.configure([path], [])
    if "paper" in bound:
        from t2t.studies import paper

        spec = bound["paper"]
        for arm, row in spec.get("rows", {}).items():
            assert arm in {a["name"] for a in arms}
            assert paper.value(spec["table"], row, spec.get("column", "GLUE")) is not None


def test_shared_stages_train_once_where_their_share_says():
    """`share`: per seed for the arm (none), per seed for all arms ("study"), once for the arm
    ("seeds") or once for the study ("all"), the last two with seed 0 whatever the restart."""

    def arm(name, share):
        pretrain = {"name": "pretrain", "gin_files": ["p.gin"], "bindings": ["A = '{seed}'"]}
        if share:
            pretrain["share"] = share
        return {"name": name, "stages": [pretrain, {"name": "finetune", "gin_files": ["f.gin"]}]}

    def pretrain_of(share, arm_name, seed):
        stage = runner.expand(arm(arm_name, share), "t", seed, "/s", (), None)[0]
        return stage.directory, list(stage.bindings)

    assert pretrain_of(None, "x", 2) == (
        "/s/x/seed2/pretrain",
        ["A = '2'", "t2t.runs.train.seed = 2"],
    )
    assert (
        pretrain_of("study", "x", 2)[0]
        == pretrain_of("study", "y", 2)[0]
        == "/s/shared/seed2/pretrain"
    )
    assert (
        pretrain_of("seeds", "x", 2)
        == pretrain_of("seeds", "x", 1)
        == ("/s/x/pretrain", ["A = '0'", "t2t.runs.train.seed = 0"])
    )
    assert (
        pretrain_of("all", "x", 2)
        == pretrain_of("all", "y", 1)
        == ("/s/shared/pretrain", ["A = '0'", "t2t.runs.train.seed = 0"])
    )
    finetune = runner.expand(arm("x", "all"), "t", 2, "/s", (), None)[1]
    assert finetune.directory == "/s/x/seed2/t/finetune"
    assert "t2t.runs.train.seed = 2" in finetune.bindings
    with pytest.raises(ValueError, match="share 'sometimes'"):
        pretrain_of("sometimes", "x", 0)


def test_arms_selects_a_subset_of_the_study(micro, tmp_path, capsys):
    argv = ["study", f"--gin_file={micro}", f"--study_dir={tmp_path / 's'}", "--seeds=0"]
    assert cli.main([*argv, "--arms=no pre-training", "--print_commands"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(commands) == 1 and "no_pre-training" in commands[0]
    with pytest.raises(ValueError, match=r"No arms \['typo'\]"):
        runs.configure([micro], [])
        runner.run(study_dir=str(tmp_path / "s"), only_arms=["typo"], print_commands=True)


@pytest.mark.parametrize(
    "change, message",
    [
        # An arm without "name" raised KeyError: 'name' (exit 1 with a stack) before issue 33.
        (('{"name": "no pre-training", "stages"', '{"title": "x", "stages"'), "lacks ['name']"),
        (
            (
                '{"name": "no pre-training", "stages": [',
                '{"name": "no pre-training", "stages": 3, "x": [',
            ),
            "stages must be",
        ),
        # A study file that binds no tasks got gin's RuntimeError (exit 1) before issue 33.
        (None, "['tasks']. Bind each in a gin file (`studies.run.tasks = ...`)"),
        # Issue 51: tasks = [] raised ZeroDivisionError (exit 1) and wrote an empty study.md.
        (
            ('t2t.studies.run.tasks = ["builtin_order"]', "t2t.studies.run.tasks = []"),
            "t2t.studies.run.tasks must be a non-empty list of task names, got []",
        ),
        (
            ("t2t.studies.run.seeds = [0, 1]", "t2t.studies.run.seeds = []"),
            "t2t.studies.run.seeds must be a non-empty list of integers, got []",
        ),
    ],
)
def test_a_malformed_study_file_exits_2_with_what_to_fix(micro, tmp_path, capsys, change, message):
    broken = tmp_path / "broken.gin"
    if change is None:  # arms, no tasks, no profile
        broken.write_text(
            't2t.studies.run.arms = [{"name": "a", "stages": [{"name": "s", "gin_files": '
            '["experiments/tiny_builtin_demo.gin"]}]}]\n'
        )
    else:
        old, new = change
        text = open(micro).read()
        assert old in text
        broken.write_text(text.replace(old, new))
    study_dir = tmp_path / "s"
    study_dir.mkdir()
    (study_dir / "study.md").write_text("an earlier study's results")
    for mode in ("--print_commands", "--aggregate_only"):
        argv = ["study", f"--gin_file={broken}", f"--study_dir={study_dir}", mode]
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert (study_dir / "study.md").read_text() == "an earlier study's results"


def test_a_broken_arm_is_refused_before_any_run_trains(micro, tmp_path, capsys):
    """Issue 33: a study built its runs' stages as it reached them, so a broken arm failed only
    after the arms before it had trained. Every (arm, task) chain is now checked first."""
    text = open(micro).read()
    old = '{"name": "scratch", "gin_files": [%SCRATCH], "bindings": [%FINETUNE_BINDINGS]}'
    assert old in text
    broken = tmp_path / "broken.gin"
    broken.write_text(
        text.replace(old, old.replace("[%FINETUNE_BINDINGS]", '["t2t.runs.train.seeed = 1"]'))
    )
    study_dir = tmp_path / "s"
    assert cli.main(["study", f"--gin_file={broken}", f"--study_dir={study_dir}"]) == 2
    err = capsys.readouterr().err
    assert "Study arm 'no pre-training'" in err and "Did you mean t2t.runs.train.seed" in err
    assert "Traceback" not in err
    assert not glob.glob(str(study_dir / "**" / "checkpoints"), recursive=True)  # none trained
