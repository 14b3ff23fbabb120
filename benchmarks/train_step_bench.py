"""T5-small training step: t2t (JAX) against HF transformers (PyTorch), side by side on one CPU.

Workload: batch 8, 512 input and 114 target tokens per example, float32, dropout 0.1 (the
T5-small preset's), the same random tokens (ids 2..32099, no padding) and the same initial
weights on both sides (HF's random init, imported into t2t with `t2t.checkpoints.hf`).

- t2t: `EncoderDecoderModel(t5_small).loss_fn` (cross-entropy + z-loss 1e-4, mean over target
  tokens) -> `t2t.optim.accumulate_gradients` -> `t2t.optim.adafactor(inverse_sqrt())` ->
  `optax.apply_updates`, one `jax.jit` with parameters and optimizer state donated.
- HF: `T5ForConditionalGeneration` in train mode (cross-entropy, mean over target tokens) ->
  `loss.backward()` -> `transformers.optimization.Adafactor(lr=None, relative_step=True,
  scale_parameter=True, warmup_init=False, decay_rate=-0.8, clip_threshold=1.0, beta1=None,
  weight_decay=0)`: T5's update (beta2_t = 1 - t^-0.8, RMS clipping at 1, step
  lr * max(1e-3, RMS(param)), lr = min(0.01, 1/sqrt(t)) = T5's inverse-sqrt schedule, no
  momentum). torch uses 2 threads.

Every measurement runs in a fresh process; processes alternate t2t, HF, t2t, HF, ... (each round
also measures the float32 matmul peak first), so a change in machine load hits both. Step time
is the median over the timed steps (after warm-up) of all rounds; tokens = (512 + 114) x 8 per
step. MFU = exact model FLOPs (`t2t.nn.flops`, 106.3 GFLOP per example) / step time / the
measured peak (the best median of a 4096^3 float32 GEMM in jax, numpy and torch). Compile time,
the peak RSS of each process, the load average during each measurement, per-part times
(forward, forward + backward, optimizer) and, with --profile, the top XLA ops and torch ops are
reported.

    python benchmarks/train_step_bench.py [--rounds 3] [--steps 5] [--profile]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

from common import T5_SMALL, hf_t5_adafactor, hf_t5_config

BATCH, INPUT_LENGTH, TARGET_LENGTH = 8, 512, 114
TOKENS_PER_STEP = BATCH * (INPUT_LENGTH + TARGET_LENGTH)
TORCH_THREADS = 2
DROPOUT = 0.1
RESULT_PREFIX = "RESULT "


def hf_config():
    """T5-small (v1.0) as a HF `T5Config`."""
    return hf_t5_config(**T5_SMALL, dropout_rate=DROPOUT)


def make_batch():
    """The same numpy batch in every process: inputs [B, L], targets [B, T] (no padding)."""
    import numpy as np

    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 32100, (BATCH, INPUT_LENGTH)).astype(np.int32)
    targets = rng.integers(2, 32100, (BATCH, TARGET_LENGTH)).astype(np.int32)
    return inputs, targets


def load_snapshot() -> dict:
    """Peak RSS (MiB) of this process so far, and the 1-minute load average now."""
    return {
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "load_1min": os.getloadavg()[0],
    }


def timed(fn, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


# ----------------------------------------------------------------------------------------------
# Workers (each runs in its own process and prints one RESULT line)
# ----------------------------------------------------------------------------------------------


def peak_worker(args) -> dict:
    """Median GFLOP/s of a float32 [n, n] x [n, n] GEMM in jax, numpy and torch."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    import torch

    torch.set_num_threads(TORCH_THREADS)
    n = args.gemm_size
    a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
    ja = jnp.asarray(a)
    dot = jax.jit(jnp.dot)
    ta = torch.from_numpy(a)
    runs = {
        "jax": lambda: dot(ja, ja).block_until_ready(),
        "numpy": lambda: a @ a,
        "torch": lambda: ta @ ta,
    }
    out = {"gemm_size": n, "load_before": os.getloadavg()[0]}
    for name, run in runs.items():
        run()
        times = timed(run, args.gemm_repeats)
        out[name + "_gflops"] = 2 * n**3 / statistics.median(times) / 1e9
        out[name + "_best_gflops"] = 2 * n**3 / min(times) / 1e9
    out["peak_gflops"] = max(out[k + "_gflops"] for k in runs)
    out.update(load_snapshot())
    return out


