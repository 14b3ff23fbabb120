"""The attention products of a greedy decoding step, in several XLA forms and in torch.

With one new query per row, each attention layer of a decoding step computes scores `[B, N, 1,
S]` and a weighted sum of values: two batches of B x N matrix-vector products over a cache of S
entries. This benchmark times T5-small's 6 cross-attention layers at batch 16 (8 heads of 64, S =
128 encoder positions, 48 MiB of keys and values) for a loop of decoding steps, each layer's
output feeding the next query as in a real step, and reports per form the milliseconds per step
and the process's CPU time over its wall time: ~1 means the work ran on one core.

Forms (all compute the same attention; each is checked against the first):
- `xla dots`: `einsum` over keys stored `[B, N, S, H]`, t2t's cache layout and current form;
- `xla 2 head groups`: the heads split into two independent products with their own keys;
- `xla 2 query rows`: the query repeated to 2 rows and the keys stored `[B, N, H, S]`, the form
  YNNPACK accepts (it refuses matrix-vector dots);
- `xla multiply-reduce`: products as multiply and sum, keys stored `[B, N, H, S]`;
- `xla multiply-reduce, YNNPACK dots only`: the same, compiled with YNNPACK limited to dots so
  XLA's own loops compute the sums;
- `torch matmul`: `torch.matmul` with the keys' transposed view, `--threads` threads (torch's
  waiting threads spin, so its CPU time counts some waiting too).

Runs alternate form by form; medians are reported. JSON goes to `--out`, by default
`benchmarks/results/step_attention.json`.

    python benchmarks/step_attention_bench.py [--keys 128] [--steps 64] [--repeats 8] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch

REPO = pathlib.Path(__file__).resolve().parents[1]
BATCH, HEADS, HEAD_DIM, LAYERS = 16, 8, 64, 6
DOT_ONLY = {"xla_cpu_experimental_ynn_fusion_type": "LIBRARY_FUSION_TYPE_INDIVIDUAL_DOT"}


def attend_dots(q, k, v):  # q [B, N, H]; k, v [B, N, S, H]
    weights = jax.nn.softmax(jnp.einsum("bnh,bnsh->bns", q, k), axis=-1)
    return jnp.einsum("bns,bnsh->bnh", weights, v)


def attend_head_groups(q, k, v):  # k, v: two [B, N/2, S, H] halves each
    half = HEADS // 2
    return jnp.concatenate(
        [attend_dots(q[:, :half], k[0], v[0]), attend_dots(q[:, half:], k[1], v[1])], axis=1
    )


def attend_two_rows(q, k_t, v):  # k_t [B, N, H, S]
    rows = jnp.stack([q, q], axis=2)  # [B, N, 2, H]
    weights = jax.nn.softmax(jnp.einsum("bnmh,bnhs->bnms", rows, k_t), axis=-1)
    return jnp.einsum("bnms,bnsh->bnmh", weights, v)[:, :, 0]


def attend_multiply_reduce(q, k_t, v):  # k_t [B, N, H, S]
    weights = jax.nn.softmax((q[:, :, :, None] * k_t).sum(axis=2), axis=-1)  # [B, N, S]
    return (weights[..., None] * v).sum(axis=2)


def xla_loop(attend, steps: int):
    """A jitted `(q, keys, values) -> q` running `steps` steps of all layers."""

    def step(q, keys, values):
        for layer in range(LAYERS):
            q = attend(q, keys[layer], values[layer]) * 0.1 + q * 0.9
        return q

    return jax.jit(
        lambda q, keys, values: jax.lax.fori_loop(0, steps, lambda _, q: step(q, keys, values), q)
    )


def torch_loop(q, keys, values, steps: int):
    with torch.inference_mode():
        for _ in range(steps):
            for k, v in zip(keys, values):
                weights = torch.softmax(torch.matmul(q[:, :, None], k.transpose(-1, -2)), -1)
                q = torch.matmul(weights, v)[:, :, 0] * 0.1 + q * 0.9
    return q


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=128, help="cache entries S per row")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--out", default=str(REPO / "benchmarks" / "results" / "step_attention.json")
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rng = np.random.default_rng(0)
    shape = (BATCH, HEADS, args.keys, HEAD_DIM)
    keys = [rng.standard_normal(shape, np.float32) * 0.1 for _ in range(LAYERS)]
    values = [rng.standard_normal(shape, np.float32) for _ in range(LAYERS)]
    query = rng.standard_normal((BATCH, HEADS, HEAD_DIM), np.float32)

    half = HEADS // 2

    def as_jax(arrays):
        return [jnp.asarray(a) for a in arrays]

    def split(arrays):  # each array's two halves of the heads
        return [(jnp.asarray(a[:, :half]), jnp.asarray(a[:, half:])) for a in arrays]

    keys_t = as_jax([np.ascontiguousarray(k.transpose(0, 1, 3, 2)) for k in keys])
    forms = {  # name -> (attend, keys, values, compiler options)
        "xla dots": (attend_dots, as_jax(keys), as_jax(values), None),
        "xla 2 head groups": (attend_head_groups, split(keys), split(values), None),
        "xla 2 query rows": (attend_two_rows, keys_t, as_jax(values), None),
        "xla multiply-reduce": (attend_multiply_reduce, keys_t, as_jax(values), None),
        "xla multiply-reduce, YNNPACK dots only": (
            attend_multiply_reduce,
            keys_t,
            as_jax(values),
            DOT_ONLY,
        ),
    }
    runners, outputs = {}, {}
    for name, (attend, k, v, options) in forms.items():
        compiled = xla_loop(attend, args.steps).lower(query, k, v).compile(compiler_options=options)
        runners[name] = lambda compiled=compiled, k=k, v=v: jax.block_until_ready(
            compiled(query, k, v)
        )
        outputs[name] = np.asarray(runners[name]())
    torch_args = (
        torch.from_numpy(query),
        [torch.from_numpy(k) for k in keys],
        [torch.from_numpy(v) for v in values],
    )
    runners["torch matmul"] = lambda: torch_loop(*torch_args, args.steps)
    outputs["torch matmul"] = runners["torch matmul"]().numpy()
    reference = outputs["xla dots"]
    for name, out in outputs.items():
        error = float(np.abs(out - reference).max())
        if error > 1e-4:
            raise SystemExit(f"{name} differs from 'xla dots' by {error:.2e}; forms must agree.")

    wall = {name: [] for name in runners}
    cpu = {name: [] for name in runners}
    for _ in range(args.repeats):
        for name, run in runners.items():
            before, start = os.times(), time.perf_counter()
            run()
            seconds, after = time.perf_counter() - start, os.times()
            wall[name].append(seconds)
            cpu[name].append((after.user + after.system - before.user - before.system) / seconds)

    report = {
        "args": vars(args),
        "jax": jax.__version__,
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "load_average_before": load_before,
        "forms": [],
    }
    megabytes = 2 * LAYERS * 4 * np.prod(shape) / 2**20
    print(
        f"{LAYERS} layers x batch {BATCH} x {HEADS} heads x {args.keys} keys "
        f"({megabytes:.0f} MiB of keys and values), {args.steps} steps per run, "
        f"{args.repeats} runs; jax {jax.__version__}, torch {torch.__version__}"
    )
    print(f"{'form':<40} {'ms/step':>8} {'GB/s':>6} {'CPU/wall':>8}")
    base = statistics.median(wall["xla dots"])
    for name in runners:
        seconds = statistics.median(wall[name])
        row = {
            "form": name,
            "ms_per_step": seconds / args.steps * 1e3,
            "gb_per_s": megabytes * 2**20 / (seconds / args.steps) / 1e9,
            "cpu_over_wall": statistics.median(cpu[name]),
            "xla_dots_over_form": base / seconds,
            "wall_s": wall[name],
            "cpu_ratio": cpu[name],
        }
        report["forms"].append(row)
        print(
            f"{name:<40} {row['ms_per_step']:>8.2f} {row['gb_per_s']:>6.1f} "
            f"{row['cpu_over_wall']:>8.2f}"
        )
    report["load_average_after"] = os.getloadavg()
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
