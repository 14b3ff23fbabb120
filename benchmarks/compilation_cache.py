"""What t2t's persistent compilation cache saves a study: one of its stages run three times,
without the cache, with an empty cache and with the cache the previous run filled.

The stage is a study's fine-tuning of the tiny preset on `builtin_order` (the study profile's
bindings: 300 steps, evaluated at 150 and 300), from scratch so that it needs no pretrained
checkpoint; its train, eval and decode programs are those of every run of a study on that task.

  python benchmarks/compilation_cache.py --out benchmarks/results/compilation_cache.json

Each run is a fresh `t2t train` process; reported are its CPU seconds (user + system, which
depend little on what else runs beside it) and its wall seconds (which do), and the final
accuracy, which must not change.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE = [
    "--gin_file=gin/experiments/tiny_builtin_scratch.gin",
    "--gin.MIXTURE_OR_TASK='builtin_order'",
    "--gin.EVAL_TASKS=['builtin_order']",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}",
    "--gin.TRAIN_STEPS=300",
    "--gin.t2t.runs.EvalOptions.every=150",
    "--gin.t2t.runs.CheckpointOptions.every=300",
    "--gin.t2t.optim.constant.value=1e-2",
    "--gin.t2t.runs.EvalOptions.num_predictions=0",
    "--gin.t2t.runs.LoopOptions.progress=False",
]


def _run(model_dir: str, cache: str, steps: int) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JAX_COMPILATION_CACHE")}
    env["T2T_COMPILATION_CACHE"] = cache
    command = [sys.executable, "-m", "t2t.cli", "train", *STAGE]
    command += [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = os.times().elapsed
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = os.times().elapsed - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"the stage failed:\n{done.stderr[-3000:]}")
    accuracy = re.findall(r"builtin_order/accuracy ([0-9.]+)", done.stdout)
    return {
        "cpu_s": round(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime, 1),
        "wall_s": round(wall, 1),
        "accuracy": float(accuracy[-1]) if accuracy else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", help="write the results here as JSON")
    parser.add_argument("--load", default="", help="what else ran on the machine (recorded)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cache = os.path.join(tmp, "xla")
        runs = {
            "no cache": _run(os.path.join(tmp, "off"), "off", args.steps),
            "empty cache": _run(os.path.join(tmp, "cold"), cache, args.steps),
            "filled cache": _run(os.path.join(tmp, "warm"), cache, args.steps),
        }
        kept = sorted(name.rsplit("-", 2)[0] for name in os.listdir(cache) if "cache" in name)
    saved = runs["no cache"]["cpu_s"] - runs["filled cache"]["cpu_s"]
    result = {
        "command": "python benchmarks/compilation_cache.py",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "load": args.load,
        "stage": "tiny preset, builtin_order, fine-tuning bindings of the study profile",
        "steps": args.steps,
        "runs": runs,
        "programs_kept": kept,
        "cpu_saved_s": round(saved, 1),
        "cpu_saved_fraction": round(saved / runs["no cache"]["cpu_s"], 3),
    }
    for name, run in runs.items():
        print(
            f"{name:13s} {run['cpu_s']:7.1f} s CPU {run['wall_s']:7.1f} s wall  "
            f"accuracy {run['accuracy']}"
        )
    print(
        f"the filled cache saved {saved:.1f} s of CPU ({100 * result['cpu_saved_fraction']:.0f}%)"
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
