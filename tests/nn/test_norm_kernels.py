"""`norm_impl="pallas"`: the residual add and T5's norm as one Pallas kernel each way (run here
in Pallas's interpreter) compute what XLA computes: the kernels against the formula, forward and
every gradient, at widths that are not powers of two and row counts that are not multiples of a
block; and whole networks (packed, one with scanned and rematerialized layers) in loss and the
gradient of every parameter."""

import importlib.util
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t.nn import norm_kernels

# The networks, batches and loss-and-gradients helper of the attention op's tests.
_spec = importlib.util.spec_from_file_location(
    "attention_op_cases", os.path.join(os.path.dirname(__file__), "test_attention_ops.py")
)
_cases = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_cases)
batch, config, loss_and_grads = _cases.batch, _cases.config, _cases.loss_and_grads


def norm(s, scale, dtype, epsilon=1e-6):
    s = s.astype(jnp.float32)
    y = s * jax.lax.rsqrt(jnp.mean(s * s, axis=-1, keepdims=True) + epsilon)
    return (y * scale.astype(jnp.float32)).astype(dtype)


def relative(a, b):
    a, b = jnp.asarray(a, jnp.float32), jnp.asarray(b, jnp.float32)
    return float(jnp.linalg.norm(a - b) / jnp.linalg.norm(a))


@pytest.mark.parametrize(
    "shape, dtype, tolerance",
    [
        ((3, 37, 768), jnp.float32, 1e-6),
        ((5, 11, 96), jnp.bfloat16, 1e-2),
        ((7, 40), jnp.float32, 1e-6),
    ],
)
def test_the_kernels_compute_the_add_the_norm_and_their_gradients(shape, dtype, tolerance):
    keys = jax.random.split(jax.random.PRNGKey(0), 5)
    x, delta = (jax.random.normal(k, shape, dtype) for k in keys[:2])
    scale = 1 + 0.1 * jax.random.normal(keys[2], shape[-1:], jnp.float32)
    w_s, w_y = (jax.random.normal(k, shape, jnp.float32) for k in keys[3:])

    def objective(s, y):  # both outputs reach the loss, as in a layer
        return jnp.sum(s.astype(jnp.float32) * w_s) + jnp.sum(y.astype(jnp.float32) * w_y)

    def reference(x, delta, scale):
        s = x if delta is None else x + delta
        return objective(s, norm(s, scale, dtype))

    def fused(x, delta, scale):
        fixed = (1e-6, jnp.dtype(dtype), True)
        if delta is None:
            return objective(*norm_kernels.rms_norm_residual(x, scale, *fixed))
        return objective(*norm_kernels.add_rms_norm(x, delta, scale, *fixed))

    for d in (delta, None):
        s, y = norm_kernels.add_rms_norm(x, delta, scale, 1e-6, jnp.dtype(dtype), True)
        if d is not None:
            assert s.dtype == x.dtype and y.dtype == jnp.dtype(dtype)
            np.testing.assert_array_equal(s, x + delta)
            assert relative(norm(x + delta, scale, dtype), y) < max(tolerance, 1e-6)
        argnums = (0, 1, 2) if d is not None else (0, 2)
        want = jax.grad(reference, argnums)(x, d, scale)
        got = jax.grad(fused, argnums)(x, d, scale)
        for a, b in zip(want, got):
            assert relative(a, b) < tolerance


# The decoder-only case also scans its layers with full remat (the kernels inside a loop whose
# forward pass is recomputed).
CASES = [
    ("encoder_decoder_shared", True, {}),
    ("decoder_only", True, {"scan_layers": True, "remat_policy": "full"}),
]


@pytest.mark.parametrize("architecture, packed, layout", CASES)
def test_a_network_with_pallas_norms_equals_xla_in_loss_and_every_gradient(
    architecture, packed, layout
):
    features = batch(architecture, packed)
    base = config(architecture, attention_impl="xla", **layout)
    want_loss, want = loss_and_grads(base, features)
    got_loss, got = loss_and_grads(base.replace(norm_impl="pallas"), features)
    assert got_loss == pytest.approx(want_loss, rel=1e-6)
    leaves = jax.tree_util.tree_leaves_with_path(want)
    assert len(leaves) == len(jax.tree.leaves(got))
    for (path, a), b in zip(leaves, jax.tree.leaves(got)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-5, err_msg=jax.tree_util.keystr(path))


def test_an_unknown_norm_implementation_is_refused():
    with pytest.raises(ValueError, match="norm_impl must be one of"):
        config("encoder_decoder", norm_impl="triton")
