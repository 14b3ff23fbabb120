"""The tiny preset's training step on one CPU core, with glibc's large blocks on 4 KiB pages
(glibc's default) and on transparent huge pages (`GLIBC_TUNABLES=glibc.malloc.hugetlb=1`, what
the `t2t` command sets for itself: `t2t.cli.HUGE_PAGES`), side by side.

XLA's CPU client allocates each execution's temporary buffer from a worker thread; glibc serves a
block that large from a fresh mapping and returns it at the end, so every step the kernel zeroes
it again one page at a time. Each measurement runs in a fresh process pinned to one core, the
two settings alternating round by round:

- step: the tiny preset (vocabulary 2,048) at 32 packed rows of 128 input and 128 target tokens
  (Table 4's pretraining shapes), float32, `EncoderDecoderModel.loss_fn` ->
  `t2t.optim.accumulate_gradients` -> Adafactor, one jit with donated state; median step time
  over the timed steps, and per step the process's user and system CPU seconds and minor page
  faults (`getrusage`), its peak RSS, and the loss after the last step (the same in both: the
  allocator changes where memory is, not what is computed);
- `t2t train` (with --train_steps N): the built-in demo's pretraining (span corruption, 128
  input and 32 target tokens) for N steps: the wall time of the whole command (startup, compile
  and a checkpoint included) and the median `step_time` it logged after its first 10 steps, run
  as `t2t` runs: once with `GLIBC_TUNABLES` empty (kept as given: glibc's default) and once
  unset (the command sets it).

    python benchmarks/cpu_huge_pages.py [--rounds 3] [--steps 10] [--train_steps 60] [--core 1]

Writes benchmarks/results/cpu_huge_pages.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from common import demo_train_flags, tiny_training

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_PREFIX = "RESULT "
BATCH, LENGTH = 32, 128


def step_worker(args) -> dict:
    """Compile and time the tiny preset's training step in this process."""
    import jax

    model, tx, train_step, batch = tiny_training(LENGTH, LENGTH, BATCH)
    params = model.init_params(jax.random.key(0))
    opt_state = jax.jit(tx.init)(params)
    batch = jax.device_put(batch)

    step = jax.jit(train_step, donate_argnums=(0, 1))
    state = {"params": params, "opt_state": opt_state, "loss": None}

    def run(count: int, first: int) -> list[float]:
        times = []
        for i in range(first, first + count):
            start = time.perf_counter()
            state["params"], state["opt_state"], loss = step(
                state["params"], state["opt_state"], batch, jax.random.key(i)
            )
            state["loss"] = float(loss)  # blocks until the step is done
            times.append(time.perf_counter() - start)
        return times

    run(3, 0)  # compile and warm up
    before = resource.getrusage(resource.RUSAGE_SELF)
    times = run(args.steps, 3)
    after = resource.getrusage(resource.RUSAGE_SELF)
    n = len(times)
    return {
        "step_s": statistics.median(times),
        "step_times": times,
        "user_s_per_step": (after.ru_utime - before.ru_utime) / n,
        "sys_s_per_step": (after.ru_stime - before.ru_stime) / n,
        "minor_faults_per_step": (after.ru_minflt - before.ru_minflt) / n,
        "peak_rss_mb": after.ru_maxrss / 1024,
        "last_loss": state["loss"],
    }


def measure_step(core: int, tunables: str | None, steps: int) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        environment["GLIBC_TUNABLES"] = tunables
    command = ["taskset", "-c", str(core), sys.executable, __file__, "--worker"]
    done = subprocess.run(
        [*command, "--steps", str(steps)],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith(RESULT_PREFIX)][-1]
    return json.loads(line[len(RESULT_PREFIX) :])


