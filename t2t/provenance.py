"""What a run ran on: code, libraries, devices and settings, kept in its model directory.

Each start of `t2t train` on a model directory (the first, and every resume) appends one record
to `<model_dir>/environment.json`, so a number read off the directory months later can be traced
to the code and machine that produced it, and two runs that should agree but do not can be told
apart without guessing. What goes in:

- `t2t`: the package version, and the git commit of its source tree when it runs from a
  checkout (with `dirty`: tracked files changed since, gin files included); None from a wheel;
- the versions of the libraries that set the numbers (jax, jaxlib, flax, optax, orbax, seqio,
  TensorFlow, NumPy) and Python's;
- the devices: platform, kind, how many (this host's and all), how many processes;
- `cpu_threads`: the CPU cores this process may run on. XLA sizes its CPU thread pool from it,
  and the pool splits some reductions: the same run on 1 and on 2 cores gives the same first
  loss and then differs in the seventh digit, which training carries on (two fine-tunings of the
  built-in benchmark that differed only so ended 1.3 accuracy points apart). Rerun on as many
  cores to reproduce a CPU run bit for bit;
- `cpu`: the processor's model and its vector and matrix instruction sets (from
  /proc/cpuinfo). XLA compiles a CPU program for the host's instructions, so the same command on
  another processor may round differently; the CPU is recorded from 2026-11-30 (a run's record
  from before says nothing about it);
- the environment variables that change compilation, numerics or speed (`XLA_FLAGS`, `JAX_*`,
  `LIBTPU_INIT_ARGS`, `TPU_*`, `T2T_*`, `GLIBC_TUNABLES`), the host name, the start time and
  step.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import socket
import subprocess
from typing import Any

import jax

from t2t import files

ENVIRONMENT_JSON = "environment.json"
# The distributions whose versions are recorded, by the names pip knows them by.
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "seqio", "tensorflow", "numpy")
# Environment variables recorded: those XLA, JAX, libtpu, t2t and glibc's allocator read.
VARIABLE_PREFIXES = ("XLA_", "JAX_", "LIBTPU_", "TPU_", "T2T_", "GLIBC_TUNABLES")


def describe() -> dict[str, Any]:
    """This process's code, libraries, devices and settings (see the module docstring)."""
    import t2t

    devices = jax.devices()
    return {
        "t2t": {"version": t2t.__version__, **_git_commit(os.path.dirname(t2t.__file__))},
        "python": platform.python_version(),
        "packages": {name: _version(name) for name in PACKAGES},
        "platform": devices[0].platform,
        "device_kind": devices[0].device_kind,
        "devices": len(devices),
        "local_devices": jax.local_device_count(),
        "processes": jax.process_count(),
        "cpu_threads": _cpu_threads(),
        "cpu": cpu(),
        "host": socket.gethostname(),
        "variables": {
            name: value
            for name, value in sorted(os.environ.items())
            if name.startswith(VARIABLE_PREFIXES)
        },
    }


def record(model_dir: str, step: int) -> None:
    """Appends this process's `describe()` with the time and `step` (where training starts) to
    `<model_dir>/environment.json` (process 0 of a multi-host run; the file is rewritten whole).
    A file that does not parse is kept beside it as `environment.json.unreadable`."""
    if jax.process_index() != 0:
        return
    path = files.join(model_dir, ENVIRONMENT_JSON)
    starts = []
    if files.exists(path):
        text = files.read_text(path)
        try:
            starts = json.loads(text)["starts"]
        except (ValueError, KeyError, TypeError):
            files.write_text(path + ".unreadable", text)
    now = datetime.datetime.now(datetime.timezone.utc)
    starts.append({"started": now.isoformat(timespec="seconds"), "step": step, **describe()})
    files.write_text(path, json.dumps({"starts": starts}, indent=1) + "\n")


def read(model_dir: str) -> list[dict[str, Any]]:
    """The records of `<model_dir>/environment.json`, oldest first ([] without one)."""
    path = files.join(model_dir, ENVIRONMENT_JSON)
    return json.loads(files.read_text(path))["starts"] if files.exists(path) else []


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_threads() -> int:
    """The cores this process may run on (its affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# The instruction-set flags of /proc/cpuinfo that change what XLA's CPU code computes with.
ISA_PREFIXES = ("sse4", "avx", "amx", "fma", "f16c")


def cpu(cpuinfo: str = "/proc/cpuinfo") -> dict[str, Any]:
    """{"model", "isa"}: the first processor's model name and its vector and matrix instruction
    sets, sorted; the machine's architecture and no sets where there is no /proc/cpuinfo."""
    try:
        with open(cpuinfo) as f:  # local path: the kernel's
            text = f.read()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "isa": []}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            break  # the first processor's block
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    model = fields.get("model name") or fields.get("Model") or platform.machine()
    flags = fields.get("flags") or fields.get("Features") or ""
    return {"model": model, "isa": sorted(f for f in flags.split() if f.startswith(ISA_PREFIXES))}


def _git_commit(directory: str) -> dict[str, Any]:
    """{"commit", "dirty"} of the git checkout holding `directory`; None for both where it is
    not one (an installed wheel) or git is not installed."""
    try:
        top = _git(directory, "rev-parse", "--show-toplevel")
        source = os.path.realpath(os.path.dirname(directory))  # local path: t2t's source tree
        if source != os.path.realpath(top):  # local path: what git printed
            return {"commit": None, "dirty": None}  # a wheel inside some other repository
        commit = _git(directory, "rev-parse", "HEAD")
        dirty = bool(_git(directory, "status", "--porcelain", "--untracked-files=no"))
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}
    return {"commit": commit, "dirty": dirty}


def _git(directory: str, *args: str) -> str:
    command = ["git", "-C", directory, *args]
    done = subprocess.run(command, capture_output=True, text=True, check=True, timeout=30)
    return done.stdout.strip()