def t2t_worker(args) -> dict:
    """Compile and time the t2t train step; then its parts; optionally an XLA profile."""
    import jax
    import numpy as np
    import optax

    from t2t import models, optim
    from t2t.checkpoints import hf
    from t2t.nn import flops

    config = hf.config_from_hf(hf_config().to_dict())
    assert config.dropout_rate == DROPOUT
    model = models.EncoderDecoderModel(config, loss_normalizing_factor="num_real_target_tokens")
    params = jax.device_put(hf.params_from_hf(dict(np.load(args.weights)), config))
    tx = optim.adafactor(optim.inverse_sqrt())
    opt_state = jax.jit(tx.init)(params)
    inputs, targets = make_batch()
    batch = {
        "encoder_input_tokens": inputs,
        "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))),
        "decoder_target_tokens": targets,
        "decoder_loss_weights": np.ones(targets.shape, np.float32),
    }
    batch = jax.device_put(batch)
    initial_loss = -float(jax.jit(model.score_batch)(params, batch).sum()) / targets.size

    def train_step(params, opt_state, batch, rng):
        loss, _, grads = optim.accumulate_gradients(model.loss_fn, params, batch, rng)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    start = time.perf_counter()
    step = (
        jax.jit(train_step, donate_argnums=(0, 1))
        .lower(params, opt_state, batch, jax.random.key(0))
        .compile()
    )
    compile_s = time.perf_counter() - start
    state = {"params": params, "opt_state": opt_state, "i": 0, "losses": []}

    def run():
        rng = jax.random.fold_in(jax.random.key(1), state["i"])
        state["params"], state["opt_state"], loss = step(
            state["params"], state["opt_state"], batch, rng
        )
        state["losses"].append(float(loss))  # Blocks until the step is done.
        state["i"] += 1

    timed(run, args.warmup)
    load_before = os.getloadavg()[0]
    times = timed(run, args.steps)
    out = {
        "compile_s": compile_s,
        "step_times": times,
        "load_before": load_before,
        "initial_eval_loss": initial_loss,
        "losses": state["losses"],
        "flops_per_step": BATCH * flops.training_flops(config, INPUT_LENGTH, TARGET_LENGTH),
    }
    out.update(load_snapshot())
    if args.parts:
        out["parts"] = t2t_parts(model, tx, state["params"], state["opt_state"], batch, args)
    if args.profile:
        out["profile"] = xla_profile(step, state, batch)
    return out


def t2t_parts(model, tx, params, opt_state, batch, args) -> dict:
    """Median seconds of the forward loss, forward + backward, and the optimizer, each jitted."""
    import jax
    import optax

    from t2t import optim

    rng = jax.random.key(2)
    forward = jax.jit(model.loss_fn)
    grad = jax.jit(lambda p, b, r: optim.accumulate_gradients(model.loss_fn, p, b, r))
    update = jax.jit(lambda g, s, p: optax.apply_updates(p, tx.update(g, s, p)[0]))
    grads = grad(params, batch, rng)[2]
    runs = {
        "forward": lambda: jax.block_until_ready(forward(params, batch, rng)),
        "forward_backward": lambda: jax.block_until_ready(grad(params, batch, rng)),
        "optimizer": lambda: jax.block_until_ready(update(grads, opt_state, params)),
    }
    out = {}
    for name, run in runs.items():
        run()
        out[name] = statistics.median(timed(run, args.part_repeats))
    out["backward"] = out["forward_backward"] - out["forward"]
    return out


def xla_profile(compiled, state, batch, top: int = 15) -> dict:
    """Per-op times of one step from a `jax.profiler` trace, mapped to the compiled HLO."""
    import glob

    import jax

    hlo = hlo_instructions(compiled.as_text())
    with tempfile.TemporaryDirectory() as trace_dir:
        jax.profiler.start_trace(trace_dir)
        params, opt_state, loss = compiled(
            state["params"], state["opt_state"], batch, jax.random.key(3)
        )
        loss.block_until_ready()
        jax.profiler.stop_trace()
        state["params"], state["opt_state"] = params, opt_state
        path = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)[0]
        data = jax.profiler.ProfileData.from_file(path)
        per_op = {}
        for plane in data.planes:
            for line in plane.lines:
                for event in line.events:
                    if event.name in hlo:
                        per_op[event.name] = per_op.get(event.name, 0.0) + event.duration_ns / 1e9
    by_kind = {}
    for name, seconds in per_op.items():
        kind = hlo[name]["kind"]
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    ranked = sorted(per_op.items(), key=lambda item: -item[1])[:top]
    return {
        "op_seconds_total": sum(per_op.values()),
        "by_kind": dict(sorted(by_kind.items(), key=lambda item: -item[1])),
        "top_ops": [dict(name=name, seconds=s, **hlo[name]) for name, s in ranked],
    }


