"""T5's RMSNorm and the residual add before it as Pallas kernels (Triton, NVIDIA GPUs):
`norm_impl="pallas"`.

XLA computes a pre-norm residual branch's input in several passes over the `[tokens, D]`
activations (the residual add, the row reduction, the scaling; in the backward pass the row
reduction of the gradient, `dx`, the scale's column reduction and the sum with the residual
stream's own gradient), each kernel reading its arrays from device memory again: 44 GB of
T5.1.1-base's step at batch 128 by the cost model, 17.4 ms on the H100. Here each direction is
one kernel that reads a block of rows once:

- forward: `s = x + delta` (the residual stream's next value, rounded to its dtype), and
  `y = s * r * scale` with `r = rsqrt(mean(s^2) + epsilon)` per row;
- backward: `ds_total = ds + r * g - s * r^3 * mean(g * s)` with `g = dy * scale` (the residual
  stream's gradient `ds` added in the same pass; it is the gradient of both `x` and `delta`),
  and per block of rows a partial sum of `dy * s * r`, the scale's gradient, summed over the
  blocks by XLA.

Rows go `block_rows` to a program, columns padded to a power of two and masked; `BLOCKS` holds
each direction's rows per program and warps. Off a GPU the kernels run in Pallas's interpreter
(tests).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# Per direction: (elements one program holds per array, rows x padded columns; Triton warps per
# program). `benchmarks/gpu_norm_check.py --sweep` times the choices on a GPU.
BLOCKS = {"forward": (8192, 4), "backward": (8192, 4)}


def _geometry(width: int, direction: str) -> tuple[int, int, int]:
    """(padded width, rows per program, warps) for rows of `width` elements."""
    padded = pl.next_power_of_2(width)
    elements, warps = BLOCKS[direction]
    return padded, max(1, min(64, elements // padded)), warps


def _index(rows: int, width: int, padded: int, block_rows: int):
    row = pl.program_id(0) * block_rows + jnp.arange(block_rows)
    col = jnp.arange(padded)
    mask = (row[:, None] < rows) & (col[None, :] < width)
    return row, col, mask, (row[:, None], col[None, :])


def _forward_kernel(*refs, rows, width, padded, block_rows, epsilon, add):
    if add:
        x_ref, delta_ref, scale_ref, s_ref, y_ref, r_ref = refs
    else:
        x_ref, scale_ref, y_ref, r_ref = refs
    row, col, mask, at = _index(rows, width, padded, block_rows)
    s = plgpu.load(x_ref.at[at], mask=mask, other=0.0)
    if add:
        # The residual stream keeps its dtype: the norm sees the rounded sum, as in XLA.
        s = (
            s.astype(jnp.float32)
            + plgpu.load(delta_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
        ).astype(s_ref.dtype)
        plgpu.store(s_ref.at[at], s, mask=mask)
    s = s.astype(jnp.float32)
    scale = plgpu.load(scale_ref.at[col], mask=col < width, other=0.0).astype(jnp.float32)
    r = jax.lax.rsqrt(jnp.sum(s * s, axis=1) / width + epsilon)
    plgpu.store(y_ref.at[at], (s * r[:, None] * scale[None, :]).astype(y_ref.dtype), mask=mask)
    plgpu.store(r_ref.at[row], r, mask=row < rows)


def _backward_kernel(
    s_ref, ds_ref, dy_ref, r_ref, scale_ref, dx_ref, dscale_ref, *, rows, width, padded, block_rows
):
    row, col, mask, at = _index(rows, width, padded, block_rows)
    s = plgpu.load(s_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    dy = plgpu.load(dy_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    ds = plgpu.load(ds_ref.at[at], mask=mask, other=0.0).astype(jnp.float32)
    r = plgpu.load(r_ref.at[row], mask=row < rows, other=0.0)[:, None]
    scale = plgpu.load(scale_ref.at[col], mask=col < width, other=0.0).astype(jnp.float32)
    g = dy * scale[None, :]
    c = jnp.sum(g * s, axis=1, keepdims=True) / width
    dx = ds + r * g - s * (r * r * r) * c
    plgpu.store(dx_ref.at[at], dx.astype(dx_ref.dtype), mask=mask)
    plgpu.store(dscale_ref.at[pl.program_id(0), col], jnp.sum(dy * s * r, axis=0), mask=col < width)


def _call(kernel, direction, out_shape, rows: int, interpret: bool, width: int, **params):
    padded, block_rows, warps = _geometry(width, direction)
    return pl.pallas_call(
        functools.partial(
            kernel, rows=rows, width=width, padded=padded, block_rows=block_rows, **params
        ),
        grid=(pl.cdiv(rows, block_rows),),
        out_shape=out_shape,
        compiler_params=plgpu.CompilerParams(num_warps=warps),
        interpret=interpret,
    )


def forward(x, delta, scale, epsilon, dtype, interpret):
    """The forward kernel alone: ((x + delta, its RMS norm), residuals for `backward`); public
    so benchmarks time each direction (`benchmarks/gpu_norm_check.py`)."""
    width = x.shape[-1]
    flat = x.reshape(-1, width)
    rows = flat.shape[0]
    outputs = [
        jax.ShapeDtypeStruct(flat.shape, dtype),
        jax.ShapeDtypeStruct((rows,), jnp.float32),
    ]
    add = delta is not None
    if add:
        outputs.insert(0, jax.ShapeDtypeStruct(flat.shape, x.dtype))
        inputs = (flat, delta.reshape(flat.shape).astype(x.dtype), scale)
    else:
        inputs = (flat, scale)
    found = _call(
        _forward_kernel, "forward", outputs, rows, interpret, width, epsilon=epsilon, add=add
    )(*inputs)
    s, (y, r) = (found[0].reshape(x.shape), found[1:]) if add else (x, found)
    return (s, y.reshape(x.shape)), (s, r, scale)


def backward(residuals, cotangents, interpret):
    """The backward kernel alone: (d(x + delta), d scale) from `forward`'s residuals and the
    cotangents of its two outputs."""
    s, r, scale = residuals
    ds, dy = cotangents
    width = s.shape[-1]
    rows = s.size // width
    _, block_rows, _ = _geometry(width, "backward")
    dx, partial = _call(
        _backward_kernel,
        "backward",
        [
            jax.ShapeDtypeStruct((rows, width), s.dtype),
            jax.ShapeDtypeStruct((pl.cdiv(rows, block_rows), width), jnp.float32),
        ],
        rows,
        interpret,
        width,
    )(*(a.reshape(rows, width) for a in (s, ds, dy)), r, scale)
    return dx.reshape(s.shape), jnp.sum(partial, axis=0).astype(scale.dtype)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def add_rms_norm(x, delta, scale, epsilon: float, dtype, interpret: bool = False):
    """`s = x + delta` and T5's norm of it, `s * rsqrt(mean(s^2, -1) + epsilon) * scale` in
    float32 returned in `dtype` (`t2t.nn.layers.RMSNorm.residual`), with their gradients.

    Args:
      x: the residual stream [..., D], any float dtype (`s` keeps it).
      delta: the branch output added to it [..., D].
      scale: the learned scale [D].
      epsilon: added to the mean square.
      dtype: the norm's dtype.
      interpret: run the kernels in Pallas's interpreter (any platform; slow).

    Returns:
      `(s, y)`.
    """
    return forward(x, delta, scale, epsilon, dtype, interpret)[0]


def _add_backward(epsilon, dtype, interpret, residuals, cotangents):
    dx, dscale = backward(residuals, cotangents, interpret)
    return dx, dx, dscale  # s = x + delta: one gradient for both


add_rms_norm.defvjp(
    lambda x, delta, scale, epsilon, dtype, interpret: forward(
        x, delta, scale, epsilon, dtype, interpret
    ),
    _add_backward,
)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def rms_norm_residual(x, scale, epsilon: float, dtype, interpret: bool = False):
    """`(x, norm(x))`, `add_rms_norm` without the add: the residual stream passes through, so
    its gradient joins the norm's in the backward kernel."""
    return forward(x, None, scale, epsilon, dtype, interpret)[0]


def _residual_backward(epsilon, dtype, interpret, residuals, cotangents):
    return backward(residuals, cotangents, interpret)


rms_norm_residual.defvjp(
    lambda x, scale, epsilon, dtype, interpret: forward(x, None, scale, epsilon, dtype, interpret),
    _residual_backward,
)
