"""Reusing another study's runs (`t2t.studies.reuse`): taken only where the commands, the code
(comments and docstrings aside) and the environment are the same, on study directories and git
histories the tests write."""

import json
import subprocess

import pytest

from t2t import chain, cli
from t2t.studies import reuse, runner

COMMIT = "c0ffee" * 6 + "c0ff"
HERE = {
    "t2t": {"version": "0.1.0", "commit": COMMIT, "dirty": False},
    "python": "3.11.7",
    "packages": {"jax": "0.10.2", "numpy": "2.4.6"},
    "platform": "cpu",
    "device_kind": "cpu",
    "devices": 1,
    "local_devices": 1,
    "processes": 1,
    "cpu_threads": 1,
    "cpu": {"model": "Intel(R) Xeon(R) Processor", "isa": ["amx_bf16", "avx2", "avx512f"]},
    "host": "vm",
    "variables": {"JAX_COMPILATION_CACHE_DIR": "/here/cache", "XLA_FLAGS": ""},
}
STUDY = """
include 'studies/profiles/builtin_tiny.gin'
t2t.studies.run.tasks = ["builtin_order"]
t2t.studies.run.pretrainings = [0, 1]
t2t.studies.run.seeds = [0]
t2t.studies.run.arms = [
  {"name": "NAME", "stages": [
    {"name": "pretrain", "gin_files": [%PRETRAIN], "bindings": [%PRETRAIN_STEPS], "share": "seeds"},
    {"name": "finetune", "gin_files": [%FINETUNE], "bindings": [%FINETUNE_BINDINGS]}]},
  {"name": "scratch", "stages": [{"name": "scratch", "gin_files": [%SCRATCH]}]}]
"""


def _records(arm, task, seed, pretraining, study_dir):
    stages = runner.expand(arm, task, seed, study_dir, (), None, pretraining=pretraining)
    cell = runner.Cell(arm, task, seed, pretraining)
    return [r for _, _, r in chain.validate(runner._run_dir(study_dir, cell), stages)]


def _write_run(where, relative, records, score, starts):
    """A finished run as a study leaves it, its directories named as when it trained (under
    `relative`) though it now lies under `where`."""
    run = where / records[-1]["model_dir"][len(relative) + 1 :].rsplit("/", 1)[0]
    run.mkdir(parents=True, exist_ok=True)
    (run / reuse.CHAIN_FILE).write_text(json.dumps({"stages": records}))
    (run / reuse.SCORE_FILE).write_text(json.dumps({"score": score}))
    for record in records:
        stage = where / record["model_dir"][len(relative) + 1 :]
        stage.mkdir(parents=True, exist_ok=True)
        (stage / "environment.json").write_text(json.dumps({"starts": starts}))


def _git(repo, *args, input=None):
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, input=input
    ).stdout.strip()


def _commit(repo, name, text):
    path = repo / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", name)
    return _git(repo, "rev-parse", "HEAD")


