"""Matmul FLOPs of a traced program, loops counted as many times as they run.

XLA's cost analysis counts the body of a loop once, so it undercounts a program with scanned
layers by the number of layers (and a microbatch loop by the microbatches). Counting on the
program's jaxpr instead sees every `dot_general` with its shapes, every `scan` with its length
and the forward computation a rematerialized backward pass repeats (`remat`), so it measures
what rematerialization costs, in the same units as `t2t.nn.flops` (2mkn per matmul, matmuls
only). cuDNN's fused attention (`jax.nn.dot_product_attention(implementation="cudnn")`) is one
primitive with no `dot_general` inside; it counts the products its kernels run: q k and p v
forward (4 B N L S H), and backward the recomputed q k, dv, dp, dq and dk (10 B N L S H); half
of each under a causal mask, whose kernels skip the blocks above the diagonal.
"""

from __future__ import annotations

import math
from typing import Any

from jax.extend import core as jex_core


def _sub_jaxprs(value: Any):
    if isinstance(value, jex_core.ClosedJaxpr):
        yield value.jaxpr
    elif isinstance(value, jex_core.Jaxpr):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _sub_jaxprs(item)


def _dot_flops(eqn) -> int:
    (lhs_contracting, _), _ = eqn.params["dimension_numbers"]
    lhs = eqn.invars[0].aval.shape
    out = eqn.outvars[0].aval.shape
    contracted = math.prod(lhs[d] for d in lhs_contracting)
    return 2 * math.prod(out) * contracted


# cuDNN fused attention's primitives (JAX's `jax._src.cudnn.fused_attention_stablehlo`), with
# the products each runs in units of B N L S H.
_CUDNN_ATTENTION = {
    "dot_product_attention_fwd_wrapper": 4,
    "dot_product_attention_fwd": 4,
    "dot_product_attention_bwd_wrapper": 10,
    "dot_product_attention_bwd": 10,
}


def _cudnn_attention_flops(eqn) -> int:
    query, key = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    if "BNTH" in str(eqn.params.get("layout", "")):
        (batch, heads, length, head_dim), key_length = query, key[2]
    else:  # BTNH, what t2t passes
        (batch, length, heads, head_dim), key_length = query, key[1]
    flops = _CUDNN_ATTENTION[eqn.primitive.name] * batch * heads * length * key_length * head_dim
    return flops // 2 if "CAUSAL" in str(eqn.params.get("mask_type", "")).upper() else flops


def matmul_flops(jaxpr: Any) -> int:
    """2 * m * k * n summed over every matmul the (closed) jaxpr runs.

    A `scan` body counts `length` times; a `cond` counts its most expensive branch; a `while`
    loop (unknown trip count) counts its body once; a Pallas kernel (`pallas_call`) counts its
    body once per point of its grid; a `shard_map` body (one device's shapes) once per device of
    its mesh; cuDNN's fused attention as the module docstring says.
    """
    return _count(jaxpr, fused_attention_only=False)


def fused_attention_flops(jaxpr: Any) -> int:
    """The part of `matmul_flops` that cuDNN's fused attention kernels run (loops counted the
    same way). Those kernels reach a fraction of the GEMMs' rate (the bias gradient adds passes
    over [B, N, L, S] scores), so the cost model may divide them by a rate of their own."""
    return _count(jaxpr, fused_attention_only=True)


def _count(jaxpr: Any, fused_attention_only: bool) -> int:
    if isinstance(jaxpr, jex_core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += 0 if fused_attention_only else _dot_flops(eqn)
            continue
        if name in _CUDNN_ATTENTION:
            total += _cudnn_attention_flops(eqn)
            continue
        if name == "cond":
            total += max(_count(b, fused_attention_only) for b in eqn.params["branches"])
            continue
        inner = sum(
            _count(sub, fused_attention_only)
            for value in eqn.params.values()
            for sub in _sub_jaxprs(value)
        )
        if name == "scan":
            inner *= eqn.params["length"]
        elif name == "pallas_call":
            inner *= math.prod(eqn.params["grid_mapping"].grid)
        elif name == "shard_map":  # the body's shapes are one device's: it runs on each
            inner *= _shard_map_devices(eqn.params)
        total += inner
    return total


def _shard_map_devices(params: dict) -> int:
    """How many devices a `shard_map` body runs on: its mesh's manual axes."""
    mesh = params["mesh"]
    manual = params.get("newly_manual_axes", params.get("manual_axes")) or mesh.axis_names
    sizes = dict(zip(mesh.axis_names, mesh.axis_sizes, strict=True))
    return math.prod(sizes[name] for name in manual)
