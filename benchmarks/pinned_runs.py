"""Two training runs side by side, each pinned to its own core, against one run on every core.

A study on a small machine trains many small runs one after another, each on all cores. XLA's
CPU backend does not keep two cores busy with the tiny preset's small matrices, so two runs
side by side (two studies, or two halves of one) may train more steps per second together.
This measures it with the studies' costliest stage, the prefix-LM pretraining of Table 4:

  python benchmarks/pinned_runs.py --out benchmarks/results/pinned_runs.json

Needs `taskset` (util-linux) and a quiet machine with at least two cores; each run trains
`--steps` steps, the first 20 (compilation, warm-up) are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = [
    "--gin_file=gin/experiments/tiny_builtin_demo.gin",
    "--gin.MIXTURE_OR_TASK='builtin_prefix_lm'",
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 128, 'targets': 128}",
    "--gin.EVAL_TASKS=[]",
    "--gin.t2t.runs.EvalOptions.every=None",
    "--gin.t2t.runs.EvalOptions.num_predictions=0",
    "--gin.t2t.runs.CheckpointOptions.every=100000",
    "--gin.t2t.runs.LoopOptions.progress=False",
]
WARMUP = 20


def _start(model_dir: str, steps: int, cores: str | None) -> subprocess.Popen:
    command = [sys.executable, "-m", "t2t.cli", "train", *RUN]
    command += [f"--gin.MODEL_DIR='{model_dir}'", f"--gin.TRAIN_STEPS={steps}"]
    if cores is not None:
        command = ["taskset", "-c", cores, *command]
    return subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def _seconds_per_step(model_dir: str) -> float:
    """Mean wall time per step after the warm-up, from the run's logged step times."""
    from t2t.trainer import reporting

    logged = reporting.read_scalars(f"{model_dir}/train")["step_time"]  # a window's mean each
    timed = [t for step, t in logged if step > WARMUP]
    return sum(timed) / len(timed)


def _side_by_side(root: str, name: str, steps: int, cores: list[str | None]) -> list[float]:
    dirs = [os.path.join(root, f"{name}{i}") for i in range(len(cores))]
    processes = [_start(d, steps, c) for d, c in zip(dirs, cores, strict=True)]
    for process in processes:
        _, err = process.communicate()
        if process.returncode:
            raise SystemExit(f"a run failed:\n{err.decode()[-3000:]}")
    return [_seconds_per_step(d) for d in dirs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--out", help="write the results as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as root:
        one = _side_by_side(root, "all_cores", args.steps, [None])[0]
        pinned = _side_by_side(root, "pinned", args.steps, ["0", "1"])
    together = sum(1 / s for s in pinned)
    result = {
        "command": f"python benchmarks/pinned_runs.py --steps {args.steps}",
        "cpus": os.cpu_count(),
        "one_run_on_all_cores_s_per_step": round(one, 3),
        "two_pinned_runs_s_per_step": [round(s, 3) for s in pinned],
        "steps_per_s": {"one_run": round(1 / one, 3), "two_pinned_runs": round(together, 3)},
        "ratio": round(together * one, 3),
    }
    print(json.dumps(result, indent=1))
    if args.out:
        with open(args.out, "w") as f:  # a local results file
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
