"""Flash attention for TPUs with T5's position bias shared by the batch (Pallas, Mosaic).

JAX's Pallas flash attention for TPUs takes its bias as a [B, N, L, S] operand and returns its
gradient at that size, so T5's relative position bias, one [N, L, S] array per stack, has to be
broadcast over the batch in device memory and its gradient summed back: the traffic flash
attention exists to avoid. These kernels read the bias as [N, L, S], once per block of `bb`
rows of the batch, and sum its gradient over the batch on chip, so nothing of size
[B, N, L, S] is ever written.

The kernels, each over blocks of `bq` queries and `bk` keys of `bb` rows:

- forward (grid rows, heads, query blocks, key blocks): the online softmax over the key
  blocks; writes the output and each query's log-sum-exp `lse`;
- backward in one kernel (grid heads, row blocks, key blocks, query blocks), where its on-chip
  arrays fit (`FUSED_BACKWARD_BYTES`, as for T5's 512 tokens): recomputes each block of
  `p = exp(s - lse)` and `ds = p * (do v - D)`, `D = sum(do * o)`, once; accumulates
  `dv = p^T do` and `dk = ds^T q` per key block, `dq = ds k` for all of a row block's queries,
  and the head's [L, S] bias gradient `sum_rows ds`, which stays on chip while every block of
  rows and keys adds to it;
- else backward in two kernels: the queries' gradient and the bias's (grid heads, query
  blocks, row blocks, key blocks; an [bq, S] bias gradient block stays on chip across the rows
  and keys), then the keys' and values' (grid rows, heads, key blocks, query blocks).

The kernels compute the scores transposed, `k q^T` ([keys, queries], the queries along the
lanes; the bias comes in as [N, S, L]), and write every output (o, dq, dk, dv, the bias
gradient) with its sequence dimension minor, `[B, N, H, L]`: the layout the output projection
and the input gradients' matmuls read, so XLA no longer copies them into it (the weight
gradients' products read `[N, H, B, L]` and still get a copy). Compiled for v5e, T5.1.1-base's
step moved 24.7 GB of such copies per step with `[B, N, L, H]` outputs, 11.4 GB now. The
backward kernels read the output's gradient `do` in the same layout as the output, so
`D = sum(do * o)` multiplies two arrays of one layout, which XLA fuses into the matmul that
produces `do` (with `do` as `[B, N, L, H]` it stored a float32 transposed copy of `o` for it,
3.6 GB per step at T5.1.1-base's 512 tokens on v5e). Each
kernel declares the device-memory bytes it moves, blocks fetched again included
(`pl.CostEstimate`), which `t2t.aot.cost_model` counts.

Masks: segment ids per row (padding as segment 0, which real tokens never share) and a causal
flag; a masked logit gets -1e10 added, as on the XLA path, so a query that sees no key gets a
uniform softmax, not NaNs. No scaling of the logits (T5's is in the query initializer). Off a TPU
the kernels run in Pallas's interpreter (tests).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from t2t.nn import masks

MASKED = masks.MASKED_BIAS


@dataclasses.dataclass(frozen=True)
class Blocks:
    """Rows of the batch, queries and keys per kernel program."""

    rows: int = 8
    queries: int = 128
    keys: int = 128
    # The backward pass in one kernel where its bias and query gradients fit on chip.
    fused_backward: bool = True


def fits(batch: int, length: int, key_length: int, blocks: Blocks = Blocks()) -> str | None:
    """Why these kernels cannot tile this attention (None when they can)."""
    rows = min(blocks.rows, batch)
    if batch % rows or (rows != batch and rows % 8):
        return f"the batch ({batch} rows per device) in blocks of {rows}"
    bq, bk = min(blocks.queries, length), min(blocks.keys, key_length)
    if length % bq or key_length % bk:
        return f"query and key lengths {length} and {key_length} in blocks of {bq} and {bk}"
    return None


def _geometry(q, k, blocks: Blocks):
    batch, _, length, _ = q.shape
    key_length = k.shape[2]
    return (
        min(blocks.rows, batch),
        min(blocks.queries, length),
        min(blocks.keys, key_length),
    )


def _mask(q_seg, kv_seg, causal, i, j, bq, bk):
    """[bk, bq] float32 (keys down, queries across): 0 where the query sees the key, MASKED
    where not (or None)."""
    visible = None
    if q_seg is not None:
        visible = kv_seg[:, None] == q_seg[None, :]
    if causal:
        keys = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bk, bq), 0)
        queries = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bk, bq), 1)
        earlier = keys <= queries
        visible = earlier if visible is None else visible & earlier
    if visible is None:
        return None
    return jnp.where(visible, 0.0, MASKED)


# dot_general dimension numbers: a [x, H] block times a [y, H] block -> [x, y]; the product
# [x, z] [z, y] -> [x, y]; and contracting the first dimensions of both, [z, x] and [z, y] ->
# [x, y].
_ROWS_BY_ROWS = (((1,), (1,)), ((), ()))
_PRODUCT = (((1,), (0,)), ((), ()))
_FIRST_BY_FIRST = (((0,), (0,)), ((), ()))
_FIRST_BY_SECOND = (((0,), (1,)), ((), ()))


def _dot(a, b, dimensions):
    return jax.lax.dot_general(a, b, dimensions, preferred_element_type=jnp.float32)


def _scores(q, k, bias_t, mask_t):
    """The transposed logits `k q^T + bias^T`, masked: [bk, bq] float32, the queries along the
    lanes, so every output the kernels write has its sequence dimension minor."""
    s = _dot(k, q, _ROWS_BY_ROWS)
    if bias_t is not None:
        s = s + bias_t
    if mask_t is not None:
        s = s + mask_t
    return s


def _nbytes(x) -> int:
    return 0 if x is None else x.size * x.dtype.itemsize


def _cost(flops: int, transcendentals: int, *moved) -> pl.CostEstimate:
    """What a kernel computes and the device-memory bytes it moves: `moved` is (times, array)
    pairs, an array read or written `times` times (its blocks fetched again for each block of
    the other operand, the bias once per block of rows)."""
    total = sum(times * _nbytes(x) for times, x in moved)
    return pl.CostEstimate(
        flops=int(flops), transcendentals=int(transcendentals), bytes_accessed=int(total)
    )


def _inputs(order, geometry, head_dim, **arrays):
    """The kernels' operands that are present (the bias and the segment ids may be None) with
    their block specs. `order` maps a point of the kernel's grid to its (row block, head, query
    block, key block), so every kernel reads each array in the same blocks whatever its grid's
    order. Returns (names, operands, specs)."""
    bb, bq, bk = geometry
    blocks = {  # name -> (block shape, block index from (b, h, i, j))
        "q": ((bb, None, bq, head_dim), lambda b, h, i, j: (b, h, i, 0)),
        "k": ((bb, None, bk, head_dim), lambda b, h, i, j: (b, h, j, 0)),
        "v": ((bb, None, bk, head_dim), lambda b, h, i, j: (b, h, j, 0)),
        "bias": ((None, bk, bq), lambda b, h, i, j: (h, j, i)),  # transposed: [N, S, L]
        "q_seg": ((bb, bq), lambda b, h, i, j: (b, i)),
        "kv_seg": ((bb, bk), lambda b, h, i, j: (b, j)),
        "do": ((bb, None, head_dim, bq), lambda b, h, i, j: (b, h, 0, i)),  # transposed
        "lse": ((None, bb, bq), lambda b, h, i, j: (h, b, i)),
        "delta": ((None, bb, bq), lambda b, h, i, j: (h, b, i)),
    }
    names, operands, specs = [], [], []
    for name, array in arrays.items():
        if array is None:
            continue
        shape, index = blocks[name]
        names.append(name)
        operands.append(array)
        specs.append(pl.BlockSpec(shape, lambda *point, index=index: index(*order(*point))))
    return names, operands, specs


def _refs(refs, names):
    return dict(zip(names, refs, strict=True))


# ---------------------------------------------------------------------------------------------
# forward


def _forward_kernel(*refs, names, causal, bb, bq, bk, key_blocks):
    r = _refs(refs, names)
    i, j = pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _():
        r["m"][...] = jnp.full(r["m"].shape, -jnp.inf, jnp.float32)
        r["l"][...] = jnp.zeros(r["l"].shape, jnp.float32)
        r["acc"][...] = jnp.zeros(r["acc"].shape, jnp.float32)

    bias = r["bias"][...].astype(jnp.float32) if "bias" in r else None
    for row in range(bb):
        q_seg = r["q_seg"][row] if "q_seg" in r else None
        kv_seg = r["kv_seg"][row] if "kv_seg" in r else None
        mask = _mask(q_seg, kv_seg, causal, i, j, bq, bk)
        s = _scores(r["q"][row], r["k"][row], bias, mask)  # [bk, bq]
        m_old = r["m"][row]  # [1, bq]
        m_new = jnp.maximum(m_old, jnp.max(s, axis=0, keepdims=True))
        alpha = jnp.exp(m_old - m_new)
        p = jnp.exp(s - m_new)
        r["l"][row] = alpha * r["l"][row] + jnp.sum(p, axis=0, keepdims=True)
        # o^T [H, bq] += v^T p^T
        r["acc"][row] = alpha * r["acc"][row] + _dot(
            r["v"][row], p.astype(r["v"].dtype), _FIRST_BY_FIRST
        )
        r["m"][row] = m_new

    @pl.when(j == key_blocks - 1)
    def _():
        for row in range(bb):
            total = r["l"][row]
            r["o"][row] = (r["acc"][row] / total).astype(r["o"].dtype)
            r["lse"][row] = (r["m"][row] + jnp.log(total))[0]


def _forward(q, k, v, bias, q_seg, kv_seg, causal, blocks, interpret):
    """q [B, N, L, H], k and v [B, N, S, H], the transposed bias [N, S, L] or None, segment ids
    [B, L] and [B, S] or None -> (the transposed output [B, N, H, L], lse [N, B, L] float32)."""
    batch, heads, length, head_dim = q.shape
    key_length = k.shape[2]
    bb, bq, bk = _geometry(q, k, blocks)
    grid = (batch // bb, heads, length // bq, key_length // bk)
    names, operands, specs = _inputs(
        lambda b, h, i, j: (b, h, i, j),
        (bb, bq, bk),
        head_dim,
        q=q,
        k=k,
        v=v,
        bias=bias,
        q_seg=q_seg,
        kv_seg=kv_seg,
    )
    names += ["o", "lse", "m", "l", "acc"]
    kernel = functools.partial(
        _forward_kernel,
        names=tuple(names),
        causal=causal,
        bb=bb,
        bq=bq,
        bk=bk,
        key_blocks=grid[3],
    )
    out_shape = [
        jax.ShapeDtypeStruct((batch, heads, head_dim, length), q.dtype),
        jax.ShapeDtypeStruct((heads, batch, length), jnp.float32),
    ]
    product = batch * heads * length * key_length
    cost = _cost(
        4 * product * head_dim,
        product,
        (1, q),
        (grid[2], k),
        (grid[2], v),
        (grid[0], bias),
        (heads, q_seg),
        (heads * grid[2], kv_seg),
        *((1, o) for o in out_shape),
    )
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=specs,
        cost_estimate=cost,
        out_specs=[
            pl.BlockSpec((bb, None, head_dim, bq), lambda b, h, i, j: (b, h, 0, i)),
            pl.BlockSpec((None, bb, bq), lambda b, h, i, j: (h, b, i)),
        ],
        out_shape=out_shape,
        scratch_shapes=[
            pltpu.VMEM((bb, 1, bq), jnp.float32),
            pltpu.VMEM((bb, 1, bq), jnp.float32),
            pltpu.VMEM((bb, head_dim, bq), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
    )(*operands)


# ---------------------------------------------------------------------------------------------
# backward: queries and bias


def _probabilities_and_ds(r, row, bias, causal, i, j, bq, bk):
    q_seg = r["q_seg"][row] if "q_seg" in r else None
    kv_seg = r["kv_seg"][row] if "kv_seg" in r else None
    mask = _mask(q_seg, kv_seg, causal, i, j, bq, bk)
    s = _scores(r["q"][row], r["k"][row], bias, mask)
    p = jnp.exp(s - r["lse"][row][None, :])  # [bk, bq]
    dp = _dot(r["v"][row], r["do"][row], _PRODUCT)  # (do v^T)^T = v do^T
    ds = p * (dp - r["delta"][row][None, :])
    return p, ds


def _dq_kernel(*refs, names, causal, bb, bq, bk, key_blocks):
    r = _refs(refs, names)
    i, b, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)
    with_bias = "dbias" in r

    @pl.when(j == 0)
    def _():
        r["dq_acc"][...] = jnp.zeros(r["dq_acc"].shape, jnp.float32)

    if with_bias:

        @pl.when((b == 0) & (j == 0))
        def _():
            r["dbias"][...] = jnp.zeros(r["dbias"].shape, jnp.float32)

    bias = r["bias"][...].astype(jnp.float32) if "bias" in r else None
    ds_sum = None
    for row in range(bb):
        _, ds = _probabilities_and_ds(r, row, bias, causal, i, j, bq, bk)
        # dq^T [H, bq] += k^T ds^T
        r["dq_acc"][row] += _dot(r["k"][row], ds.astype(r["k"].dtype), _FIRST_BY_FIRST)
        ds_sum = ds if ds_sum is None else ds_sum + ds
    if with_bias:
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        r["dbias"][keys, :] += ds_sum

    @pl.when(j == key_blocks - 1)
    def _():
        r["dq"][...] = r["dq_acc"][...].astype(r["dq"].dtype)


def _dq_and_dbias(arrays, causal, blocks, interpret):
    q, k, v, bias, q_seg, kv_seg, do, lse, delta = (
        arrays[n] for n in ("q", "k", "v", "bias", "q_seg", "kv_seg", "do", "lse", "delta")
    )
    batch, heads, length, head_dim = q.shape
    key_length = k.shape[2]
    bb, bq, bk = _geometry(q, k, blocks)
    grid = (heads, length // bq, batch // bb, key_length // bk)
    names, operands, specs = _inputs(
        lambda h, i, b, j: (b, h, i, j),
        (bb, bq, bk),
        head_dim,
        **arrays,
    )
    out_specs = [pl.BlockSpec((bb, None, head_dim, bq), lambda h, i, b, j: (b, h, 0, i))]
    out_shape = [jax.ShapeDtypeStruct((batch, heads, head_dim, length), q.dtype)]
    names.append("dq")
    if bias is not None:  # one [S, bq] block per head and query block, summed over the batch
        out_specs.append(pl.BlockSpec((None, key_length, bq), lambda h, i, b, j: (h, 0, i)))
        out_shape.append(jax.ShapeDtypeStruct((heads, key_length, length), jnp.float32))
        names.append("dbias")
    names.append("dq_acc")
    kernel = functools.partial(
        _dq_kernel,
        names=tuple(names),
        causal=causal,
        bb=bb,
        bq=bq,
        bk=bk,
        key_blocks=grid[3],
    )
    product = batch * heads * length * key_length
    cost = _cost(
        6 * product * head_dim,
        product,
        (1, q),
        (1, do),
        (1, lse),
        (1, delta),
        (grid[1], k),
        (grid[1], v),
        (grid[2], bias),
        (heads, q_seg),
        (heads * grid[1], kv_seg),
        *((1, o) for o in out_shape),
    )
    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=specs,
        cost_estimate=cost,
        out_specs=out_specs,
        out_shape=out_shape,
        scratch_shapes=[pltpu.VMEM((bb, head_dim, bq), jnp.float32)],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary")
        ),
        interpret=interpret,
    )(*operands)
    return out[0], (out[1] if bias is not None else None)


# ---------------------------------------------------------------------------------------------
# backward: keys and values


def _dkv_kernel(*refs, names, causal, bb, bq, bk, query_blocks):
    r = _refs(refs, names)
    j, i = pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _():
        r["dk_acc"][...] = jnp.zeros(r["dk_acc"].shape, jnp.float32)
        r["dv_acc"][...] = jnp.zeros(r["dv_acc"].shape, jnp.float32)

    bias = r["bias"][...].astype(jnp.float32) if "bias" in r else None
    for row in range(bb):
        p, ds = _probabilities_and_ds(r, row, bias, causal, i, j, bq, bk)
        # dv^T [H, bk] += do^T p, dk^T [H, bk] += q^T ds
        r["dv_acc"][row] += _dot(r["do"][row], p.astype(r["do"].dtype), _ROWS_BY_ROWS)
        r["dk_acc"][row] += _dot(r["q"][row], ds.astype(r["q"].dtype), _FIRST_BY_SECOND)

    @pl.when(i == query_blocks - 1)
    def _():
        r["dk"][...] = r["dk_acc"][...].astype(r["dk"].dtype)
        r["dv"][...] = r["dv_acc"][...].astype(r["dv"].dtype)


def _key_major_reads(arrays, row_blocks, key_blocks):
    """What a backward kernel that walks every query block for each key block reads, as
    `_cost`'s (times, array) pairs: the keys and values once, the queries' arrays once per key
    block, the bias once per block of rows."""
    heads = arrays["q"].shape[1]
    return (
        (1, arrays["k"]),
        (1, arrays["v"]),
        *((key_blocks, arrays[name]) for name in ("q", "do", "lse", "delta")),
        (row_blocks, arrays["bias"]),
        (heads * key_blocks, arrays["q_seg"]),
        (heads, arrays["kv_seg"]),
    )


def _dk_and_dv(arrays, causal, blocks, interpret):
    q, k = arrays["q"], arrays["k"]
    batch, heads, length, head_dim = q.shape
    key_length = k.shape[2]
    bb, bq, bk = _geometry(q, k, blocks)
    grid = (batch // bb, heads, key_length // bk, length // bq)
    names, operands, specs = _inputs(
        lambda b, h, j, i: (b, h, i, j),
        (bb, bq, bk),
        head_dim,
        **arrays,
    )
    names += ["dk", "dv", "dk_acc", "dv_acc"]
    kernel = functools.partial(
        _dkv_kernel,
        names=tuple(names),
        causal=causal,
        bb=bb,
        bq=bq,
        bk=bk,
        query_blocks=grid[3],
    )
    kv_spec = pl.BlockSpec((bb, None, head_dim, bk), lambda b, h, j, i: (b, h, 0, j))
    kv_shape = jax.ShapeDtypeStruct((batch, heads, head_dim, key_length), k.dtype)
    product = batch * heads * length * key_length
    cost = _cost(
        8 * product * head_dim,
        product,
        *_key_major_reads(arrays, row_blocks=grid[0], key_blocks=grid[2]),
        (2, kv_shape),  # dk and dv, written once
    )
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=specs,
        cost_estimate=cost,
        out_specs=[kv_spec, kv_spec],
        out_shape=[kv_shape, kv_shape],
        scratch_shapes=[
            pltpu.VMEM((bb, head_dim, bk), jnp.float32),
            pltpu.VMEM((bb, head_dim, bk), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")
        ),
        interpret=interpret,
    )(*operands)


# ---------------------------------------------------------------------------------------------
# backward in one kernel, where the bias's and the queries' gradients fit in on-chip memory

# The most on-chip memory (VMEM) the one-kernel backward may plan for by `_fused_bytes`; Mosaic's
# default scoped limit is 16 MiB, and T5.1.1-base's encoder (512 x 512, 12 heads of 64) in
# blocks of 8 rows and 128 x 128 plans 10.5 MiB (compiled for v5e; 16 rows or 512 keys a block
# exceeded the limit).
FUSED_BACKWARD_BYTES = 12 * 2**20


def _fused_bytes(q, k, blocks: Blocks) -> int:
    """On-chip bytes the one-kernel backward holds: the head's [S, L] float32 bias gradient, a
    block of rows' [bb, H, L] query gradient (float32 and its output), the keys' and values'
    accumulators, outputs and input blocks, each double-buffered where it is an operand; q, k
    and v blocks have the head dimension minor, padded to 128 lanes (do's has the queries)."""
    _, _, length, head_dim = q.shape
    key_length = k.shape[2]
    bb, bq, bk = _geometry(q, k, blocks)
    lanes, size = max(128, head_dim), q.dtype.itemsize
    return (
        2 * length * key_length * 4  # dbias
        + bb * head_dim * length * (4 + 2 * size)  # dq: accumulator and output
        + 2 * bb * head_dim * bk * (4 + 2 * size)  # dk, dv: accumulators and outputs
        + 2 * bb * bq * lanes * size  # q
        + 2 * bb * head_dim * bq * size  # do, transposed
        + 2 * 2 * bb * bk * lanes * size  # k, v
        + 2 * bq * bk * size  # the bias block
    )


def _fused_backward_kernel(*refs, names, causal, bb, bq, bk, key_blocks, query_blocks):
    r = _refs(refs, names)
    b, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)
    with_bias = "dbias" in r

    @pl.when((j == 0) & (i == 0))
    def _():
        r["dq_acc"][...] = jnp.zeros(r["dq_acc"].shape, jnp.float32)

    @pl.when(i == 0)
    def _():
        r["dk_acc"][...] = jnp.zeros(r["dk_acc"].shape, jnp.float32)
        r["dv_acc"][...] = jnp.zeros(r["dv_acc"].shape, jnp.float32)

    if with_bias:

        @pl.when((b == 0) & (j == 0) & (i == 0))
        def _():
            r["dbias"][...] = jnp.zeros(r["dbias"].shape, jnp.float32)

    bias = r["bias"][...].astype(jnp.float32) if "bias" in r else None
    queries = pl.ds(pl.multiple_of(i * bq, bq), bq)
    ds_sum = None
    for row in range(bb):
        p, ds = _probabilities_and_ds(r, row, bias, causal, i, j, bq, bk)
        # dv^T [H, bk] += do^T p; dk^T [H, bk] += q^T ds; dq^T [H, bq] += k^T ds^T
        r["dv_acc"][row] += _dot(r["do"][row], p.astype(r["do"].dtype), _ROWS_BY_ROWS)
        r["dk_acc"][row] += _dot(r["q"][row], ds.astype(r["q"].dtype), _FIRST_BY_SECOND)
        r["dq_acc"][row, :, queries] += _dot(r["k"][row], ds.astype(r["k"].dtype), _FIRST_BY_FIRST)
        ds_sum = ds if ds_sum is None else ds_sum + ds
    if with_bias:
        keys = pl.ds(pl.multiple_of(j * bk, bk), bk)
        r["dbias"][keys, queries] += ds_sum

    @pl.when(i == query_blocks - 1)
    def _():
        r["dk"][...] = r["dk_acc"][...].astype(r["dk"].dtype)
        r["dv"][...] = r["dv_acc"][...].astype(r["dv"].dtype)

    @pl.when((j == key_blocks - 1) & (i == query_blocks - 1))
    def _():
        r["dq"][...] = r["dq_acc"][...].astype(r["dq"].dtype)


