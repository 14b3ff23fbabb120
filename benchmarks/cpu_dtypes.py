"""Would bfloat16, or XLA's oneDNN or XNNPACK paths, make the studies' CPU runs cheaper? The tiny
preset's training step on one core in float32 (what every study runs) and in bfloat16 compute,
each with XLA's defaults and with the library path XLA offers for it, side by side; and a bare
matrix product in both dtypes, which says whether the CPU's bfloat16 units (AMX, AVX-512 BF16)
are reached at all.

Each measurement runs in a fresh process pinned to one core (XLA reads its flags once per
process), the settings alternating round by round:

- step: `common.tiny_training` at 32 packed rows of 128 input and 128 target tokens (Table 4's
  and Table 5's pretraining shapes), one jit with donated state; the median step time over the
  timed steps, the GFLOP/s that makes (XLA's own count of the step's floating-point operations)
  and the loss after the last step (a setting that changes nothing computed leaves it equal);
- matmul: a [1024, 1024] x [1024, 1024] product, median of 20, in the setting's dtype.

    python benchmarks/cpu_dtypes.py [--rounds 2] [--steps 10] [--core 0]

Writes benchmarks/results/cpu_dtypes.json.
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

from common import tiny_training, write_report

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULT_PREFIX = "RESULT "
BATCH, LENGTH, MATMUL = 32, 128, 1024
ONEDNN = "--xla_cpu_use_onednn=true --xla_cpu_experimental_onednn_custom_call=true"
SETTINGS = {  # name: (compute dtype, XLA_FLAGS added)
    "float32": ("float32", ""),
    "float32, XNNPACK": ("float32", "--xla_cpu_use_xnnpack=true"),
    "bfloat16": ("bfloat16", ""),
    "bfloat16, oneDNN": ("bfloat16", ONEDNN),
}


def worker(args) -> dict:
    """Compile and time the step and the matmul in this process."""
    import jax
    import jax.numpy as jnp

    model, tx, train_step, batch = tiny_training(LENGTH, LENGTH, BATCH, dtype=args.dtype)
    params = model.init_params(jax.random.key(0))
    opt_state = jax.jit(tx.init)(params)
    batch = jax.device_put(batch)
    step = jax.jit(train_step, donate_argnums=(0, 1))
    compiled = step.lower(params, opt_state, batch, jax.random.key(0)).compile()
    cost = compiled.cost_analysis()
    flops = (cost[0] if isinstance(cost, list) else cost).get("flops")

    times, loss = [], None
    for i in range(args.steps + 3):  # 3 to warm up
        start = time.perf_counter()
        params, opt_state, loss = step(params, opt_state, batch, jax.random.key(i))
        loss = float(loss)  # blocks until the step is done
        if i >= 3:
            times.append(time.perf_counter() - start)

    a = jnp.ones((MATMUL, MATMUL), args.dtype)
    dot = jax.jit(jnp.dot)
    dot(a, a).block_until_ready()
    products = []
    for _ in range(20):
        start = time.perf_counter()
        dot(a, a).block_until_ready()
        products.append(time.perf_counter() - start)
    step_s = statistics.median(times)
    matmul_s = statistics.median(products)
    return {
        "step_s": step_s,
        "step_times": times,
        "step_gflop": flops / 1e9 if flops else None,
        "step_gflop_per_s": flops / 1e9 / step_s if flops else None,
        "last_loss": loss,
        "matmul_s": matmul_s,
        "matmul_gflop_per_s": 2 * MATMUL**3 / 1e9 / matmul_s,
    }


def measure(core: int, dtype: str, flags: str, steps: int) -> dict:
    environment = dict(os.environ)
    environment["XLA_FLAGS"] = (environment.get("XLA_FLAGS", "") + " " + flags).strip()
    command = ["taskset", "-c", str(core), sys.executable, __file__, "--worker"]
    done = subprocess.run(
        [*command, "--dtype", dtype, "--steps", str(steps)],
        env=environment,
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    line = [x for x in done.stdout.splitlines() if x.startswith(RESULT_PREFIX)][-1]
    return json.loads(line[len(RESULT_PREFIX) :])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--core", type=int, default=0, help="the core every process runs on")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "cpu_dtypes.json"))
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(worker(args)), flush=True)
        return
    runs = {name: [] for name in SETTINGS}
    for round_ in range(args.rounds):
        for name, (dtype, flags) in SETTINGS.items():
            result = measure(args.core, dtype, flags, args.steps)
            runs[name].append(result)
            print(
                f"round {round_}, {name}: step {result['step_s']:.3f} s, matmul "
                f"{result['matmul_gflop_per_s']:.0f} GFLOP/s, loss {result['last_loss']:.4f}",
                flush=True,
            )
    summary = {
        name: {
            "step_s": statistics.median(r["step_s"] for r in results),
            "step_gflop_per_s": statistics.median(r["step_gflop_per_s"] or 0 for r in results),
            "matmul_gflop_per_s": statistics.median(r["matmul_gflop_per_s"] for r in results),
            "last_losses": sorted({r["last_loss"] for r in results}),
        }
        for name, results in runs.items()
    }
    base = summary["float32"]["step_s"]
    for row in summary.values():
        row["step_speedup_vs_float32"] = base / row["step_s"]
    with open("/proc/cpuinfo") as f:  # local path: the kernel's
        flags = next((line for line in f if line.startswith("flags")), "").split()
    report = {
        "command": "python benchmarks/cpu_dtypes.py " + " ".join(sys.argv[1:]),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, bfloat16 units: "
        + (", ".join(f for f in flags if "bf16" in f) or "none"),
        "workload": f"tiny preset, {BATCH} packed rows x {LENGTH} + {LENGTH} tokens, one core "
        f"(taskset -c {args.core}), {args.steps} timed steps per process; matmul "
        f"[{MATMUL}, {MATMUL}] x [{MATMUL}, {MATMUL}]",
        "summary": summary,
        "runs": runs,
    }
    write_report(report, args.out)
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
