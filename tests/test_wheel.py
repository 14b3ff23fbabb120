"""The package as users install it: a wheel built from this checkout, installed into a fresh
virtual environment outside the checkout, runs `t2t train` with a shipped gin file, and prints
t2t's own output only (no TensorFlow, CUDA or TPU start-up lines).

The fresh environment reuses this environment's third-party packages through a `.pth` path (no
downloads) but not its editable t2t: t2t comes from the wheel alone."""

import glob
import importlib.util
import json
import os
import platform
import re
import site
import subprocess
import sys

from t2t import cli

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = re.compile(
    r"cuda|cuInit|oneDNN|absl::InitializeLog|TensorFlow|TPU|libtpu|"
    r"cache_dataset_ops|Traceback|WARNING",
    re.IGNORECASE,
)


def test_wheel_installs_and_trains_with_a_shipped_gin_file(tmp_path, builtin_corpus):
    wheels = tmp_path / "wheels"
    # This environment's setuptools builds it when there is one (Python 3.12+ venvs have none:
    # pip then fetches the build backend from the package index).
    isolation = [] if importlib.util.find_spec("setuptools") is None else ["--no-build-isolation"]
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            *isolation,
            "--quiet",
            "-w",
            str(wheels),
            ROOT,
        ],
        check=True,
        cwd=tmp_path,
    )
    (wheel,) = glob.glob(str(wheels / "t2t-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    packages = subprocess.run(
        [python, "-c", "import site; print(site.getsitepackages()[0])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    # This environment's dependencies, without its editable t2t (a .pth path line does not run
    # the .pth files it points at, so the editable finder stays out).
    with open(os.path.join(packages, "deps.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            python,
            "install",
            "--no-deps",
            "--no-index",
            "--quiet",
            wheel,
        ],
        check=True,
        cwd=tmp_path,
    )
    where = subprocess.run(
        [python, "-c", "import t2t; print(t2t.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    ).stdout
    assert where.startswith(packages) and ROOT not in where  # the wheel's t2t, not the checkout

    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TF_CPP", "JAX_", "XLA_", "PYTHONPATH"))
    }
    env["T2T_CACHE_DIR"] = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    env["T2T_COMPILATION_CACHE"] = str(tmp_path / "xla")
    result = subprocess.run(
        [
            str(venv / "bin" / "t2t"),
            "train",
            "--gin_file=gin/experiments/tiny_builtin_demo.gin",
            f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            "--gin.TRAIN_STEPS=2",
            "--gin.t2t.runs.LoopOptions.progress=False",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained steps 0 -> 2" in result.stdout
    assert (tmp_path / "run" / "spiece.model").exists()
    starts = json.loads((tmp_path / "run" / "environment.json").read_text())["starts"]
    assert [start["t2t"]["commit"] for start in starts] == [None]  # a wheel is no checkout
    # The command ran itself again with glibc's large blocks on huge pages (t2t.cli).
    library, version = platform.libc_ver()
    if library == "glibc" and tuple(map(int, version.split(".")[:2])) >= (2, 35):
        assert starts[0]["variables"]["GLIBC_TUNABLES"] == cli.HUGE_PAGES
    assert list((tmp_path / "xla").glob("jit_train_step-*-cache"))  # the step, kept for the next
    noisy = [line for line in result.stderr.splitlines() if NOISE.search(line)]
    assert not noisy, noisy
