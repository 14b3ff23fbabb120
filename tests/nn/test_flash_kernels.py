"""t2t's TPU flash attention kernels (run here by Pallas's interpreter) compute the masked,
biased softmax attention and its gradients, the bias's summed over the batch: against a
float32 reference at several blocks of rows, queries and keys, with padding, packed segments, a
causal mask, no bias, and query and key lengths that differ; and they say what they cannot
tile."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.nn import flash_kernels, masks


def reference(q, k, v, bias, q_seg, kv_seg, causal):
    s = jnp.einsum("bnlh,bnsh->bnls", q, k, precision="highest")
    if bias is not None:
        s = s + bias[None]
    visible = jnp.ones(s.shape[-2:], bool)[None, None]
    if q_seg is not None:
        visible = visible & (q_seg[:, None, :, None] == kv_seg[:, None, None, :])
    if causal:
        visible = visible & (jnp.arange(s.shape[-1])[None] <= jnp.arange(s.shape[-2])[:, None])
    s = s + jnp.where(visible, 0.0, masks.MASKED_BIAS)
    return jnp.einsum("bnls,bnsh->bnlh", jax.nn.softmax(s, -1), v, precision="highest")


def relative(got, want):
    return float(jnp.linalg.norm(got - want) / jnp.linalg.norm(want))


# (causal, segments, bias, key length, one-kernel backward): 16 rows in 2 blocks, 2 query
# blocks, up to 3 key blocks.
@pytest.mark.parametrize(
    "causal, segments, with_bias, keys, fused",
    [
        (False, "padding", True, 384, True),  # the encoder: padding, the position bias
        (False, "padding", True, 384, False),  # the same in two backward kernels
        (True, None, True, 256, True),  # the decoder: causal, the position bias
        (False, "packed", False, 384, False),  # packed rows, no bias (cross-attention)
    ],
)
def test_the_kernels_compute_attention_and_every_gradient(causal, segments, with_bias, keys, fused):
    blocks = flash_kernels.Blocks(rows=8, queries=128, keys=128, fused_backward=fused)
    batch, heads, length, head_dim = 16, 2, 256, 32
    rng = jax.random.split(jax.random.PRNGKey(0), 6)
    q = jax.random.normal(rng[0], (batch, heads, length, head_dim))
    k = jax.random.normal(rng[1], (batch, heads, keys, head_dim))
    v = jax.random.normal(rng[2], (batch, heads, keys, head_dim))
    bias = jax.random.normal(rng[3], (heads, length, keys)) if with_bias else None
    weights = jax.random.normal(rng[4], q.shape)
    q_seg = kv_seg = None
    if segments == "padding":  # rows padded at the end, some shorter than a block
        lengths = np.array([length] * batch)
        lengths[:5] = [100, 256, 17, 200, 255]
        key_lengths = np.array([keys] * batch)
        key_lengths[:5] = [100, 384, 17, 300, 255]
        q_seg = jnp.asarray(np.arange(length)[None] < lengths[:, None], jnp.int32)
        kv_seg = jnp.asarray(np.arange(keys)[None] < key_lengths[:, None], jnp.int32)
    elif segments == "packed":  # segments 0-3 of random lengths, in order
        q_seg = jnp.asarray(np.sort(np.random.default_rng(1).integers(0, 4, (batch, length))))
        kv_seg = jnp.asarray(np.sort(np.random.default_rng(2).integers(0, 4, (batch, keys))))

    def loss(fn):
        def objective(q, k, v, bias):
            return jnp.sum(fn(q, k, v, bias, q_seg, kv_seg, causal) * weights)

        return objective

    def flash(*args):
        return flash_kernels.flash_attention(*args, blocks=blocks, interpret=True)

    argnums = (0, 1, 2, 3) if with_bias else (0, 1, 2)
    got_out = flash(q, k, v, bias, q_seg, kv_seg, causal)
    want_out = reference(q, k, v, bias, q_seg, kv_seg, causal)
    assert got_out.shape == want_out.shape
    assert relative(got_out, want_out) < 1e-5
    got = jax.grad(loss(flash), argnums)(q, k, v, bias)
    want = jax.grad(loss(reference), argnums)(q, k, v, bias)
    for name, a, b in zip(("q", "k", "v", "bias"), got, want):
        assert a.shape == b.shape, name
        assert relative(a, b) < 1e-5, name


def test_bfloat16_inputs_compute_within_their_rounding():
    batch, heads, length, head_dim = 8, 2, 128, 32
    rng = jax.random.split(jax.random.PRNGKey(1), 4)
    q, k, v = (jax.random.normal(r, (batch, heads, length, head_dim)) for r in rng[:3])
    bias = jax.random.normal(rng[3], (heads, length, length))
    want = reference(q, k, v, bias, None, None, False)
    low = [x.astype(jnp.bfloat16) for x in (q, k, v, bias)]
    got = flash_kernels.flash_attention(*low, None, None, False, interpret=True)
    assert got.dtype == jnp.bfloat16
    assert relative(got.astype(jnp.float32), want) < 1e-2


def test_fits_says_what_it_cannot_tile():
    assert flash_kernels.fits(128, 512, 512) is None
    assert flash_kernels.fits(4, 512, 512) is None  # all rows in one block
    assert "batch" in flash_kernels.fits(12, 512, 512)  # 12 rows in blocks of 8
    assert "lengths" in flash_kernels.fits(8, 200, 512, flash_kernels.Blocks(queries=128))


def test_a_rematerialized_call_takes_the_same_gradients():
    """Under `jax.checkpoint` (the stacks' remat policies) the forward kernel runs again in the
    backward pass; the gradients are the same."""
    rng = jax.random.split(jax.random.PRNGKey(2), 2)
    q = jax.random.normal(rng[0], (8, 2, 128, 32))
    bias = jax.random.normal(rng[1], (2, 128, 128))

    def loss(q, bias):
        out = flash_kernels.flash_attention(q, q, q, bias, None, None, False, interpret=True)
        return jnp.sum(out**2)

    plain = jax.grad(loss, (0, 1))(q, bias)
    rematerialized = jax.grad(jax.checkpoint(loss), (0, 1))(q, bias)
    for a, b in zip(plain, rematerialized):
        np.testing.assert_array_equal(a, b)
