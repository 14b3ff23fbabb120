"""Matmul FLOPs of a traced program, loops counted as many times as they run.

XLA's cost analysis counts the body of a loop once, so it undercounts a program with scanned
layers by the number of layers (and a microbatch loop by the microbatches). Counting on the
program's jaxpr instead sees every `dot_general` with its shapes, every `scan` with its length
and the forward computation a rematerialized backward pass repeats (`remat`), so it measures
what rematerialization costs, in the same units as `t2t.nn.flops` (2mkn per matmul, matmuls
only).
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


def matmul_flops(jaxpr: Any) -> int:
    """2 * m * k * n summed over every matmul the (closed) jaxpr runs.

    A `scan` body counts `length` times; a `cond` counts its most expensive branch; a `while`
    loop (unknown trip count) counts its body once; a Pallas kernel (`pallas_call`) counts its
    body once per point of its grid.
    """
    if isinstance(jaxpr, jex_core.ClosedJaxpr):
        jaxpr = jaxpr.jaxpr
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            total += _dot_flops(eqn)
            continue
        if name == "cond":
            total += max(matmul_flops(b) for b in eqn.params["branches"])
            continue
        inner = sum(
            matmul_flops(sub) for value in eqn.params.values() for sub in _sub_jaxprs(value)
        )
        if name == "scan":
            inner *= eqn.params["length"]
        elif name == "pallas_call":
            inner *= math.prod(eqn.params["grid_mapping"].grid)
        total += inner
    return total