def measure_train(core: int, tunables: str | None, steps: int) -> dict:
    """`t2t train` of the demo for `steps`: wall seconds of the whole command, and the median
    seconds per step of the windows it logged after its first (`step_time`, every 10 steps)."""
    from t2t import provenance
    from t2t.trainer import reporting

    environment = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables is not None:
        environment["GLIBC_TUNABLES"] = tunables
    t2t = os.path.join(os.path.dirname(sys.executable), "t2t")
    with tempfile.TemporaryDirectory() as model_dir:
        command = ["taskset", "-c", str(core), t2t, "train", *demo_train_flags(model_dir, steps)]
        start = time.perf_counter()
        subprocess.run(command, env=environment, cwd=ROOT, capture_output=True, check=True)
        seconds = time.perf_counter() - start
        starts = provenance.read(model_dir)
        windows = reporting.read_scalars(os.path.join(model_dir, "train"))["step_time"]
    return {
        "wall_s": seconds,
        "step_s": statistics.median(value for _, value in windows[1:]),  # the first: compiling
        "glibc_tunables": starts[0]["variables"].get("GLIBC_TUNABLES"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--train_steps", type=int, default=60, help="0: no `t2t train` runs")
    parser.add_argument("--core", type=int, default=1, help="the core every process runs on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cpu_huge_pages.json"))
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(step_worker(args)), flush=True)
        return
    from t2t import cli

    settings = {"4 KiB pages (glibc default)": None, "huge pages": cli.HUGE_PAGES}
    steps = {name: [] for name in settings}
    trains = {name: [] for name in settings}
    for round_ in range(args.rounds):
        for name, tunables in settings.items():
            result = measure_step(args.core, tunables, args.steps)
            steps[name].append(result)
            print(
                f"round {round_} step, {name}: {result['step_s']:.3f} s, sys "
                f"{result['sys_s_per_step']:.3f} s, {result['minor_faults_per_step']:.0f} faults",
                flush=True,
            )
            if args.train_steps:
                # An empty GLIBC_TUNABLES is kept as given; unset, the command sets its own.
                train = measure_train(args.core, "" if tunables is None else None, args.train_steps)
                trains[name].append(train)
                print(
                    f"round {round_} t2t train {args.train_steps} steps, {name}: "
                    f"{train['wall_s']:.1f} s, {train['step_s']:.3f} s per step",
                    flush=True,
                )
    summary = {}
    for name in settings:
        summary[name] = {
            "step_s": statistics.median(r["step_s"] for r in steps[name]),
            "sys_s_per_step": statistics.median(r["sys_s_per_step"] for r in steps[name]),
            "minor_faults_per_step": statistics.median(
                r["minor_faults_per_step"] for r in steps[name]
            ),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in steps[name]),
            "last_losses": sorted({r["last_loss"] for r in steps[name]}),
        }
        if trains[name]:
            summary[name]["t2t_train_wall_s"] = statistics.median(t["wall_s"] for t in trains[name])
            summary[name]["t2t_train_step_s"] = statistics.median(t["step_s"] for t in trains[name])
    base, huge = (summary[name] for name in settings)
    with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:  # local path: the kernel's
        transparent = f.read().strip()
    out = {
        "command": "python benchmarks/cpu_huge_pages.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, glibc "
        f"{platform.libc_ver()[1]}, transparent huge pages: {transparent}",
        "load_average_at_end": os.getloadavg(),
        "workload": f"tiny preset, {BATCH} packed rows x {LENGTH} + {LENGTH} tokens, float32, "
        f"one core (taskset -c {args.core}), {args.steps} timed steps per process",
        "summary": summary,
        "step_speedup": base["step_s"] / huge["step_s"],
    }
    if args.train_steps:
        out["t2t_train_speedup"] = base["t2t_train_wall_s"] / huge["t2t_train_wall_s"]
        out["t2t_train_step_speedup"] = base["t2t_train_step_s"] / huge["t2t_train_step_s"]
    out.update(steps=steps, t2t_train=trains)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:  # local path: the benchmark's result
        json.dump(out, f, indent=1)
    shown = ("summary", "step_speedup", "t2t_train_speedup", "t2t_train_step_speedup")
    print(json.dumps({k: out[k] for k in shown if k in out}, indent=1))


if __name__ == "__main__":
    main()
