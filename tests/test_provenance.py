"""`t2t.provenance`: each start's record is appended, never lost; the commit is the checkout's
(None for a copy of the package that is not the checkout's own); only the variables that change
compilation are kept. (A real run's records: tests/runs/test_train_run.py.)"""

import json
import os
import subprocess

import pytest

from t2t import provenance


def _git(directory, *args):
    return subprocess.run(
        ["git", "-C", str(directory), *args], capture_output=True, text=True, check=True
    ).stdout.strip()


@pytest.fixture
def checkout(tmp_path):
    """A git checkout with a package `pkg/` at its top, one commit."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("x = 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    return tmp_path


def test_records_are_appended_in_order_and_a_damaged_file_is_kept(tmp_path):
    provenance.record(str(tmp_path), 0)
    provenance.record(str(tmp_path), 500)
    starts = provenance.read(str(tmp_path))
    assert [s["step"] for s in starts] == [0, 500]
    assert starts[0]["started"] <= starts[1]["started"]
    assert starts[0]["platform"] == "cpu" and starts[0]["devices"] >= 1
    (tmp_path / provenance.ENVIRONMENT_JSON).write_text('{"starts": [')  # cut off
    provenance.record(str(tmp_path), 900)
    assert [s["step"] for s in provenance.read(str(tmp_path))] == [900]
    assert (tmp_path / "environment.json.unreadable").read_text() == '{"starts": ['


def test_commit_and_uncommitted_changes_of_the_checkout(checkout):
    package = str(checkout / "pkg")
    head = _git(checkout, "rev-parse", "HEAD")
    assert provenance._git_commit(package) == {"commit": head, "dirty": False}
    (checkout / "pkg" / "__init__.py").write_text("x = 2\n")
    assert provenance._git_commit(package) == {"commit": head, "dirty": True}


def test_no_commit_outside_a_checkout_or_for_a_package_installed_inside_one(checkout, tmp_path):
    installed = checkout / ".venv" / "site-packages" / "pkg"  # untracked, inside the checkout
    installed.mkdir(parents=True)
    none = {"commit": None, "dirty": None}
    assert provenance._git_commit(str(installed)) == none
    outside = tmp_path.parent / (tmp_path.name + "_plain") / "pkg"
    outside.mkdir(parents=True)
    assert provenance._git_commit(str(outside)) == none


def test_only_the_variables_that_change_compilation_are_kept(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_thunk_runtime=true")
    monkeypatch.setenv("T2T_CACHE_DIR", "/c")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "no")
    described = provenance.describe()
    assert described["variables"]["XLA_FLAGS"] == "--xla_cpu_use_thunk_runtime=true"
    assert described["variables"]["T2T_CACHE_DIR"] == "/c"
    assert "AWS_SECRET_ACCESS_KEY" not in json.dumps(described)
    assert described["cpu_threads"] == len(os.sched_getaffinity(0))


def test_the_processor_and_its_vector_instructions_are_recorded(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Processor\n"
        "flags\t\t: fpu sse2 sse4_1 sse4_2 fma avx2 avx512f avx512_bf16 amx_bf16 aes\n\n"
        "processor\t: 1\nmodel name\t: Another One\nflags\t\t: fpu sse2\n"
    )
    assert provenance.cpu(str(cpuinfo)) == {
        "model": "Intel(R) Xeon(R) Processor",  # the first processor's
        "isa": ["amx_bf16", "avx2", "avx512_bf16", "avx512f", "fma", "sse4_1", "sse4_2"],
    }
    missing = provenance.cpu(str(tmp_path / "none"))
    assert missing["isa"] == [] and missing["model"]
    if os.path.exists("/proc/cpuinfo"):  # this machine's, as every run records it
        assert provenance.describe()["cpu"] == provenance.cpu()
        assert provenance.cpu()["model"]
