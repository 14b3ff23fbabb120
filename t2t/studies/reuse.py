"""Runs another study already trained, taken instead of trained again.

The paper's tables share a row: its baseline (span-corruption pretraining, then fine-tuning) is
Table 1's pre-trained arm, Table 2's encoder-decoder and the first arm of Tables 11, 12 and 13.
A t2t run is deterministic for a given code, libraries, devices and number of CPU cores (the
same bits from the same command), so a run of another study with the same stages is the run this
study would train: `t2t study NAME --reuse=DIR` takes it instead of training it again when,
stage by stage:

- the `t2t train` commands are the same (gin files and bindings in order, seeds included) but
  for the model directories; each stage starts from the previous one's checkpoint selected the
  same way (last, or best by the same metric), and the first from the same checkpoint or none;
- the code that trains is the same: the run's commit is this checkout's, or differs from it only
  in comments and docstrings (Python files compared as syntax trees without docstrings, gin
  files without comment and blank lines) under `t2t/` and `gin/`, leaving out the study runner,
  the command line, the provenance record (`t2t.provenance`) and the study files: a run's
  command holds all a study file sets, what the command line sets that can change numbers is an
  environment variable (compared below), what the record keeps computes nothing, and the runner
  scores the reused run again with this checkout's code; neither commit has uncommitted
  changes;
- every start of the stage (a resumed stage has several) ran in this process's environment:
  Python, the libraries `t2t.provenance` records, the devices, processes, CPU cores and the
  processor (its model and instruction sets; a record from before t2t kept it, 2026-11-30, says
  nothing of it and is not refused for it), and the environment variables it records that do
  not name a cache.

A reused run's `score.json` names where it came from (`reused_from`, `reused_commit`). Runs whose
commands match but not their code or environment are counted with the reason, and trained.
"""

from __future__ import annotations

import ast
import json
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from t2t import files, provenance
from t2t.errors import UserError

SCORE_FILE = "score.json"
CHAIN_FILE = "chain.json"
# Where a study puts a run's record: <study>/<arm>[/pretraining<p>]/seed<s>/<task>.
_MAX_DEPTH = 4
# A model directory's own subdirectories: no run record below them.
_NOT_RUNS = ("checkpoints", "train", "eval")
# Recorded in environment.json; a cache's location changes no number.
ENVIRONMENT_KEYS = (
    "python",
    "packages",
    "platform",
    "device_kind",
    "devices",
    "processes",
    "cpu_threads",
    "cpu",
)
# The code a run trains with (module docstring), as git pathspecs.
CODE_PATHS = (
    ":(top)t2t",
    ":(top)gin",
    ":(top,exclude)t2t/studies",
    ":(top,exclude)t2t/cli",
    ":(top,exclude)t2t/provenance.py",  # what a run records of its machine, not what it computes
    ":(top,exclude)gin/studies",
)
_DIRECTORY_FLAGS = ("--gin.MODEL_DIR=", "--gin.INIT_CHECKPOINT=")


class Found(NamedTuple):
    """A finished run of another study that a run of this one repeats."""

    run_dir: str
    score: float  # as its score.json has it
    model_dir: str  # its last stage's directory
    commit: str


class _Candidate(NamedTuple):
    run_dir: str
    score: float
    stage_dirs: tuple[str, ...]


def key(records: Sequence[Mapping[str, Any]]) -> tuple:
    """What a chain trains, from its stages' records (`t2t.chain.validate`, chain.json): per
    stage the command's words without the model directory and the checkpoint it starts from
    (those differ between studies), the first stage's starting checkpoint, and how each stage
    selects the checkpoint it gives on ("last" or a metric)."""
    stages = []
    for index, record in enumerate(records):
        words = tuple(
            w for w in shlex.split(record["command"]) if not w.startswith(_DIRECTORY_FLAGS)
        )
        start = record["init_checkpoint"] if index == 0 else None
        stages.append((words, start, record["selection"].rsplit("@", 1)[-1]))
    return tuple(stages)


