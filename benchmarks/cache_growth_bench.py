"""Decoding with a growing self-attention cache against one loop over the full-length cache.

t2t decodes in phases whose self-attention cache holds `first_cache_length`, twice that, ... up
to `max_decode_length` positions (`t2t.decoding`), so a step reads only the cached positions its
phase needs. This benchmark times T5-small (the same random weights as `decoding_bench.py`)
decoding 16 inputs of 128 tokens into exactly T tokens, greedy and beam-4, in one loop
(`first_cache_length=T`) and growing from each `--first` length below T. The forms alternate run
by run in one process; each form's tokens are checked to equal the one-loop tokens. Reported:
median seconds per run, the median of the run-by-run one-loop / growing time ratios (> 1: the
growing cache is faster) and each form's compile time.

    python benchmarks/cache_growth_bench.py [--new-tokens 64 256] [--first 16 64] [--repeats 3]
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
from common import REPO, interleaved_times, t5_small_pair, write_report


def compiled_decode(model, params, batch, new_tokens: int, beams: int, first: int):
    """(the compiled decode of exactly `new_tokens` tokens, its compile time in seconds)."""
    decode = jax.jit(
        functools.partial(
            model.predict_batch,
            method="greedy" if beams == 1 else "beam",
            beam_size=beams,
            max_decode_length=new_tokens,
            min_length=new_tokens,
            first_cache_length=first,
        )
    )
    start = time.perf_counter()
    compiled = decode.lower(params, batch).compile()
    return compiled, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input-length", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, nargs="+", default=[64, 256])
    parser.add_argument(
        "--first",
        type=int,
        nargs="+",
        default=[16, 64],
        help="first phase lengths to compare with one loop (those below T)",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "cache_growth.json"))
    args = parser.parse_args()
    if min(args.first) < 1 or min(args.new_tokens) < 2:
        parser.error("--first must be >= 1 and --new-tokens >= 2")

    _, model, params = t5_small_pair()
    rng = np.random.default_rng(0)
    inputs = rng.integers(2, 32000, (args.batch, args.input_length)).astype(np.int32)
    inputs[:, -1] = 1  # EOS-terminated, no padding.
    batch = {"encoder_input_tokens": jnp.asarray(inputs)}
    report = {
        "args": vars(args),
        "jax": jax.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "runs": [],
    }
    print(
        f"load average before: {os.getloadavg()[0]:.2f}; jax {jax.__version__}; "
        f"{args.batch} inputs x {args.input_length} tokens"
    )
    print(
        f"{'method':<8} {'T':>4} {'form':<12} {'median s':>9} {'paired ratio':>13} "
        f"{'compile s':>10}"
    )
    for new_tokens in args.new_tokens:
        for method, beams in (("greedy", 1), ("beam-4", 4)):
            firsts = [new_tokens] + sorted(f for f in set(args.first) if f < new_tokens)
            forms = {f: compiled_decode(model, params, batch, new_tokens, beams, f) for f in firsts}
            one_loop = np.asarray(forms[new_tokens][0](params, batch))
            for first, (compiled, _) in forms.items():
                np.testing.assert_array_equal(
                    np.asarray(compiled(params, batch)),
                    one_loop,
                    err_msg=f"first_cache_length={first}",
                )
            runners = {
                f: (lambda c=c: c(params, batch).block_until_ready()) for f, (c, _) in forms.items()
            }
            times = interleaved_times(runners, args.repeats)
            for first in firsts:
                wall = times[first]["wall_s"]
                ratios = [a / b for a, b in zip(times[new_tokens]["wall_s"], wall)]
                name = "one loop" if first == new_tokens else f"grow from {first}"
                row = {
                    "method": method,
                    "new_tokens": new_tokens,
                    "first_cache_length": first,
                    "form": name,
                    "wall_s": wall,
                    "median_s": statistics.median(wall),
                    "paired_ratio_median": statistics.median(ratios),
                    "compile_s": forms[first][1],
                }
                report["runs"].append(row)
                print(
                    f"{method:<8} {new_tokens:>4} {name:<12} {row['median_s']:>9.3f} "
                    f"{row['paired_ratio_median']:>12.3f}x {row['compile_s']:>10.2f}",
                    flush=True,
                )
    write_report(report, args.out)


if __name__ == "__main__":
    main()
