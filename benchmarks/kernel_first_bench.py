"""Kernel-first decoding steps against the usual products, on the CPU, side by side in one run.

A decoding step multiplies a few rows (the batch, or batch x beams) by every kernel of the
decoder. `t2t.nn.layers.kernel_first_matmul` computes those products as `(W^T x^T)^T`, with the
kernel transposed once per decode (`prepare_for_steps`), instead of `x W`.

Part 1, the products alone, for M rows: T5-small's MLP (`512 x 2048`, `2048 x 512`), attention
projection (`512 x 512`) and tied logits (`[V, D] = 32128 x 512`), in the usual form (`layers.matmul`,
and the logits as `[M, D] x [V, D]^T`) and kernel first. Each timed call runs 5 loop iterations
over a chain of distinct weights of at least 64 MB (so they come from memory, as in a step), each
product's input depending on the previous output; the two forms alternate call by call.

Part 2, whole decodes: T5-small (random weights, as in `decoding_bench.py`) decodes 16 or fewer
inputs of 128 tokens into exactly 64 tokens, with `kernel_first_steps=False` and `True` (a field of
`t2t.decoding.DecodingConfig`), compiled
once each and alternated run by run. Reported: the median time of each and the median of the
run-by-run ratios (usual / kernel first; > 1: kernel first is faster), with the tokens checked
equal. JSON goes to `benchmarks/results/kernel_first.json`.

    python benchmarks/kernel_first_bench.py [--rows 1 4 16 32 64] [--repeats 5] [--no-decodes]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np
from common import REPO, t5_small_pair, wall_times, write_report

from t2t.decoding import DecodingConfig
from t2t.nn import layers

# name -> (K, N) of the product `[M, K] -> [M, N]`.
PRODUCTS = {
    "mlp wi 512x2048": (512, 2048),
    "mlp wo 2048x512": (2048, 512),
    "projection 512x512": (512, 512),
    "logits (tied) 512x32128": (512, 32128),
}
# (method, batch): rows per step = batch, or batch x 4 beams.
DECODES = [
    ("greedy", 1),
    ("greedy", 4),
    ("greedy", 16),
    ("greedy", 32),
    ("beam", 4),
    ("beam", 8),
    ("beam", 16),
]
MIN_WEIGHT_BYTES = 64 * 2**20


def product_chain(kernel_first: bool, logits: bool):
    """A jitted function: x -> x after 5 rounds of one product per weight (output fed back)."""

    def product(x, w):
        if kernel_first:  # w is stored [N, K], as `prepare_for_steps` leaves it
            return layers.kernel_first_matmul(x, w)
        if logits:  # the usual tied logits: the table [V, D] as stored
            return jnp.einsum("MD,VD->MV", x, w)
        return layers.matmul(x, w)  # w [K, N]

    def run(x, weights):
        def body(_, x):
            for w in weights:
                x = x + jnp.max(product(x, w), axis=1, keepdims=True) * 1e-3
            return x

        return jax.lax.fori_loop(0, 5, body, x)

    return jax.jit(run)


def bench_products(rows: list[int], repeats: int) -> list[dict]:
    rng = np.random.default_rng(0)
    results = []
    for name, (k, n) in PRODUCTS.items():
        logits = name.startswith("logits")
        count = max(2, -(-MIN_WEIGHT_BYTES // (4 * k * n)))
        # Both forms multiply by the same matrices: stored [N, K] (kernel first, and the tied
        # table as it is) or [K, N] (a Dense kernel as it is).
        first = [rng.standard_normal((n, k), dtype=np.float32) * k**-0.5 for _ in range(count)]
        usual = first if logits else [np.ascontiguousarray(w.T) for w in first]
        first, usual = [jnp.asarray(w) for w in first], [jnp.asarray(w) for w in usual]
        for m in rows:
            x = jnp.asarray(rng.standard_normal((m, k), dtype=np.float32))
            fns = {
                "usual": product_chain(False, logits),
                "kernel first": product_chain(True, logits),
            }
            args = {"usual": usual, "kernel first": first}
            out = {f: fns[f](x, args[f]) for f in fns}
            np.testing.assert_allclose(out["usual"], out["kernel first"], rtol=1e-4, atol=1e-4)
            times = wall_times(
                {
                    f: functools.partial(lambda f: fns[f](x, args[f]).block_until_ready(), f)
                    for f in fns
                },
                repeats,
            )
            ms = {f: statistics.median(t) / (5 * count) * 1e3 for f, t in times.items()}
            row = {
                "product": name,
                "rows": m,
                "usual_ms": ms["usual"],
                "kernel_first_ms": ms["kernel first"],
                "speedup": ms["usual"] / ms["kernel first"],
            }
            results.append(row)
            print(
                f"{name:26s} M={m:3d}  usual {ms['usual']:7.3f} ms  kernel first "
                f"{ms['kernel first']:7.3f} ms  {row['speedup']:.2f}x",
                flush=True,
            )
    return results


def bench_decodes(repeats: int, new_tokens: int = 64, input_length: int = 128) -> list[dict]:
    _, model, params = t5_small_pair()
    rng = np.random.default_rng(0)
    results = []
    for method, batch_size in DECODES:
        inputs = rng.integers(2, 32000, size=(batch_size, input_length)).astype(np.int32)
        batch = {"encoder_input_tokens": jnp.asarray(inputs)}
        compiled = {
            flag: jax.jit(
                functools.partial(
                    model.predict_batch,
                    method=method,
                    beam_size=4,
                    max_decode_length=new_tokens,
                    min_length=new_tokens,
                    kernel_first_steps=flag,
                )
            )
            .lower(params, batch)
            .compile()
            for flag in (False, True)
        }
        tokens = {flag: np.asarray(c(params, batch)) for flag, c in compiled.items()}
        assert np.array_equal(tokens[False], tokens[True]), "kernel first changed the tokens"
        times = wall_times(
            {
                flag: functools.partial(lambda c: c(params, batch).block_until_ready(), c)
                for flag, c in compiled.items()
            },
            repeats,
        )
        ratios = [a / b for a, b in zip(times[False], times[True])]
        rows = batch_size * (4 if method == "beam" else 1)
        row = {
            "method": method,
            "batch": batch_size,
            "rows": rows,
            "usual_s": statistics.median(times[False]),
            "kernel_first_s": statistics.median(times[True]),
            "paired_ratio_median": statistics.median(ratios),
            "default_on": DecodingConfig().uses_kernel_first_steps(rows),
            "usual_wall_s": times[False],
            "kernel_first_wall_s": times[True],
        }
        results.append(row)
        print(
            f"{method:6s} batch {batch_size:2d} ({rows:2d} rows)  usual {row['usual_s']:.3f} s  "
            f"kernel first {row['kernel_first_s']:.3f} s  paired {row['paired_ratio_median']:.2f}x"
            f"  (default {'on' if row['default_on'] else 'off'})",
            flush=True,
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 32, 64])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-decodes", action="store_true", help="only the products alone")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "kernel_first.json"))
    args = parser.parse_args()
    print(
        f"load average before: {os.getloadavg()[0]:.2f}; jax {jax.__version__}, "
        f"devices {jax.devices()}",
        flush=True,
    )
    report = {
        "load_average_before": os.getloadavg(),
        "jax": jax.__version__,
        "products": bench_products(args.rows, args.repeats),
    }
    if not args.no_decodes:
        report["decodes"] = bench_decodes(args.repeats)
    write_report(report, args.out)


if __name__ == "__main__":
    main()