def environment(start: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a `t2t.provenance` record that can change a run's numbers."""
    kept = {name: start.get(name) for name in ENVIRONMENT_KEYS}
    variables = start.get("variables") or {}
    kept["variables"] = {k: v for k, v in sorted(variables.items()) if "CACHE" not in k}
    return kept


def find(
    wanted: Sequence[Sequence[Mapping[str, Any]]],
    sources: Sequence[str],
    here: Mapping[str, Any] | None = None,
    repo: str | None = None,
) -> tuple[list[Found | None], dict[str, int]]:
    """For each chain of `wanted` (its stages' records), a finished run under `sources` (study
    directories) that repeats it (module docstring), or None.

    Args:
      wanted: per run to train, its stages' records (`t2t.chain.validate`).
      sources: study directories to look in.
      here: this process's `t2t.provenance.describe()` (default: measured).
      repo: the git checkout whose history compares commits (default: this t2t's).

    Returns:
      The runs found (None where none), and why runs with the same commands were not taken
      (reason -> how many).
    """
    here = dict(here or provenance.describe())
    repo = repo or checkout()
    candidates = _index(sources)
    checks = _Checks(here, repo)
    found, refused = [], {}
    for records in wanted:
        hit = None
        for candidate in candidates.get(key(records), []):
            reason, commit = checks.stages(candidate.stage_dirs)
            if reason is None:
                hit = Found(candidate.run_dir, candidate.score, candidate.stage_dirs[-1], commit)
                break
            refused[reason] = refused.get(reason, 0) + 1
        found.append(hit)
    return found, refused


def checkout() -> str:
    """The directory holding this t2t's package directory (its git checkout, when it is one)."""
    package = os.path.abspath(__file__)  # local path: this module's own file
    return os.path.dirname(os.path.dirname(os.path.dirname(package)))


def code_differences(commit_a: str, commit_b: str, repo: str) -> list[str]:
    """The files under `CODE_PATHS` whose code differs between two commits, comments and
    docstrings aside.

    Raises:
      subprocess.CalledProcessError: a commit `repo` does not have, or one without a `t2t/`
        directory (not this project's).
    """
    if commit_a == commit_b:
        return []
    for commit in (commit_a, commit_b):  # else an empty diff would say "the same code"
        _git(repo, "cat-file", "-e", f"{commit}:t2t")
    changed = _git(repo, "diff", "--name-only", commit_a, commit_b, "--", *CODE_PATHS)
    names = changed.decode().splitlines()
    return [n for n in names if _meaning(repo, commit_a, n) != _meaning(repo, commit_b, n)]


def _meaning(repo: str, commit: str, name: str) -> bytes | str | None:
    """A file's text as far as it runs: Python without comments and docstrings, gin without
    comment and blank lines; None where the commit has no such file."""
    try:
        data = _git(repo, "show", f"{commit}:{name}")
    except subprocess.CalledProcessError:
        return None
    if name.endswith(".py"):
        try:
            tree = ast.parse(data)
        except SyntaxError:
            return data
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                body = node.body
                if (
                    body
                    and isinstance(body[0], ast.Expr)
                    and isinstance(body[0].value, ast.Constant)
                ):
                    if isinstance(body[0].value.value, str):
                        node.body = body[1:] or [ast.Pass()]
        return ast.dump(tree)
    if name.endswith(".gin"):
        lines = data.decode().splitlines()
        return "\n".join(
            line for line in lines if line.strip() and not line.lstrip().startswith("#")
        )
    return data


def _git(repo: str, *args: str) -> bytes:
    command = ["git", "-C", repo, *args]
    return subprocess.run(command, capture_output=True, check=True, timeout=60).stdout


class _Checks:
    """Whether a candidate's stages ran on this code and in this environment (cached per
    stage directory and per commit: a pretraining is shared by many runs)."""

    def __init__(self, here: Mapping[str, Any], repo: str):
        self.here = environment(here)
        self.code = here.get("t2t") or {}
        self.repo = repo
        self.by_dir: dict[str, tuple[str | None, str | None]] = {}
        self.by_commit: dict[str, str | None] = {}

    def stages(self, stage_dirs: Sequence[str]) -> tuple[str | None, str | None]:
        """(None, the commit of the last stage) when every stage may be taken, else (why not,
        None)."""
        commit = None
        for directory in stage_dirs:
            if directory not in self.by_dir:
                self.by_dir[directory] = self._stage(directory)
            reason, commit = self.by_dir[directory]
            if reason is not None:
                return reason, None
        return None, commit

    def _stage(self, directory: str) -> tuple[str | None, str | None]:
        if not self.code.get("commit") or self.code.get("dirty") is not False:
            return "this t2t is not a clean git checkout", None
        starts = provenance.read(directory)
        if not starts:
            return "a stage without environment.json", None
        for start in starts:
            here = self.here if start.get("cpu") else {**self.here, "cpu": None}
            if environment(start) != here:
                return (
                    "another environment (libraries, devices, cores, processor or variables)",
                    None,
                )
            code = start.get("t2t") or {}
            if not code.get("commit") or code.get("dirty") is not False:
                return "trained from uncommitted code", None
            reason = self._code(code["commit"])
            if reason is not None:
                return reason, None
        return None, starts[-1]["t2t"]["commit"]

    def _code(self, commit: str) -> str | None:
        if commit not in self.by_commit:
            try:
                differ = code_differences(commit, self.code["commit"], self.repo)
            except (OSError, subprocess.SubprocessError):
                self.by_commit[commit] = f"commit {commit[:7]} is not in this checkout's history"
            else:
                self.by_commit[commit] = (
                    f"code differs from commit {commit[:7]}: {', '.join(differ[:3])}"
                    + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
                    if differ
                    else None
                )
        return self.by_commit[commit]


def _index(sources: Sequence[str]) -> dict[tuple, list[_Candidate]]:
    """key -> the finished runs under the study directories `sources`."""
    found: dict[tuple, list[_Candidate]] = {}
    for source in sources:
        if not files.isdir(source):
            raise UserError(
                f"--reuse: {source!r} is not a directory; give a study directory whose runs "
                "to reuse (e.g. runs/studies/architectures)."
            )
        for relative in _run_dirs(source, (), _MAX_DEPTH):
            candidate = _candidate(source, relative)
            if candidate is not None:
                records = json.loads(files.read_text(files.join(candidate.run_dir, CHAIN_FILE)))
                found.setdefault(key(records["stages"]), []).append(candidate)
    return found


def _run_dirs(source: str, parts: tuple[str, ...], depth: int) -> list[tuple[str, ...]]:
    """Paths (as parts, relative to `source`) of the directories holding a run's score and
    chain record."""
    here = files.join(source, *parts)
    if parts and files.exists(files.join(here, SCORE_FILE)):
        return [parts] if files.exists(files.join(here, CHAIN_FILE)) else []
    if depth == 0:
        return []
    runs = []
    for name in files.listdir(here):
        if name not in _NOT_RUNS and files.isdir(files.join(here, name)):
            runs += _run_dirs(source, (*parts, name), depth - 1)
    return runs


def _candidate(source: str, parts: tuple[str, ...]) -> _Candidate | None:
    """A finished run with its stages' directories as they are now: chain.json names them as
    they were when it trained (the study directory given then, maybe relative)."""
    run_dir = files.join(source, *parts)
    score = json.loads(files.read_text(files.join(run_dir, SCORE_FILE)))
    if score.get("score") is None or "reused_from" in score or "carried_from" in score:
        return None
    stages = json.loads(files.read_text(files.join(run_dir, CHAIN_FILE)))["stages"]
    last = stages[-1]["model_dir"].rstrip("/")
    tail = "/".join((*parts, stages[-1]["name"]))
    if not last.endswith("/" + tail):
        return None
    study_then = last[: -len(tail)]  # with its trailing "/"
    stage_dirs = []
    for stage in stages:
        if not stage["model_dir"].startswith(study_then):
            return None
        stage_dirs.append(files.join(source, stage["model_dir"][len(study_then) :]))
    return _Candidate(run_dir, float(score["score"]), tuple(stage_dirs))
