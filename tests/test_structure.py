"""The import contracts of docs/architecture.md are enforced: `lint-imports` passes on the code and
fails on deliberate violations (a copy of the packages where the network imports the edge, or
gin); and the network, loss, optimizer and model wrappers import without gin, seqio or
TensorFlow, as on a bare accelerator machine."""

import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINT_IMPORTS = os.path.join(os.path.dirname(sys.executable), "lint-imports")


@pytest.mark.skipif(not os.path.exists(LINT_IMPORTS), reason="import-linter is not installed")
@pytest.mark.parametrize(
    "violation, broken_contract, message",
    [
        ("from t2t import runs", "t2t layers BROKEN", "t2t.nn is not allowed to import t2t.runs"),
        (
            "import gin",
            "network, loss, optimizer and decoding free of gin, seqio and TensorFlow BROKEN",
            "t2t.nn.masks -> gin",
        ),
    ],
)
def test_a_violation_breaks_its_contract(tmp_path, violation, broken_contract, message):
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
    assert kept.returncode == 0 and "Contracts: 3 kept, 0 broken." in kept.stdout, kept.stdout
    with open(tmp_path / "t2t" / "nn" / "masks.py", "a") as f:
        f.write(f"\n{violation}  # noqa: E402,F401\n")
    broken = lint()
    assert broken.returncode != 0
    assert broken_contract in broken.stdout, broken.stdout
    assert message in broken.stdout, broken.stdout


def test_the_network_loss_optimizer_and_models_import_without_gin_seqio_or_tensorflow():
    """What the GPU benchmark imports on a machine with only jax, flax and optax (and what
    DESIGN's forbidden contracts promise), checked in a fresh interpreter."""
    code = (
        "import sys\n"
        "import t2t.nn, t2t.nn.flops, t2t.losses, t2t.optim, t2t.decoding, t2t.models\n"
        "print(sorted(m for m in ('gin', 'seqio', 'tensorflow') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