def _fused_backward(arrays, causal, blocks, interpret):
    """dq, dk, dv and the bias's gradient in one kernel: each block of scores is recomputed
    once, not once for the queries' gradient and again for the keys'."""
    q, k, bias = arrays["q"], arrays["k"], arrays["bias"]
    batch, heads, length, head_dim = q.shape
    key_length = k.shape[2]
    bb, bq, bk = _geometry(q, k, blocks)
    grid = (heads, batch // bb, key_length // bk, length // bq)
    names, operands, specs = _inputs(
        lambda h, b, j, i: (b, h, i, j),
        (bb, bq, bk),
        head_dim,
        **arrays,
    )
    kv_spec = pl.BlockSpec((bb, None, head_dim, bk), lambda h, b, j, i: (b, h, 0, j))
    kv_shape = jax.ShapeDtypeStruct((batch, heads, head_dim, key_length), k.dtype)
    out_specs = [
        pl.BlockSpec((bb, None, head_dim, length), lambda h, b, j, i: (b, h, 0, 0)),
        kv_spec,
        kv_spec,
    ]
    out_shape = [
        jax.ShapeDtypeStruct((batch, heads, head_dim, length), q.dtype),
        kv_shape,
        kv_shape,
    ]
    names += ["dq", "dk", "dv"]
    if bias is not None:  # one [S, L] block per head, summed over the batch
        out_specs.append(pl.BlockSpec((None, key_length, length), lambda h, b, j, i: (h, 0, 0)))
        out_shape.append(jax.ShapeDtypeStruct((heads, key_length, length), jnp.float32))
        names.append("dbias")
    names += ["dq_acc", "dk_acc", "dv_acc"]
    product = batch * heads * length * key_length
    cost = _cost(
        10 * product * head_dim,
        product,
        *_key_major_reads(arrays, row_blocks=grid[1], key_blocks=grid[2]),
        *((1, o) for o in out_shape),
    )
    kernel = functools.partial(
        _fused_backward_kernel,
        names=tuple(names),
        causal=causal,
        bb=bb,
        bq=bq,
        bk=bk,
        key_blocks=grid[2],
        query_blocks=grid[3],
    )
    out = pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=specs,
        out_specs=out_specs,
        out_shape=out_shape,
        cost_estimate=cost,
        scratch_shapes=[
            pltpu.VMEM((bb, head_dim, length), jnp.float32),
            pltpu.VMEM((bb, head_dim, bk), jnp.float32),
            pltpu.VMEM((bb, head_dim, bk), jnp.float32),
        ],
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "arbitrary", "arbitrary", "arbitrary")
        ),
        interpret=interpret,
    )(*operands)
    return out[0], out[1], out[2], (out[3] if bias is not None else None)