def hlo_instructions(text: str) -> dict:
    """Instruction name -> {kind, shape, source} for the entry-level ops of an HLO module.

    kind: "matmul" (a dot, possibly fused), "transpose" (copies and transposes), "reduce",
    "gather/scatter", or "elementwise"; "+hash" marks fusions that compute dropout bits.
    """
    import re

    bodies, current = {}, None
    for line in text.splitlines():
        header = re.match(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header:
            current = header.group(1)
            bodies[current] = []
        elif line.startswith("}"):
            current = None
        elif current:
            bodies[current].append(line)
    out = {}
    for lines in bodies.values():
        for line in lines:
            m = re.match(r"^\s*(?:ROOT )?%?([\w.\-]+) = (\S+) ([\w-]+)\(", line)
            if not m:
                continue
            called = re.search(r"calls=%?([\w.\-]+)", line)
            body = "\n".join(bodies.get(called.group(1), [])) if called else line
            ops = set(re.findall(r"= \S+ ([\w-]+)\(", body)) | {m.group(3)}
            source = re.search(r'op_name="([^"]*)"', line)
            out[m.group(1)] = {
                "kind": _kind(ops),
                "shape": m.group(2).split("{")[0],
                "source": source.group(1) if source else "",
            }
    return out


def _kind(ops: set) -> str:
    if "dot" in ops or "convolution" in ops:
        kind = "matmul"
    elif ops & {"gather", "scatter", "dynamic-slice", "dynamic-update-slice"}:
        kind = "gather/scatter"
    elif "reduce" in ops:
        kind = "reduce"
    elif ops & {"transpose", "copy"}:
        kind = "transpose"
    else:
        kind = "elementwise"
    return kind + "+hash" if "shift-right-logical" in ops else kind


def hf_worker(args) -> dict:
    """Time the HF train step (forward, backward, optimizer timed separately in each step)."""
    import numpy as np
    import torch
    from transformers import T5ForConditionalGeneration

    torch.set_num_threads(TORCH_THREADS)
    model = T5ForConditionalGeneration(hf_config())
    state = {k: torch.from_numpy(v) for k, v in np.load(args.weights).items()}
    model.load_state_dict(state, strict=False)  # lm_head is tied to shared.
    inputs, targets = make_batch()
    inputs, targets = torch.from_numpy(inputs).long(), torch.from_numpy(targets).long()
    mask = torch.ones_like(inputs)
    with torch.no_grad():
        initial_loss = float(
            model.eval()(input_ids=inputs, attention_mask=mask, labels=targets).loss
        )
    model.train()
    optimizer = hf_t5_adafactor(model.parameters())
    parts = {"forward": [], "backward": [], "optimizer": []}
    losses = []

    def run():
        t0 = time.perf_counter()
        loss = model(input_ids=inputs, attention_mask=mask, labels=targets).loss
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t3 = time.perf_counter()
        for name, seconds in zip(parts, (t1 - t0, t2 - t1, t3 - t2)):
            parts[name].append(seconds)
        losses.append(float(loss))

    timed(run, args.warmup)
    for values in parts.values():
        values.clear()
    load_before = os.getloadavg()[0]
    times = timed(run, args.steps)
    out = {
        "step_times": times,
        "load_before": load_before,
        "initial_eval_loss": initial_loss,
        "losses": losses,
        "parts": {k: statistics.median(v) for k, v in parts.items()},
    }
    out.update(load_snapshot())
    if args.profile:
        out["profile"] = torch_profile(run)
    return out


def torch_profile(run, top: int = 15) -> dict:
    """Self CPU time of the top aten ops over one step."""
    import torch

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    return {
        "top_ops": [
            {"name": e.key, "seconds": e.self_cpu_time_total / 1e6, "calls": e.count}
            for e in events
        ]
    }


WORKERS = {"peak": peak_worker, "t2t": t2t_worker, "hf": hf_worker}


def weights_worker(args) -> dict:
    """Writes HF T5-small's random initial weights (seed 0) to `args.weights` (npz)."""
    import numpy as np
    import torch
    from transformers import T5ForConditionalGeneration

    torch.manual_seed(0)
    model = T5ForConditionalGeneration(hf_config())
    tensors = {
        k: v.detach().numpy() for k, v in model.state_dict().items() if k != "lm_head.weight"
    }  # Tied to shared.weight.
    np.savez(args.weights, **tensors)
    return {"tensors": len(tensors)}


WORKERS["weights"] = weights_worker

# ----------------------------------------------------------------------------------------------
# Driver
# ----------------------------------------------------------------------------------------------


def run_worker(kind: str, args) -> dict:
    """Runs one worker in a fresh Python process and returns its RESULT."""
    command = [
        sys.executable,
        os.path.abspath(__file__),
        "--worker",
        kind,
        "--weights",
        args.weights,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--part_repeats",
        str(args.part_repeats),
        "--gemm_size",
        str(args.gemm_size),
        "--gemm_repeats",
        str(args.gemm_repeats),
    ]
    command += ["--parts"] * args.parts + ["--profile"] * args.profile
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.dirname(os.path.dirname(os.path.abspath(__file__))), env.get("PYTHONPATH", "")]
    )
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    results = [line for line in done.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if done.returncode or not results:
        raise RuntimeError(f"worker {kind} failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(results[-1][len(RESULT_PREFIX) :])


def summarize(rounds: list[dict]) -> dict:
    """Medians over all timed steps of all rounds, tokens/s, ratio and MFU of both sides."""
    peak = max(r["peak"]["peak_gflops"] for r in rounds)
    flops_per_step = rounds[0]["t2t"]["flops_per_step"]
    out = {
        "tokens_per_step": TOKENS_PER_STEP,
        "gflop_per_step": flops_per_step / 1e9,
        "matmul_peak_gflops": peak,
    }
    for side in ("t2t", "hf"):
        steps = [t for r in rounds for t in r[side]["step_times"]]
        median = statistics.median(steps)
        out[side] = {
            "median_step_s": median,
            "round_medians_s": [statistics.median(r[side]["step_times"]) for r in rounds],
            "tokens_per_s": TOKENS_PER_STEP / median,
            "model_gflops": flops_per_step / median / 1e9,
            "mfu": flops_per_step / median / 1e9 / peak,
            "peak_rss_mib": max(r[side]["peak_rss_mib"] for r in rounds),
            "load_1min": [[r[side]["load_before"], r[side]["load_1min"]] for r in rounds],
        }
        if "parts" in rounds[0][side]:
            names = rounds[0][side]["parts"]
            out[side]["parts_s"] = {
                n: statistics.median(r[side]["parts"][n] for r in rounds) for n in names
            }
    out["t2t"]["compile_s"] = statistics.median(r["t2t"]["compile_s"] for r in rounds)
    out["ratio"] = out["t2t"]["tokens_per_s"] / out["hf"]["tokens_per_s"]
    return out


def print_summary(summary: dict) -> None:
    print(
        f"\nmatmul peak {summary['matmul_peak_gflops']:.1f} GFLOP/s; "
        f"{summary['gflop_per_step']:.1f} GFLOP and {TOKENS_PER_STEP} tokens per step"
    )
    print(
        f"{'':5} {'step s':>7} {'tokens/s':>9} {'MFU':>6} {'peak RSS MiB':>13}  load (before, after)"
    )
    for side in ("t2t", "hf"):
        s = summary[side]
        loads = " ".join(f"({a:.1f}, {b:.1f})" for a, b in s["load_1min"])
        print(
            f"{side:5} {s['median_step_s']:7.3f} {s['tokens_per_s']:9.1f} {s['mfu']:6.3f} "
            f"{s['peak_rss_mib']:13.0f}  {loads}"
        )
        if "parts_s" in s:
            print("      parts: " + ", ".join(f"{k} {v:.3f} s" for k, v in s["parts_s"].items()))
    print(
        f"t2t / HF tokens/s ratio: {summary['ratio']:.3f}; t2t compile "
        f"{summary['t2t']['compile_s']:.1f} s"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="timed steps per process")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per process")
    parser.add_argument("--parts", action="store_true", help="also time forward/backward/opt")
    parser.add_argument("--part_repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="top XLA and torch ops")
    parser.add_argument("--gemm_size", type=int, default=4096)
    parser.add_argument("--gemm_repeats", type=int, default=5)
    parser.add_argument("--out", default="", help="JSON file for the results")
    parser.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    parser.add_argument("--weights", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(RESULT_PREFIX + json.dumps(WORKERS[args.worker](args)), flush=True)
        return
    with tempfile.TemporaryDirectory() as tmp:
        args.weights = os.path.join(tmp, "t5_small_init.npz")
        run_worker("weights", args)
        rounds = []
        for index in range(args.rounds):
            result = {kind: run_worker(kind, args) for kind in ("peak", "t2t", "hf")}
            rounds.append(result)
            print(
                f"round {index}: peak {result['peak']['peak_gflops']:.1f} GFLOP/s; "
                + "; ".join(
                    f"{side} median {statistics.median(result[side]['step_times']):.3f} s "
                    f"(load {result[side]['load_before']:.1f})"
                    for side in ("t2t", "hf")
                ),
                flush=True,
            )
    summary = summarize(rounds)
    print_summary(summary)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"summary": summary, "rounds": rounds, "argv": sys.argv[1:]}, f, indent=1)


if __name__ == "__main__":
    main()
