"""`t2t.nn.norm_kernels` compiled by Triton on a GPU: checked against the formula in float32 and
bfloat16 (forward and every gradient), then each direction timed alone against XLA's fusions of
the same computation on T5.1.1-base's encoder rows (128 x 512 x 768, bfloat16), with the bytes
each must move (forward: read x and delta, write s and y; backward: read s, ds and dy, write dx)
over its time. `--sweep` times every geometry of `norm_kernels.BLOCKS` (elements per program x
warps) and prints the fastest per direction as JSON on its last line, for
`gpu_train_step_bench.py`'s `NORM_BLOCKS`. Needs only jax (a bare GPU machine).

    python benchmarks/gpu_norm_check.py [--sweep]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from t2t.nn import norm_kernels  # noqa: E402

EPSILON = 1e-6


def norm(s, scale, dtype):
    s = s.astype(jnp.float32)
    y = s * jax.lax.rsqrt(jnp.mean(s * s, axis=-1, keepdims=True) + EPSILON)
    return (y * scale).astype(dtype)


def relative(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))


def per_call_ms(fn, *args, calls: int = 20, repeats: int = 5) -> float:
    """Median over `repeats` of `calls` calls dispatched back to back, per call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            out = fn(*args)
        jax.block_until_ready(out)
        times.append((time.perf_counter() - start) / calls)
    return sorted(times)[len(times) // 2] * 1e3


def check(shape, interpret: bool) -> None:
    for dtype in (jnp.float32, jnp.bfloat16):
        keys = jax.random.split(jax.random.PRNGKey(int(time.time())), 5)
        x, delta = (jax.random.normal(k, shape, dtype) for k in keys[:2])
        scale = 1 + 0.1 * jax.random.normal(keys[2], shape[-1:], jnp.float32)
        w_s, w_y = (jax.random.normal(k, shape, jnp.float32) for k in keys[3:])

        def objective(s, y, w_s=w_s, w_y=w_y):
            return jnp.sum(s.astype(jnp.float32) * w_s) + jnp.sum(y.astype(jnp.float32) * w_y)

        def xla(x, delta, scale, dtype=dtype):
            s = x + delta
            return objective(s, norm(s, scale, dtype))

        def pallas(x, delta, scale, dtype=dtype):
            return objective(
                *norm_kernels.add_rms_norm(x, delta, scale, EPSILON, jnp.dtype(dtype), interpret)
            )

        want = jax.jit(jax.grad(xla, (0, 1, 2)))(x, delta, scale)
        got = jax.jit(jax.grad(pallas, (0, 1, 2)))(x, delta, scale)
        errors = [relative(a, b) for a, b in zip(want, got)]
        _, y = jax.jit(norm_kernels.add_rms_norm, static_argnums=(3, 4, 5))(
            x, delta, scale, EPSILON, jnp.dtype(dtype), interpret
        )
        forward = relative(norm(x + delta, scale, dtype), y)
        print(
            f"check {jnp.dtype(dtype).name} {shape}: forward {forward:.1e}, gradients "
            + ", ".join(f"{e:.1e}" for e in errors),
            flush=True,
        )


def directions(shape, interpret: bool):
    """{"forward": (pallas fn, xla fn, args, bytes), "backward": ...} for bfloat16 rows."""
    dtype = jnp.bfloat16
    keys = jax.random.split(jax.random.PRNGKey(1), 5)
    x, delta, ds, dy = (jax.random.normal(k, shape, dtype) for k in keys[:4])
    scale = 1 + 0.1 * jax.random.normal(keys[4], shape[-1:], jnp.float32)
    size = x.size * 2  # bytes of one bfloat16 array

    def xla_forward(x, delta, scale):
        s = x + delta
        return s, norm(s, scale, dtype)

    def pallas_forward(x, delta, scale):
        return norm_kernels.forward(x, delta, scale, EPSILON, dtype, interpret)[0]

    (s, _), residuals = norm_kernels.forward(x, delta, scale, EPSILON, dtype, interpret)
    _, xla_pullback = jax.vjp(xla_forward, x, delta, scale)

    def xla_backward(pullback, ds, dy):
        return pullback((ds, dy))

    def pallas_backward(residuals, ds, dy):
        return norm_kernels.backward(residuals, (ds, dy), interpret)

    return {
        "forward": (pallas_forward, xla_forward, (x, delta, scale), (x, delta, scale), 4 * size),
        "backward": (
            pallas_backward,
            xla_backward,
            (residuals, ds, dy),
            (xla_pullback, ds, dy),
            4 * size,
        ),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sweep", action="store_true", help="time every geometry")
    args = parser.parse_args(argv)
    interpret = jax.default_backend() != "gpu"
    shape = (8, 64, 768) if interpret else (128, 512, 768)
    check(shape, interpret)
    cases = directions(shape, interpret)
    default = dict(norm_kernels.BLOCKS)
    geometries = (
        list(itertools.product((1024, 2048, 4096, 8192), (2, 4, 8))) if args.sweep else [None]
    )
    best = {}
    for direction, (pallas, xla, pallas_args, xla_args, size) in cases.items():
        xla_ms = per_call_ms(jax.jit(xla), *xla_args)
        print(f"{direction} XLA: {xla_ms:.4f} ms, {size / xla_ms / 1e9:.0f} GB/s", flush=True)
        for geometry in geometries:
            norm_kernels.BLOCKS[direction] = geometry or default[direction]
            try:
                ms = per_call_ms(jax.jit(pallas), *pallas_args)
            except Exception as error:  # a geometry Triton cannot compile
                print(f"{direction} {norm_kernels.BLOCKS[direction]}: {type(error).__name__}")
                continue
            print(
                f"{direction} Pallas {norm_kernels.BLOCKS[direction]}: {ms:.4f} ms, "
                f"{size / ms / 1e9:.0f} GB/s ({xla_ms / ms:.2f}x XLA)",
                flush=True,
            )
            if direction not in best or ms < best[direction][1]:
                best[direction] = (list(norm_kernels.BLOCKS[direction]), ms)
        norm_kernels.BLOCKS[direction] = default[direction]
    print(json.dumps({direction: geometry for direction, (geometry, _) in best.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