# ---------------------------------------------------------------------------------------------
# the op


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def flash_attention(q, k, v, bias, q_seg, kv_seg, causal, blocks=Blocks(), interpret=False):
    """softmax(q k^T + bias, masked) v.

    Args:
      q: [B, N, L, H]; k, v: [B, N, S, H].
      bias: [N, L, S] (shared by every row of the batch) or None.
      q_seg, kv_seg: [B, L] and [B, S] int32 segment ids (a query sees the keys of its own
        segment) or None for both.
      causal: whether query i sees only keys up to i.
      blocks: the kernels' `Blocks`.
      interpret: run in Pallas's interpreter (off a TPU; or inside
        `pltpu.force_tpu_interpret_mode()`).

    Returns:
      [B, N, L, H] in q's dtype.
    """
    return _flash_fwd(q, k, v, bias, q_seg, kv_seg, causal, blocks, interpret)[0]


def _transposed(x: jax.Array | None) -> jax.Array | None:
    """Swaps the last two dimensions: the kernels write their outputs with the sequence minor,
    the layout the matmuls after them read, so XLA needs no copy to change it."""
    return None if x is None else jnp.swapaxes(x, -1, -2)


def _flash_fwd(q, k, v, bias, q_seg, kv_seg, causal, blocks, interpret):
    o_t, lse = _forward(q, k, v, _transposed(bias), q_seg, kv_seg, causal, blocks, interpret)
    return _transposed(o_t), (q, k, v, bias, q_seg, kv_seg, o_t, lse)


