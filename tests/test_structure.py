"""The layer contract of docs/architecture.md is enforced: `lint-imports` passes on the code and
fails on a deliberate violation (a copy of the packages where the network imports the edge)."""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


@pytest.mark.skipif(not os.path.exists(LINT_IMPORTS), reason="import-linter is not installed")
def test_a_layer_violation_breaks_the_contract(tmp_path):
    for name in ("t2t", "preprocessors"):
        shutil.copytree(
            os.path.join(REPO, name),
            tmp_path / name,
            ignore=shutil.ignore_patterns("__pycache__", "_shipped"),
        )
    shutil.copy(os.path.join(REPO, "pyproject.toml"), tmp_path)
    env = dict(os.environ, PYTHONPATH=str(tmp_path))

    def lint() -> subprocess.CompletedProcess:
        return subprocess.run(
            [LINT_IMPORTS], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
        )

    kept = lint()
    assert kept.returncode == 0 and "Contracts: 1 kept, 0 broken." in kept.stdout, kept.stdout
    with open(tmp_path / "t2t" / "nn" / "masks.py", "a") as f:
        f.write("\nfrom t2t import runs  # noqa: E402,F401\n")
    broken = lint()
    assert broken.returncode != 0
    assert "t2t layers BROKEN" in broken.stdout
    assert "t2t.nn is not allowed to import t2t.runs" in broken.stdout
