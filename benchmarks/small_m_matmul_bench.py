"""The matmuls of one T5-small decoding step, XLA (as `jax.jit` compiles them) against torch.

A decoding step multiplies M rows (the batch, or batch x beams) by every weight matrix of the
decoder once. This benchmark times those products alone, for M from 1 to 64, on both sides: the
tied logits `[M, 512] x [32128, 512]^T` (the embedding as stored), the MLP's `[M, 512] x
[512, 2048]` and `[M, 2048] x [2048, 512]`, and the attention projections `[M, 512] x
[512, 512]`. Each timed call chains several products with distinct weights (at least 64 MB of
weights per call, so they come from memory as in a real step, not from cache), each product's
input depending on the previous output as in a real step. XLA and torch calls alternate; the
median of the timed calls is reported per product, with GFLOP/s, GB/s of weights read, and the
torch / XLA time ratio (> 1: XLA is faster). JSON goes to `benchmarks/results/small_m_matmul.json`.

    python benchmarks/small_m_matmul_bench.py [--rows 1 4 16 64] [--repeats 15] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import torch
from common import REPO, wall_times

# name -> (stored weight shape, whether the product contracts the weight's last axis).
PRODUCTS = {
    "logits (tied) 512x32128": ((32128, 512), True),
    "mlp wi 512x2048": ((512, 2048), False),
    "mlp wo 2048x512": ((2048, 512), False),
    "projection 512x512": ((512, 512), False),
}
MIN_WEIGHT_BYTES = 64 * 2**20


def chain_length(shape: tuple[int, int]) -> int:
    """How many distinct weights one call chains (>= 64 MB of them, at least 2)."""
    return max(2, -(-MIN_WEIGHT_BYTES // (4 * shape[0] * shape[1])))


def xla_chain(transposed: bool):
    """A jitted function: x -> x after one product per weight (the output fed back)."""

    def run(x, weights):
        for w in weights:
            y = jnp.einsum("mk,nk->mn" if transposed else "mk,kn->mn", x, w)
            # Feeds a cheap function of the product back, so products run one after another.
            x = x + jnp.max(y, axis=1, keepdims=True) * 1e-3
        return x

    return jax.jit(run)


def torch_chain(transposed: bool):
    def run(x, weights):
        for w in weights:
            y = torch.nn.functional.linear(x, w) if transposed else x @ w
            x = x + torch.amax(y, dim=1, keepdim=True) * 1e-3
        return x

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", default=str(REPO / "benchmarks" / "results" / "small_m_matmul.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    report = {
        "args": vars(args),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_before": os.getloadavg(),
        "products": [],
    }
    print(
        f"load average before: {os.getloadavg()[0]:.2f}; jax {jax.__version__}, torch "
        f"{torch.__version__} ({args.threads} threads)"
    )
    print(
        f"{'product':<24} {'M':>3} {'XLA ms':>7} {'torch ms':>8} {'torch/XLA':>9} "
        f"{'XLA GFLOP/s':>11} {'XLA GB/s':>8} {'torch GFLOP/s':>13}"
    )
    for name, (shape, transposed) in PRODUCTS.items():
        count = chain_length(shape)
        weights = [rng.standard_normal(shape, np.float32) * 0.02 for _ in range(count)]
        jax_weights = [jnp.asarray(w) for w in weights]
        torch_weights = [torch.from_numpy(w) for w in weights]
        xla_fn, torch_fn = xla_chain(transposed), torch_chain(transposed)
        k, n = (shape[1], shape[0]) if transposed else shape
        for rows in args.rows:
            x = rng.standard_normal((rows, k), np.float32)
            jax_x, torch_x = jnp.asarray(x), torch.from_numpy(x)

            def run_xla():
                jax.block_until_ready(xla_fn(jax_x, jax_weights))

            def run_torch():
                with torch.inference_mode():
                    torch_fn(torch_x, torch_weights)

            times = wall_times({"xla": run_xla, "torch": run_torch}, args.repeats)
            xla_s = statistics.median(times["xla"]) / count
            torch_s = statistics.median(times["torch"]) / count
            flops, weight_bytes = 2 * rows * k * n, 4 * k * n
            row = {
                "product": name,
                "rows": rows,
                "chained": count,
                "xla_ms": xla_s * 1e3,
                "torch_ms": torch_s * 1e3,
                "torch_over_xla": torch_s / xla_s,
                "xla_gflops": flops / xla_s / 1e9,
                "xla_weight_gbs": weight_bytes / xla_s / 1e9,
                "torch_gflops": flops / torch_s / 1e9,
                "times_s": times,
            }
            report["products"].append(row)
            print(
                f"{name:<24} {rows:>3} {row['xla_ms']:>7.3f} {row['torch_ms']:>8.3f} "
                f"{row['torch_over_xla']:>8.2f}x {row['xla_gflops']:>11.0f} "
                f"{row['xla_weight_gbs']:>8.1f} {row['torch_gflops']:>13.0f}",
                flush=True,
            )
    report["load_average_after"] = os.getloadavg()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"load average after: {os.getloadavg()[0]:.2f}; wrote {out}")


if __name__ == "__main__":
    main()
