"""Fault injection: kill `t2t train` at random moments, resume, and check nothing was lost.

One reference run trains the tiny demo network (shrunk further, as the suite's tests do) for
`--steps` steps without interruption. Then, episode after episode, the same command runs in a
fresh model directory and is stopped at a random moment (uniform over the time a whole run
takes, so stops land in start-up, compilation, training and checkpoint writes alike) by SIGKILL
(no cleanup at all) or SIGTERM (t2t saves and exits 75), then started again, until the run
finishes. After every stop `t2t check` verifies every checkpoint left behind. An episode passes
when its per-step losses and final parameters equal the reference run's exactly.

    python benchmarks/fault_injection.py --kills 30 --terms 10       # about 25 min on 2 cores
    python benchmarks/fault_injection.py --kills 2 --terms 1 --steps 12   # a quick look

Results: benchmarks/results/fault_injection.json (every stop: signal, moment, exit code, the
checkpoint steps before and after, damaged checkpoints) and a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DEMO = "gin/experiments/tiny_builtin_demo.gin"
SMALL = [  # the suite's shrunk demo network (tests/test_runs.py), checkpointing often
    "t2t.nn.get_preset.d_model=64",
    "t2t.nn.get_preset.d_ff=128",
    "t2t.nn.get_preset.num_heads=2",
    "t2t.nn.get_preset.d_kv=32",
    "t2t.nn.get_preset.num_encoder_layers=1",
    "t2t.nn.get_preset.num_decoder_layers=1",
    "TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
    "BATCH_SIZE=8",
    "t2t.runs.train.progress=False",
    "t2t.runs.train.num_predictions=0",
    "t2t.runs.train.log_every=1",
    "t2t.runs.train.eval_every=None",
]
PREEMPTED = 75  # t2t.trainer.loop.PREEMPTED_EXIT_CODE
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "results", "fault_injection.json")


def command(model_dir: str, steps: int, checkpoint_every: int) -> list[str]:
    bindings = [
        *SMALL,
        f"MODEL_DIR='{model_dir}'",
        f"TRAIN_STEPS={steps}",
        f"t2t.runs.train.checkpoint_every={checkpoint_every}",
    ]
    return [
        sys.executable,
        "-m",
        "t2t.cli",
        "train",
        f"--gin_file={DEMO}",
        *[f"--gin.{b}" for b in bindings],
    ]


def start(model_dir: str, steps: int, checkpoint_every: int, log) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(
        command(model_dir, steps, checkpoint_every), stdout=log, stderr=subprocess.STDOUT, env=env
    )


def saved_steps(model_dir: str) -> list[int]:
    path = os.path.join(model_dir, "checkpoints")
    if not os.path.isdir(path):
        return []
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def check(model_dir: str) -> dict[int, str]:
    """{step: status} of every checkpoint (`t2t check`'s verification)."""
    from t2t.checkpoints import model_dir as model_dir_lib

    if not saved_steps(model_dir):
        return {}
    return {step: status for step, (status, _) in model_dir_lib.ModelDir(model_dir).check().items()}


def outcome(model_dir: str) -> tuple[dict[int, float], list]:
    """The per-step losses (the last logged value of each step) and final parameters."""
    import jax
    import numpy as np

    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.trainer import reporting

    losses = dict(reporting.read_scalars(os.path.join(model_dir, "train"))["loss"])
    loaded = model_dir_lib.ModelDir(model_dir).load()
    return losses, [np.asarray(x) for x in jax.tree.leaves(loaded.params)]


def same(a: tuple, b: tuple) -> dict:
    import numpy as np

    losses_a, params_a = a
    losses_b, params_b = b
    steps_equal = sorted(losses_a) == sorted(losses_b)
    loss_gap = max(
        (abs(losses_a[s] - losses_b[s]) for s in losses_a if s in losses_b), default=float("inf")
    )
    params_equal = len(params_a) == len(params_b) and all(
        np.array_equal(x, y) for x, y in zip(params_a, params_b)
    )
    return {
        "steps_equal": steps_equal,
        "max_loss_difference": loss_gap,
        "params_identical": params_equal,
        "exact": steps_equal and loss_gap == 0.0 and params_equal,
    }


def run(
    kills: int, terms: int, steps: int, checkpoint_every: int, seed: int, workdir: str, report=print
) -> dict:
    rng = random.Random(seed)
    os.makedirs(workdir, exist_ok=True)
    log_path = os.path.join(workdir, "runs.log")
    log = open(log_path, "ab")
    reference_dir = os.path.join(workdir, "reference")
    shutil.rmtree(reference_dir, ignore_errors=True)
    began = time.perf_counter()
    code = start(reference_dir, steps, checkpoint_every, log).wait()
    duration = time.perf_counter() - began
    if code != 0:
        raise RuntimeError(f"The reference run failed (exit {code}); see {workdir}/runs.log.")
    reference = outcome(reference_dir)
    report(f"reference: {steps} steps in {duration:.1f} s")
    plan = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms
    rng.shuffle(plan)
    stops, episodes, episode = [], [], 0
    model_dir = os.path.join(workdir, f"episode_{episode}")
    shutil.rmtree(model_dir, ignore_errors=True)
    stops_in_episode = 0
    while plan or model_dir is not None:
        before = saved_steps(model_dir)
        log.flush()
        offset = log.tell()
        process = start(model_dir, steps, checkpoint_every, log)
        if plan:
            number = plan[0]
            delay = rng.uniform(0.0, duration)
            try:
                code = process.wait(timeout=delay)  # finished before the stop came
            except subprocess.TimeoutExpired:
                process.send_signal(number)
                code = process.wait()
                plan.pop(0)
                after = saved_steps(model_dir)
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    said = re.search(rb"stopped by SIGTERM at step (\d+)", f.read())
                stopped_at = int(said.group(1)) if said else None
                statuses = check(model_dir)
                damaged = sorted(s for s, status in statuses.items() if status == "damaged")
                record = {
                    "episode": episode,
                    "signal": signal.Signals(number).name,
                    "after_seconds": round(delay, 2),
                    "exit_code": code,
                    "steps_before": before,
                    "steps_after": after,
                    "damaged": damaged,
                    "stopped_at": stopped_at,
                    "expected_exit": code
                    in ((-signal.SIGKILL,) if number == signal.SIGKILL else (PREEMPTED, 0)),
                }
                stops.append(record)
                stops_in_episode += 1
                report(
                    f"stop {len(stops)}: {record['signal']} after {delay:.1f} s, exit "
                    f"{code}, checkpoints {before} -> {after}, damaged {damaged}"
                )
                continue
        else:
            code = process.wait()
        if code != 0:
            raise RuntimeError(f"Episode {episode} exited {code} unstopped; see runs.log.")
        result = {
            "episode": episode,
            "stops": stops_in_episode,
            **same(outcome(model_dir), reference),
        }
        episodes.append(result)
        report(
            f"episode {episode}: {stops_in_episode} stops, "
            f"{'identical to the reference' if result['exact'] else 'DIFFERS'}"
        )
        episode += 1
        stops_in_episode = 0
        model_dir = os.path.join(workdir, f"episode_{episode}") if plan else None
        if model_dir:
            shutil.rmtree(model_dir, ignore_errors=True)
    log.close()
    summary = {
        "kills": sum(s["signal"] == "SIGKILL" for s in stops),
        "terms": sum(s["signal"] == "SIGTERM" for s in stops),
        "stops_followed_by_exact_resume": sum(s["stops"] for s in episodes if s["exact"]),
        "damaged_checkpoints": sum(len(s["damaged"]) for s in stops),
        "unexpected_exit_codes": sum(not s["expected_exit"] for s in stops),
        # SIGTERM while training: the step it stopped at has a checkpoint afterwards.
        "sigterm_while_training": sum(s["stopped_at"] is not None for s in stops),
        "sigterm_saved_its_step": sum(
            s["stopped_at"] is not None and s["stopped_at"] in s["steps_after"] for s in stops
        ),
        "episodes": len(episodes),
        "episodes_exact": sum(e["exact"] for e in episodes),
    }
    return {
        "settings": {
            "steps": steps,
            "checkpoint_every": checkpoint_every,
            "seed": seed,
            "reference_seconds": round(duration, 1),
        },
        "summary": summary,
        "stops": stops,
        "episodes": episodes,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=30, help="SIGKILL stops")
    parser.add_argument("--terms", type=int, default=10, help="SIGTERM stops")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    workdir = args.workdir or tempfile.mkdtemp(prefix="t2t_faults_")
    started = time.time()
    results = run(
        args.kills,
        args.terms,
        args.steps,
        args.checkpoint_every,
        args.seed,
        workdir,
        report=lambda line: print(f"[{time.time() - started:6.0f} s] {line}", flush=True),
    )
    results["command"] = "python benchmarks/fault_injection.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results["summary"], indent=1))
    good = results["summary"]
    return (
        0
        if (
            good["damaged_checkpoints"] == 0
            and good["unexpected_exit_codes"] == 0
            and good["episodes_exact"] == good["episodes"]
            and good["sigterm_saved_its_step"] == good["sigterm_while_training"]
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
