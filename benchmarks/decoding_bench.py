"""Decoding speed of t2t against HF transformers `generate`, side by side on the same CPU.

T5-small (the paper's v1.0 layout, random init in HF, imported into t2t with the HF importer so
both decode the same weights) decodes 16 inputs of 128 tokens into exactly 64 output tokens
(EOS suppressed until then), greedily and with beam search of width 4. Both use float32 and the
KV cache; torch runs with 2 threads. HF and t2t runs alternate, so a change in machine load hits
both. Reported: output tokens per second (16 x 64 tokens over the best wall time of the timed
runs), the t2t / HF throughput ratio of the best and of the median times, each side's process CPU
time per run (less sensitive than wall time to other work on the machine), and t2t's compile time
(not included in the throughput). Runs producing a single token, interleaved with the others,
split each side's time into the first token (encoding, cross-attention keys/values, one step) and
the cost of each further step. Every run's times go to `benchmarks/results/decoding.json`.
With `--model-parallel N`, t2t runs on N CPU devices (`jax_num_cpu_devices`, one thread each),
its weights split by the `tensor_parallel` rules over a 1 x N mesh.

    python benchmarks/decoding_bench.py [--repeats 5] [--batch 16] [--input-length 128]
                                        [--model-parallel 1]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from common import REPO, interleaved_times, t5_small_pair, write_report

from t2t import partitioning


def hf_runner(torch_model, inputs: np.ndarray, new_tokens: int, beams: int):
    """A function that runs HF generate once (forced to exactly `new_tokens` tokens)."""
    ids = torch.tensor(inputs, dtype=torch.long)
    mask = torch.ones_like(ids)

    def run():
        with torch.inference_mode():
            out = torch_model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                num_beams=beams,
                use_cache=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
            )
        assert out.shape == (inputs.shape[0], new_tokens + 1), out.shape

    return run


def t2t_runner(model, params, inputs: np.ndarray, new_tokens: int, beams: int, partitioner=None):
    """(a function that runs t2t decoding once, its compile time in seconds)."""
    method = "greedy" if beams == 1 else "beam"
    predict = jax.jit(
        functools.partial(
            model.predict_batch,
            method=method,
            beam_size=beams,
            max_decode_length=new_tokens,
            min_length=new_tokens,
        )
    )
    batch = {"encoder_input_tokens": jnp.asarray(inputs)}
    start = time.perf_counter()
    if partitioner is None:
        compiled = predict.lower(params, batch).compile()
    else:
        with partitioner.context():
            batch = jax.device_put(batch, partitioner.replicated)
            compiled = predict.lower(params, batch).compile()
    compile_s = time.perf_counter() - start

    def run():
        out = compiled(params, batch).block_until_ready()
        assert out.shape == (inputs.shape[0], new_tokens) and not np.any(np.asarray(out) == 1)

    return run, compile_s


def summarize(times: dict, output_tokens: int, compile_s: float) -> dict:
    """Throughputs and t2t / HF ratios from the best and the median wall times."""
    best = {k: min(v["wall_s"]) for k, v in times.items()}
    median = {k: statistics.median(v["wall_s"]) for k, v in times.items()}
    summary = {"output_tokens": output_tokens, "t2t_compile_s": compile_s}
    for side in times:
        summary[side] = {
            "tokens_per_s_best": output_tokens / best[side],
            "tokens_per_s_median": output_tokens / median[side],
            "cpu_s_median": statistics.median(times[side]["cpu_s"]),
            **times[side],
        }
    summary["ratio_best"] = best["hf"] / best["t2t"]
    summary["ratio_median"] = median["hf"] / median["t2t"]
    return summary


def phases(times: dict, first_token_times: dict, new_tokens: int) -> dict:
    """Median time to the first token and per further step, per side, from the median wall times
    of full runs and of single-token runs."""
    result = {}
    for side in ("hf", "t2t"):
        full = statistics.median(times[side]["wall_s"])
        first = statistics.median(first_token_times[side]["wall_s"])
        result[side] = {
            "first_token_s": first,
            "step_ms": (full - first) / (new_tokens - 1) * 1e3,
            "first_token_wall_s": first_token_times[side]["wall_s"],
        }
    result["first_token_ratio"] = result["hf"]["first_token_s"] / result["t2t"]["first_token_s"]
    result["step_ratio"] = result["hf"]["step_ms"] / result["t2t"]["step_ms"]
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input-length", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--model-parallel",
        type=int,
        default=1,
        help="split the CPU into this many JAX devices and decode with t2t's "
        "tensor-parallel sharding over them (default 1: one device)",
    )
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "decoding.json"))
    args = parser.parse_args()
    if args.new_tokens < 2:
        parser.error("--new-tokens must be >= 2: the time per step is taken past the first token")
    if args.model_parallel < 1:
        parser.error(f"--model-parallel must be >= 1 (CPU devices), got {args.model_parallel}")
    torch.set_num_threads(args.threads)
    partitioner = None
    if args.model_parallel > 1:
        jax.config.update("jax_num_cpu_devices", args.model_parallel)
        partitioner = partitioning.make_partitioner(data=1, model=args.model_parallel)

    torch_model, model, params = t5_small_pair()
    if partitioner is not None:
        with partitioner.context():
            params = jax.device_put(params, partitioner.shardings(params))
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 32000, (args.batch, args.input_length)).astype(np.int32)
    inputs[:, -1] = 1  # EOS-terminated, no padding.
    output_tokens = args.batch * args.new_tokens

    report = {
        "args": vars(args),
        "devices": [str(d) for d in jax.devices()],
        "jax": jax.__version__,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "methods": {},
    }
    print(
        f"load average before: {os.getloadavg()[0]:.2f}; jax {jax.__version__}, torch "
        f"{torch.__version__} ({args.threads} threads), devices {jax.devices()}"
    )
    print(f"{args.batch} inputs x {args.input_length} tokens -> {args.new_tokens} tokens each")
    print(
        f"{'method':<8} {'HF tok/s':>9} {'t2t tok/s':>10} {'ratio':>6} {'median ratio':>13} "
        f"{'CPU s HF / t2t':>15} {'t2t compile s':>14}"
    )
    split = {}
    for name, beams in (("greedy", 1), ("beam-4", 4)):
        t2t_run, compile_s = t2t_runner(model, params, inputs, args.new_tokens, beams, partitioner)
        t2t_first, _ = t2t_runner(model, params, inputs, 1, beams, partitioner)
        runners = {
            "hf": hf_runner(torch_model, inputs, args.new_tokens, beams),
            "t2t": t2t_run,
            "hf_first": hf_runner(torch_model, inputs, 1, beams),
            "t2t_first": t2t_first,
        }
        times = interleaved_times(runners, args.repeats)
        full = {side: times[side] for side in ("hf", "t2t")}
        first = {side: times[f"{side}_first"] for side in ("hf", "t2t")}
        result = summarize(full, output_tokens, compile_s)
        result["phases"] = split[name] = phases(full, first, args.new_tokens)
        result["load_average_after"] = os.getloadavg()
        report["methods"][name] = result
        hf_, t2t_ = result["hf"], result["t2t"]
        print(
            f"{name:<8} {hf_['tokens_per_s_best']:>9.1f} {t2t_['tokens_per_s_best']:>10.1f} "
            f"{result['ratio_best']:>5.2f}x {result['ratio_median']:>12.2f}x "
            f"{hf_['cpu_s_median']:>7.1f} / {t2t_['cpu_s_median']:<5.1f} {compile_s:>14.1f}",
            flush=True,
        )
    print(
        f"\n{'method':<8} {'first token s HF / t2t':>23} {'ratio':>6} {'step ms HF / t2t':>17} "
        f"{'ratio':>6}  (medians)"
    )
    for name, p in split.items():
        hf_, t2t_ = p["hf"], p["t2t"]
        print(
            f"{name:<8} {hf_['first_token_s']:>11.3f} / {t2t_['first_token_s']:<9.3f} "
            f"{p['first_token_ratio']:>5.2f}x {hf_['step_ms']:>8.1f} / {t2t_['step_ms']:<6.1f} "
            f"{p['step_ratio']:>5.2f}x"
        )
    write_report(report, args.out)


if __name__ == "__main__":
    main()
