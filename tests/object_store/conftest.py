"""The GCS emulator the object-store tests run against, and what they share.

One emulator (`t2t.testing.gcs_emulator`) per test worker, started on first use and stopped at
the end of the session; each test module points the process's clients at it while it runs
(`gcs_env`), and each test writes under its own prefix of the bucket. Commands run either in
this process from a new, empty working directory, or as a subprocess from one (what another
host sees: only the bucket)."""

import os
import subprocess
import sys
import uuid

import pytest

BUCKET = "t2t-tests"
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="session")
def emulator():
    from t2t.testing.gcs_emulator import Emulator

    with Emulator(buckets=[BUCKET]) as running:
        yield running


@pytest.fixture(scope="module")
def gcs(emulator, builtin_tasks):
    """The emulator, with this process's GCS clients pointed at it for the module."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in emulator.env.items():
            patch.setenv(name, value)
        yield emulator


@pytest.fixture
def bucket_dir(gcs):
    """A fresh gs:// prefix for one test."""
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clean_dir(tmp_path, monkeypatch):
    """An empty working directory the test runs its commands from (checked empty after)."""
    directory = tmp_path / "cwd"
    directory.mkdir()
    monkeypatch.chdir(directory)
    return directory


@pytest.fixture(scope="session")
def train_argv():
    """`train_argv(model_dir, steps, *extra)`: the argv of the suite's shrunk `t2t train`
    (tests/micro_run.py)."""
    from .. import micro_run

    return micro_run.argv


@pytest.fixture(scope="module")
def t2t_process(gcs):
    """`t2t_process(argv, cwd)`: `t2t ARGV` in a new process started in `cwd`, with the
    emulator's environment: what a second host sees (the bucket, nothing local)."""

    def run(argv, cwd, *, timeout=600, env=None, wait=True):  # env: a None value unsets
        environment = {**os.environ, **gcs.env, "PYTHONPATH": REPO, **(env or {})}
        environment = {k: v for k, v in environment.items() if v is not None}
        command = [sys.executable, "-m", "t2t.cli", *argv]
        if not wait:
            return subprocess.Popen(
                command,
                cwd=cwd,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        return subprocess.run(
            command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=timeout
        )

    return run


@pytest.fixture(scope="session")
def listing():
    """`listing(prefix)`: every object under a gs:// prefix, relative to it."""
    from t2t import files

    return lambda prefix: files.files_under(prefix) if files.isdir(prefix) else []