def _flash_bwd(causal, blocks, interpret, residuals, do):
    q, k, v, bias, q_seg, kv_seg, o_t, lse = residuals
    # The kernels read do transposed, [B, N, H, L] like o: D = rowsum(do * o) ([N, B, L] like
    # lse) is then an elementwise product of two arrays in one layout, which XLA computes in
    # the epilogue of the matmul that produces do, with no copy of either.
    do = _transposed(do)
    delta = jnp.sum(do.astype(jnp.float32) * o_t.astype(jnp.float32), axis=2).swapaxes(0, 1)
    arrays = dict(
        q=q,
        k=k,
        v=v,
        bias=_transposed(bias),
        q_seg=q_seg,
        kv_seg=kv_seg,
        do=do,
        lse=lse,
        delta=delta,
    )
    args = (arrays, causal, blocks, interpret)
    if blocks.fused_backward and _fused_bytes(q, k, blocks) <= FUSED_BACKWARD_BYTES:
        dq, dk, dv, dbias = _fused_backward(*args)
    else:
        dq, dbias = _dq_and_dbias(*args)
        dk, dv = _dk_and_dv(*args)
    dq, dk, dv, dbias = (_transposed(x) for x in (dq, dk, dv, dbias))
    if bias is not None:
        dbias = dbias.astype(bias.dtype)
    return dq, dk, dv, dbias, None, None


flash_attention.defvjp(_flash_fwd, _flash_bwd)
