"""T5's RMSNorm as two Pallas kernels (Triton, NVIDIA GPUs): `norm_impl="pallas"`.

XLA computes the norm in several passes over the `[tokens, D]` activations: the row reduction, the
scaling, and in the backward pass the row reduction of the gradient, `dx`, and the column
reduction of the scale's gradient, each a kernel that reads its arrays from device memory again.
On the H100 that was 17.4 ms of T5.1.1-base's step at batch 128 (44 GB by the cost model, where
reading and writing each array once is about 20 GB). Here each direction is one kernel that
reads a block of rows once:

- forward: `y = x * r * scale`, `r = rsqrt(mean(x^2) + epsilon)` per row, written with `r`;
- backward: `dx = r * g - x * r^3 * mean(g * x)` with `g = dy * scale`, and per block of rows a
  partial sum of `dy * x * r` (the scale's gradient, summed over the blocks by XLA).

Rows go `block_rows` to a program (a block of about 8K elements: 8 rows of 768), columns padded to
a power of two and masked. Off a GPU the kernels run in Pallas's interpreter (tests); with more
than one device in the mesh the norm stays XLA's (a Pallas call is not partitioned).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Elements one program holds per array: rows x padded columns.
_BLOCK_ELEMENTS = 8192


def _geometry(width: int) -> tuple[int, int]:
    """(padded width, rows per program) for rows of `width` elements."""
    padded = pl.next_power_of_2(width)
    return padded, max(1, min(16, _BLOCK_ELEMENTS // padded))


def _index(rows: int, width: int, padded: int, block_rows: int):
    row = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    col = jnp.arange(padded)
    mask = (row[:, None] < rows) & (col[None, :] < width)
    return row, col, mask


def _forward_kernel(x_ref, scale_ref, y_ref, r_ref, *, rows, width, padded, block_rows, epsilon):
    row, col, mask = _index(rows, width, padded, block_rows)
    at = (row[:, None], col[None, :])
    x = plgpu.load(x_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    scale = plgpu.load(scale_ref.at[col], mask=col < width, other=0.0).astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.sum(x * x, axis=1) / width + epsilon)
    y = x * r[:, None] * scale[None, :]
    plgpu.store(y_ref.at[at], y.astype(y_ref.dtype), mask=mask)
    plgpu.store(r_ref.at[row], r, mask=row < rows)


def _backward_kernel(
    x_ref, dy_ref, r_ref, scale_ref, dx_ref, dscale_ref, *, rows, width, padded, block_rows
):
    row, col, mask = _index(rows, width, padded, block_rows)
    at = (row[:, None], col[None, :])
    x = plgpu.load(x_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    dy = plgpu.load(dy_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    r = plgpu.load(r_ref.at[row], mask=row < rows, other=0.0)[:, None]
    scale = plgpu.load(scale_ref.at[col], mask=col < width, other=0.0).astype(jnp.float32)
    g = dy * scale[None, :]
    c = jnp.sum(g * x, axis=1, keepdims=True) / width
    dx = r * g - x * (r * r * r) * c
    plgpu.store(dx_ref.at[at], dx.astype(dx_ref.dtype), mask=mask)
    partial = jnp.sum(dy * x * r, axis=0)
    plgpu.store(dscale_ref.at[pl.program_id(0), col], partial, mask=col < width)


def _call(kernel, out_shape, rows: int, block_rows: int, interpret: bool, **params):
    return pl.pallas_call(
        functools.partial(kernel, rows=rows, block_rows=block_rows, **params),
        grid=(pl.cdiv(rows, block_rows),),
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=4),
        interpret=interpret,
    )


def _forward(x, scale, epsilon, dtype, interpret):
    width = x.shape[-1]
    flat = x.reshape(-1, width)
    rows = flat.shape[0]
    padded, block_rows = _geometry(width)
    y, r = _call(
        _forward_kernel,
        [jax.ShapeDtypeStruct(flat.shape, dtype), jax.ShapeDtypeStruct((rows,), jnp.float32)],
        rows,
        block_rows,
        interpret,
        width=width,
        padded=padded,
        epsilon=epsilon,
    )(flat, scale)
    return y.reshape(x.shape), (x, r, scale)


def _backward(epsilon, dtype, interpret, residuals, dy):
    del epsilon, dtype
    x, r, scale = residuals
    width = x.shape[-1]
    flat, flat_dy = x.reshape(-1, width), dy.reshape(-1, width)
    rows = flat.shape[0]
    padded, block_rows = _geometry(width)
    blocks = pl.cdiv(rows, block_rows)
    dx, partial = _call(
        _backward_kernel,
        [
            jax.ShapeDtypeStruct(flat.shape, x.dtype),
            jax.ShapeDtypeStruct((blocks, width), jnp.float32),
        ],
        rows,
        block_rows,
        interpret,
        width=width,
        padded=padded,
    )(flat, flat_dy, r, scale)
    return dx.reshape(x.shape), jnp.sum(partial, axis=0).astype(scale.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def rms_norm(x, scale, epsilon: float, dtype, interpret: bool = False):
    """`x * rsqrt(mean(x^2, -1) + epsilon) * scale` in float32, returned in `dtype`: T5's norm
    (`t2t.nn.layers.RMSNorm`) with its gradients, x [..., D] and scale [D].

    Args:
      x: the activations, any float dtype.
      scale: the learned scale [D].
      epsilon: added to the mean square.
      dtype: the result's dtype.
      interpret: run the kernels in Pallas's interpreter (any platform; slow).
    """
    return _forward(x, scale, epsilon, dtype, interpret)[0]


rms_norm.defvjp(_forward, _backward)
