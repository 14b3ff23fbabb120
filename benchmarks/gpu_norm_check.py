"""`t2t.nn.norm_kernels` compiled by Triton on a GPU against the formula in float32 and bfloat16,
forward and every gradient, and each direction timed against XLA's (T5.1.1-base's encoder rows:
128 x 512 x 768). Prints one line per case; needs only jax (a bare GPU machine).

    python benchmarks/gpu_norm_check.py
"""

from __future__ import annotations

import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from t2t.nn import norm_kernels  # noqa: E402


def norm(s, scale, dtype):
    s = s.astype(jnp.float32)
    y = s * jax.lax.rsqrt(jnp.mean(s * s, axis=-1, keepdims=True) + 1e-6)
    return (y * scale).astype(dtype)


def relative(a, b) -> float:
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))


def median_ms(fn, *args, repeats: int = 20) -> float:
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2] * 1e3


def main() -> int:
    interpret = jax.default_backend() != "gpu"
    shape = (8, 64, 768) if interpret else (128, 512, 768)
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
                *norm_kernels.add_rms_norm(x, delta, scale, 1e-6, jnp.dtype(dtype), interpret)
            )

        grads = {
            name: jax.jit(jax.grad(f, (0, 1, 2))) for name, f in (("xla", xla), ("pallas", pallas))
        }
        want, got = grads["xla"](x, delta, scale), grads["pallas"](x, delta, scale)
        errors = [relative(a, b) for a, b in zip(want, got)]
        _, y = jax.jit(norm_kernels.add_rms_norm, static_argnums=(3, 4, 5))(
            x, delta, scale, 1e-6, jnp.dtype(dtype), interpret
        )
        forward = relative(norm(x + delta, scale, dtype), y)
        times = {name: median_ms(g, x, delta, scale) for name, g in grads.items()}
        print(
            f"{jnp.dtype(dtype).name} {shape}: forward {forward:.1e}, gradients "
            + ", ".join(f"{e:.1e}" for e in errors)
            + f"; forward + backward XLA {times['xla']:.3f} ms, Pallas {times['pallas']:.3f} ms"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
