"""Several pretrainings of the tiny preset in one compiled program (`jax.vmap` over stacked
parameters, optimizer states, batches and dropout keys) against one at a time, on one CPU core:
does a study's CPU time per pretraining step fall when its replicas train together?

Each measurement runs in a fresh process pinned to one core with glibc's large blocks on huge
pages (as the `t2t` command runs), the replica counts alternating round by round. Per process:

- the step: the tiny preset (vocabulary 2,048), 32 packed rows of 128 input and 32 target tokens
  per replica (the studies' pretraining shapes), float32, the step the trainer runs
  (`benchmarks/common.py: tiny_training`), vmapped over R replicas, jitted with donated state;
  median seconds per step over the timed steps, and per replica;
- its FLOPs (XLA's cost analysis of the compiled step) and the rate they ran at;
- the peak of this core in the same process: the best of 3 float32 matmuls of the shapes the
  preset multiplies most, [4096, 128] x [128, 512], and of a large one, [2048, 2048]^2;
- the loss of replica 0 after the timed steps (every replica starts from its own seed; replica 0
  is the same run at every R, so its loss should agree to float32 rounding).

    python benchmarks/seeds_in_one_program.py [--replicas 1,2,4] [--rounds 2] [--steps 6] [--core 1]

Writes benchmarks/results/seeds_in_one_program.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

from common import tiny_training

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_PREFIX = "RESULT "
BATCH, INPUTS, TARGETS = 32, 128, 32


def best_gflops(shape_a, shape_b, repeats: int) -> float:
    import jax
    import jax.numpy as jnp

    a, b = jnp.ones(shape_a, jnp.float32), jnp.ones(shape_b, jnp.float32)
    matmul = jax.jit(jnp.matmul)
    matmul(a, b).block_until_ready()
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(repeats):
            matmul(a, b).block_until_ready()
        best = min(best, (time.perf_counter() - start) / repeats)
    return 2 * shape_a[0] * shape_a[1] * shape_b[1] / best / 1e9


def worker(replicas: int, steps: int) -> dict:
    """Compile and time R replicas' training step in this process."""
    import jax
    import numpy as np

    model, tx, train_step, batch = tiny_training(INPUTS, TARGETS, BATCH)
    stack = lambda trees: jax.tree.map(lambda *xs: np.stack(xs), *trees)  # noqa: E731
    params = stack([model.init_params(jax.random.key(r)) for r in range(replicas)])
    opt_state = jax.jit(jax.vmap(tx.init))(params)
    # Replica r reads its own batch (replica 0 the one every R reads).
    batches = [batch] + [
        tiny_training(INPUTS, TARGETS, BATCH, seed=r)[3] for r in range(1, replicas)
    ]
    batches = jax.device_put(stack(batches))
    step = jax.jit(jax.vmap(train_step), donate_argnums=(0, 1))
    keys = lambda i: jax.random.split(jax.random.key(i), replicas)  # noqa: E731
    compiled = step.lower(params, opt_state, batches, keys(0)).compile()
    cost = compiled.cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost)["flops"]
    state = {"params": params, "opt_state": opt_state}

    def run(count: int, first: int) -> tuple[list[float], float]:
        times, loss = [], None
        for i in range(first, first + count):
            start = time.perf_counter()
            state["params"], state["opt_state"], losses = step(
                state["params"], state["opt_state"], batches, keys(i)
            )
            loss = float(losses[0])  # blocks until the step is done
            times.append(time.perf_counter() - start)
        return times, loss

    run(2, 0)  # warm up
    times, loss = run(steps, 2)
    step_s = statistics.median(times)
    return {
        "replicas": replicas,
        "step_s": step_s,
        "step_s_per_replica": step_s / replicas,
        "step_times": times,
        "gflop_per_step": flops / 1e9,
        "gflop_per_s": flops / 1e9 / step_s,
        "peak_gflop_per_s": {
            "[4096,128]x[128,512]": best_gflops((4096, 128), (128, 512), 50),
            "[2048,2048]x[2048,2048]": best_gflops((2048, 2048), (2048, 2048), 3),
        },
        "replica0_loss": loss,
    }


def cpu_model() -> str:
    with open("/proc/cpuinfo") as f:  # local path: the kernel's
        names = [line.split(":", 1)[1].strip() for line in f if line.startswith("model name")]
    return names[0] if names else platform.processor()


def measure(core: int, replicas: int, steps: int) -> dict:
    from t2t import cli

    command = ["taskset", "-c", str(core), sys.executable, __file__, "--worker"]
    done = subprocess.run(
        [*command, "--replicas", str(replicas), "--steps", str(steps)],
        env={**os.environ, "GLIBC_TUNABLES": cli.HUGE_PAGES},  # as the `t2t` command runs
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith(RESULT_PREFIX)][-1]
    return json.loads(line[len(RESULT_PREFIX) :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicas", default="1,2,4", help="replica counts, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--core", type=int, default=1, help="the core every process runs on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "seeds_in_one_program.json"))
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(worker(int(args.replicas), args.steps)), flush=True)
        return
    counts = [int(r) for r in args.replicas.split(",")]
    results = {r: [] for r in counts}
    for round_ in range(args.rounds):
        for r in counts:
            result = measure(args.core, r, args.steps)
            results[r].append(result)
            print(
                f"round {round_}, {r} replica(s): {result['step_s']:.3f} s a step, "
                f"{result['step_s_per_replica']:.3f} s per replica, "
                f"{result['gflop_per_s']:.1f} GFLOP/s (matmul peak "
                + ", ".join(f"{v:.1f}" for v in result["peak_gflop_per_s"].values())
                + f"), replica 0 loss {result['replica0_loss']:.5f}",
                flush=True,
            )
    one = statistics.median(x["step_s_per_replica"] for x in results[counts[0]])
    summary = {
        str(r): {
            "step_s": statistics.median(x["step_s"] for x in results[r]),
            "step_s_per_replica": statistics.median(x["step_s_per_replica"] for x in results[r]),
            "gflop_per_step": results[r][0]["gflop_per_step"],
            "gflop_per_s": statistics.median(x["gflop_per_s"] for x in results[r]),
            "replica0_losses": sorted({x["replica0_loss"] for x in results[r]}),
        }
        for r in counts
    }
    for r in counts:
        summary[str(r)]["speedup_per_replica"] = one / summary[str(r)]["step_s_per_replica"]
    peaks = [x["peak_gflop_per_s"] for xs in results.values() for x in xs]
    out = {
        "command": "python benchmarks/seeds_in_one_program.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {cpu_model()}",
        "load_average_at_end": os.getloadavg(),
        "workload": f"tiny preset, per replica {BATCH} packed rows x {INPUTS} + {TARGETS} "
        f"tokens, float32, one core (taskset -c {args.core}), {args.steps} timed steps a process",
        "summary": summary,
        "peak_gflop_per_s_median": {
            name: statistics.median(p[name] for p in peaks) for name in peaks[0]
        },
        "runs": {str(r): xs for r, xs in results.items()},
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:  # local path: the benchmark's result
        json.dump(out, f, indent=1)
    print(json.dumps({k: out[k] for k in ("summary", "peak_gflop_per_s_median")}, indent=1))


if __name__ == "__main__":
    main()