@pytest.fixture
def repo(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _commit(repo, "gin/x.gin", "# a comment\nA = 1\n")
    _commit(repo, "gin/studies/s.gin", "t2t.studies.run.seeds = [0]\n")
    first = _commit(repo, "t2t/a.py", '"""Doc."""\n\ndef f(x):\n    """Doc."""\n    return x + 1\n')
    return repo, first


def test_code_differs_only_where_it_runs_differently(repo):
    repo, first = repo
    # Comments, docstrings, blank lines, gin comments and study files: the same code.
    _commit(repo, "t2t/a.py", '"""Other doc."""\n\n\ndef f(x):  # note\n    return x + 1\n')
    _commit(repo, "gin/x.gin", "A = 1\n\n# another comment\n")
    _commit(repo, "gin/studies/s.gin", "t2t.studies.run.seeds = [0, 1]\n")
    # The study runner and the command line: what they set that changes numbers is compared
    # apart (commands, environment variables), and the runner scores a reused run again.
    _commit(repo, "t2t/studies/runner.py", "SCORE = 1\n")
    same = _commit(repo, "t2t/cli/flags.py", "FLAG = 1\n")
    assert reuse.code_differences(first, same, str(repo)) == []
    changed = _commit(repo, "t2t/a.py", '"""Doc."""\n\ndef f(x):\n    return x + 2\n')
    assert reuse.code_differences(first, changed, str(repo)) == ["t2t/a.py"]
    rebound = _commit(repo, "gin/x.gin", "A = 2\n")
    assert reuse.code_differences(changed, rebound, str(repo)) == ["gin/x.gin"]
    added = _commit(repo, "t2t/b.py", "B = 1\n")
    assert reuse.code_differences(rebound, added, str(repo)) == ["t2t/b.py"]
    # Asked from inside the checkout, the paths are still the checkout's.
    assert reuse.code_differences(first, added, str(repo / "t2t")) == [
        "gin/x.gin",
        "t2t/a.py",
        "t2t/b.py",
    ]
    with pytest.raises(subprocess.CalledProcessError):
        reuse.code_differences(first, "f" * 40, str(repo))
    tree = _git(repo, "mktree", input="")
    empty = _git(repo, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", tree, "-m", "x")
    with pytest.raises(subprocess.CalledProcessError):  # no t2t/: not a diff of this project
        reuse.code_differences(first, empty, str(repo))


def test_the_default_checkout_is_the_one_holding_this_package():
    import os

    assert os.path.isfile(os.path.join(reuse.checkout(), "t2t", "studies", "reuse.py"))


def test_a_run_is_taken_only_with_the_same_commands_code_and_environment(tmp_path, repo):
    repo, first = repo
    comments_only = _commit(repo, "t2t/a.py", '"""Doc 2."""\n\ndef f(x):\n    return x + 1\n')
    other_code = _commit(repo, "t2t/a.py", "def f(x):\n    return x - 1\n")
    here = {**HERE, "t2t": {**HERE["t2t"], "commit": comments_only}}
    arm = {
        "name": "a",
        "stages": [
            {
                "name": "pretrain",
                "gin_files": ["experiments/tiny_builtin_demo.gin"],
                "bindings": ["TRAIN_STEPS = 10"],
                "share": "seeds",
            },
            {"name": "finetune", "gin_files": ["experiments/tiny_builtin_finetune.gin"]},
        ],
    }
    source = tmp_path / "moved"
    runs = {}
    epyc = {"model": "AMD EPYC", "isa": ["avx2", "avx512f"]}
    for pretraining, commit, cores, cpu in [
        (0, first, 1, here["cpu"]),
        (1, other_code, 1, here["cpu"]),
        (2, first, 2, here["cpu"]),
        (3, first, 1, epyc),  # another processor
        (4, first, 1, None),  # recorded before t2t kept the processor: not refused for it
    ]:
        records = _records(arm, "builtin_order", 0, pretraining, "runs/old")
        start = {**here, "t2t": {**here["t2t"], "commit": commit}, "cpu_threads": cores}
        start["cpu"] = cpu
        if cpu is None:
            del start["cpu"]
        start["variables"] = {"JAX_COMPILATION_CACHE_DIR": "/there/cache", "XLA_FLAGS": ""}
        _write_run(source, "runs/old", records, 50.0 + pretraining, [start])
        runs[pretraining] = records
    # This study's arm of another name, in another directory: the same commands.
    twin = {**arm, "name": "b"}
    wanted = [_records(twin, "builtin_order", 0, p, str(tmp_path / "new")) for p in range(5)]
    other_seed = _records(twin, "builtin_order", 1, 0, str(tmp_path / "new"))
    found, refused = reuse.find([*wanted, other_seed], [str(source)], here, str(repo))

    assert found[0] == reuse.Found(
        run_dir=str(source / "a" / "pretraining0" / "seed0" / "builtin_order"),
        score=50.0,
        model_dir=str(source / "a" / "pretraining0" / "seed0" / "builtin_order" / "finetune"),
        commit=first,
    )
    # other code; 2 cores; another processor; (4: taken); another fine-tuning seed
    assert found[1:4] == [None, None, None] and found[5] is None
    assert found[4].score == 54.0
    assert refused == {
        f"code differs from commit {other_code[:7]}: t2t/a.py": 1,
        "another environment (libraries, devices, cores, processor or variables)": 2,
    }
    # A stage resumed once from uncommitted code is not taken, nor is anything when this
    # checkout has uncommitted changes.
    dirty_start = {**here, "t2t": {**here["t2t"], "commit": first, "dirty": True}}
    stage = source / "a" / "pretraining0" / "pretrain" / "environment.json"
    stage.write_text(
        json.dumps({"starts": [{**here, "t2t": {**here["t2t"], "commit": first}}, dirty_start]})
    )
    assert reuse.find(wanted[:1], [str(source)], here, str(repo)) == (
        [None],
        {"trained from uncommitted code": 1},
    )
    dirty_here = {**here, "t2t": {**here["t2t"], "dirty": True}}
    assert reuse.find(wanted[:1], [str(source)], dirty_here, str(repo))[0] == [None]


def test_the_key_holds_the_commands_and_selection_but_not_the_directories():
    record = {
        "command": "t2t train --gin_file=f.gin \"--gin.MODEL_DIR='/x/a/ft'\" "
        "\"--gin.INIT_CHECKPOINT='/x/a/pt@last'\" --gin.TRAIN_STEPS=300 --gin.t2t.runs.train.seed=3",
        "init_checkpoint": "/x/a/pt@last",
        "selection": "/x/a/ft@last",
    }
    first = {
        "command": "t2t train --gin_file=p.gin",
        "init_checkpoint": None,
        "selection": "/x/pt@last",
    }
    moved = {
        **record,
        "command": record["command"].replace("/x/a", "/y/b"),
        "init_checkpoint": "/y/b/pt@last",
        "selection": "/y/b/ft@last",
    }
    assert reuse.key([first, record]) == reuse.key([first, moved])
    for changed in (
        {**record, "command": record["command"].replace("seed=3", "seed=4")},
        {**record, "selection": "/x/a/ft@order/accuracy"},
    ):
        assert reuse.key([first, record]) != reuse.key([first, changed])
    assert reuse.key([{**first, "init_checkpoint": "/hf/t5-small"}]) != reuse.key([first])


def test_t2t_study_reuse_trains_nothing_another_study_trained(tmp_path, monkeypatch, capsys):
    """Every run of a study found in another's directory (moved since it trained): nothing
    trains, each score.json names its source, and the report holds their scores."""
    monkeypatch.setattr(reuse.provenance, "describe", lambda: HERE)
    monkeypatch.chdir(tmp_path)

    def trained(model_dir, stages, search_paths=(), **_):
        """What a chain leaves, without training: its record and each stage's environment."""
        records = [r for _, _, r in chain.validate(model_dir, stages, search_paths=search_paths)]
        for record in records:
            (tmp_path / record["model_dir"]).mkdir(parents=True, exist_ok=True)
            (tmp_path / record["model_dir"] / "environment.json").write_text(
                json.dumps({"starts": [HERE]})
            )
        (tmp_path / model_dir / reuse.CHAIN_FILE).write_text(json.dumps({"stages": records}))

    def score(model_dir, task):
        return (30.0 if "/scratch/" in model_dir else 70.0) + ("pretraining1" in model_dir)

    monkeypatch.setattr(chain, "run", trained)
    monkeypatch.setattr(runner, "run_score", score)
    (tmp_path / "old.gin").write_text(STUDY.replace("NAME", "encoder-decoder"))
    assert cli.main(["study", "--gin_file=old.gin", "--study_dir=runs/old"]) == 0
    (tmp_path / "runs" / "old").rename(tmp_path / "moved")

    monkeypatch.setattr(chain, "run", lambda *a, **k: pytest.fail("a reused run trained"))
    (tmp_path / "new.gin").write_text(STUDY.replace("NAME", "pre-trained"))
    argv = ["study", "--gin_file=new.gin", "--study_dir=runs/new", "--reuse=moved"]
    assert cli.main(argv) == 0
    assert "study: 4 of 4 runs left found trained in moved" in capsys.readouterr().out
    run = tmp_path / "runs" / "new" / "pre-trained" / "pretraining1" / "seed0" / "builtin_order"
    record = json.loads((run / reuse.SCORE_FILE).read_text())
    assert record["score"] == 71.0 and record["reused_commit"] == COMMIT
    assert record["reused_from"] == "moved/encoder-decoder/pretraining1/seed0/builtin_order"
    report = json.loads((tmp_path / "runs" / "new" / "study.json").read_text())
    assert report["arms"]["pre-trained"]["tasks"]["builtin_order"]["by_seed"] == {
        "pretraining0/seed0": 70.0,
        "pretraining1/seed0": 71.0,
    }
    assert report["arms"]["scratch"]["tasks"]["builtin_order"]["by_seed"] == {
        "pretraining0/seed0": 30.0,
        "pretraining1/seed0": 31.0,
    }
