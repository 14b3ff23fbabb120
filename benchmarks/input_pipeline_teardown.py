"""What the end of a training run costs with tf.data's autotuning model in the input pipeline,
and without it (t2t's pipeline since 2026-11-29), side by side.

Each measurement is one `t2t train` process on one core: the built-in demo's pretraining for
--steps steps, a checkpoint at the last. Its output lines are timestamped as they arrive; the
measure is the seconds from the last checkpoint's line to the process's exit (the summary, the
files, dropping the input pipeline, the interpreter's exit), and the whole command's wall time.
The autotuned arm is the same command with t2t's pipeline given the model back
(`tf.data.Options().autotune.enabled = True` on the dataset `t2t.data.pipeline` builds); the two
alternate round by round, and both print the same final loss.

    python benchmarks/input_pipeline_teardown.py [--rounds 3] [--steps 100] [--core 0]

Writes benchmarks/results/input_pipeline_teardown.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time

from common import demo_train_flags

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# The `t2t` command, with the autotuning model given back to t2t's pipeline when asked.
LAUNCH = """
import sys
if sys.argv.pop(1) == "autotune":
    import tensorflow as tf
    from t2t.data import pipeline
    build = pipeline.build_dataset_and_subset
    def autotuned(config):
        dataset, subset = build(config)
        options = tf.data.Options()
        options.autotune.enabled = True
        return dataset.with_options(options), subset
    pipeline.build_dataset_and_subset = autotuned
from t2t.cli import console
console()
"""


def measure(core: int, autotune: bool, steps: int) -> dict:
    with tempfile.TemporaryDirectory() as model_dir:
        mode = "autotune" if autotune else "plain"
        launch = ["taskset", "-c", str(core), sys.executable, "-c", LAUNCH, mode]
        command = [*launch, "train", *demo_train_flags(model_dir, steps)]
        start = time.perf_counter()
        process = subprocess.Popen(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        saved, loss = None, None
        for line in process.stdout:
            if f"step {steps}: checkpoint saved" in line:
                saved = time.perf_counter()
            found = re.search(r"trained steps 0 -> \d+: loss [\d.]+ -> ([\d.]+)", line)
            loss = found.group(1) if found else loss
        if process.wait() != 0 or saved is None:
            raise RuntimeError(f"`t2t train` failed or saved no checkpoint: {command}")
        end = time.perf_counter()
    return {"after_last_checkpoint_s": end - saved, "wall_s": end - start, "last_loss": loss}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--core", type=int, default=0)
    parser.add_argument(
        "--out", default=os.path.join(HERE, "results", "input_pipeline_teardown.json")
    )
    args = parser.parse_args()
    settings = {"autotuning model (tf.data's default)": True, "t2t's pipeline (none)": False}
    runs = {name: [] for name in settings}
    for round_ in range(args.rounds):
        for name, autotune in settings.items():
            result = measure(args.core, autotune, args.steps)
            runs[name].append(result)
            print(
                f"round {round_}, {name}: {result['after_last_checkpoint_s']:.1f} s after the "
                f"last checkpoint, {result['wall_s']:.1f} s in all, loss {result['last_loss']}",
                flush=True,
            )
    out = {
        "command": "python benchmarks/input_pipeline_teardown.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, the command on one "
        f"(taskset -c {args.core})",
        "load_average_at_end": os.getloadavg(),
        "median": {
            name: {
                "after_last_checkpoint_s": statistics.median(
                    r["after_last_checkpoint_s"] for r in results
                ),
                "wall_s": statistics.median(r["wall_s"] for r in results),
            }
            for name, results in runs.items()
        },
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:  # local path: the benchmark's result
        json.dump(out, f, indent=1)
    print(json.dumps(out["median"], indent=1))


if __name__ == "__main__":
    main()
