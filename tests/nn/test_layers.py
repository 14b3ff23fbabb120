"""Layers against direct numpy formulas: RMS norm, MLP activations, tied logits, dropout."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import t2t.nn as tn
from t2t.nn import layers
from t2t.nn.attention import MultiHeadAttention

CONFIG = tn.get_preset("tiny", vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_heads=2)


def test_rms_norm_formula_in_float32():
    norm = layers.RMSNorm(CONFIG.replace(dtype="bfloat16"), rngs=nnx.Rngs(0))
    norm.scale[...] = jnp.arange(1.0, 9.0)
    x = np.random.RandomState(0).randn(3, 8).astype(np.float32) * 5
    expected = x / np.sqrt(np.mean(x**2, -1, keepdims=True) + 1e-6) * np.arange(1.0, 9.0)
    out = norm(jnp.asarray(x))
    assert out.dtype == jnp.bfloat16
    np.testing.assert_allclose(np.asarray(out, np.float32), expected, rtol=1e-2)
    out32 = layers.RMSNorm(CONFIG, rngs=nnx.Rngs(0))(jnp.asarray(x))
    np.testing.assert_allclose(out32, expected / np.arange(1.0, 9.0), rtol=1e-6)


def test_gated_gelu_is_the_tanh_approximation():
    mlp = layers.Mlp(CONFIG.replace(mlp_activations=("gelu", "linear")), rngs=nnx.Rngs(0))
    x = np.random.RandomState(1).randn(2, 3, 8).astype(np.float32)
    wi_0, wi_1, wo = (np.asarray(m.kernel[...]) for m in (mlp.wi_0, mlp.wi_1, mlp.wo))
    h = x @ wi_0
    gelu = 0.5 * h * (1 + np.tanh(np.sqrt(2 / np.pi) * (h + 0.044715 * h**3)))
    np.testing.assert_allclose(mlp(jnp.asarray(x)), (gelu * (x @ wi_1)) @ wo, atol=1e-5)


@pytest.mark.parametrize(
    "activations", [("gelu", "linear"), ("relu", "linear"), ("silu", "linear")]
)
def test_gated_activations_backward_equals_autodiff(activations):
    """`layers.gated` keeps only its inputs for the backward pass; its gradients are autodiff's
    of the same formula, and it keeps fewer arrays (the activation is recomputed)."""
    rng = np.random.RandomState(3)
    a, b, g = (jnp.asarray(rng.randn(2, 5, 16).astype(np.float32)) for _ in range(3))
    first, second = (layers._ACTIVATIONS[name] for name in activations)

    def plain(a, b):
        return first(a) * second(b)

    got_value, got_vjp = jax.vjp(lambda a, b: layers.gated(a, b, *activations), a, b)
    want_value, want_vjp = jax.vjp(plain, a, b)
    np.testing.assert_array_equal(got_value, want_value)
    for got, want in zip(got_vjp(g), want_vjp(g), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    kept = [x for x in jax.tree.leaves(got_vjp) if getattr(x, "shape", ()) == a.shape]
    assert len(kept) == 2  # a and b
    assert len([x for x in jax.tree.leaves(want_vjp) if getattr(x, "shape", ()) == a.shape]) > 2


def test_relu_mlp():
    mlp = layers.Mlp(CONFIG.replace(mlp_activations=("relu",)), rngs=nnx.Rngs(0))
    x = np.random.RandomState(2).randn(2, 3, 8).astype(np.float32)
    wi, wo = np.asarray(mlp.wi.kernel[...]), np.asarray(mlp.wo.kernel[...])
    np.testing.assert_allclose(mlp(jnp.asarray(x)), np.maximum(x @ wi, 0) @ wo, atol=1e-5)


def test_embedding_attend_is_the_transposed_table():
    embed = layers.Embed(CONFIG, rngs=nnx.Rngs(0))
    table = np.asarray(embed.embedding[...])
    np.testing.assert_array_equal(embed(jnp.array([[3, 0]])), table[[[3, 0]]])
    x = np.random.RandomState(3).randn(1, 2, 8).astype(np.float32)
    logits = embed.attend(jnp.asarray(x))
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, x @ table.T, rtol=1e-5, atol=1e-5)


def test_initializer_scales():
    config = tn.get_preset("t5_small")
    keys = layers.ParamKeys(nnx.Rngs(0))
    attention = MultiHeadAttention(config, rngs=keys)
    std = {
        name: float(np.std(np.asarray(getattr(attention, name).kernel[...])))
        for name in ("query", "key", "out")
    }
    # NOTE: T5 folds 1/sqrt(d_kv) into the query init: std (d_model * d_kv)**-0.5.
    assert std["query"] == pytest.approx((512 * 64) ** -0.5, rel=0.05)
    assert std["key"] == pytest.approx(512**-0.5, rel=0.05)
    assert std["out"] == pytest.approx(512**-0.5, rel=0.05)
    embed = layers.Embed(config.replace(vocab_size=256), rngs=keys)
    assert float(np.std(np.asarray(embed.embedding[...]))) == pytest.approx(1.0, rel=0.05)


def test_dropout_rate_scaling_and_determinism():
    x = jnp.ones((200, 100))
    assert layers.dropout(x, 0.1, None) is x
    assert layers.dropout(x, 0.0, nnx.Rngs(dropout=0)) is x
    y = np.asarray(layers.dropout(x, 0.1, nnx.Rngs(dropout=0)))
    np.testing.assert_allclose(np.unique(y), [0.0, 1 / 0.9], rtol=1e-6)
    assert np.mean(y == 0) == pytest.approx(0.1, abs=0.01)
    again = np.asarray(layers.dropout(x, 0.1, nnx.Rngs(dropout=0)))
    np.testing.assert_array_equal(y, again)


def test_bfloat16_compute_keeps_float32_parameters_and_logits(make_model):
    model = make_model(CONFIG.replace(dtype="bfloat16"))
    dtypes = {x.dtype for x in jax.tree.leaves(nnx.state(model, nnx.Param))}
    assert dtypes == {jnp.dtype("float32")}
    graphdef, state = nnx.split(model)
    reference_graphdef, _ = nnx.split(nnx.eval_shape(lambda: tn.build(CONFIG, nnx.Rngs(0))))

    @jax.jit
    def forward(state):
        tokens, decoder_tokens = jnp.array([[4, 5, 6, 1]]), jnp.array([[0, 7, 8]])
        return (
            nnx.merge(graphdef, state)(tokens, decoder_tokens),
            nnx.merge(reference_graphdef, state)(tokens, decoder_tokens),
        )

    logits, reference = forward(state)
    assert logits.dtype == jnp.float32
    np.testing.assert_allclose(logits, reference, atol=0.05 * float(jnp.abs(reference).max()))
    assert not np.array_equal(logits, reference)  # it did compute in bfloat16


def test_hashed_bits_are_uniform_independent_and_keyed():
    shape = (4, 3, 64, 64)
    bits = np.asarray(layers.hashed_bits(jax.random.key(0), shape), np.uint64)
    np.testing.assert_array_equal(bits, layers.hashed_bits(jax.random.key(0), shape))
    # Top 4 bits: 16 equally likely buckets (49152 draws; 5 sigma is ~0.0054).
    frequencies = np.bincount((bits >> 28).ravel(), minlength=16) / bits.size
    np.testing.assert_allclose(frequencies, 1 / 16, atol=0.006)
    # Neighbours along every axis are uncorrelated.
    low_bit = (bits & 1).astype(float)
    for axis in range(4):
        a = np.take(low_bit, range(shape[axis] - 1), axis).ravel()
        b = np.take(low_bit, range(1, shape[axis]), axis).ravel()
        assert abs(np.corrcoef(a, b)[0, 1]) < 0.03
    other = np.asarray(layers.hashed_bits(jax.random.key(1), shape), np.uint64)
    assert np.mean(other == bits) < 1e-3
    assert abs(np.corrcoef((other & 1).ravel(), (bits & 1).ravel())[0, 1]) < 0.03


def _dot_outputs(fn, *args) -> list[str]:
    """The output shapes of the dots in `fn`'s compiled (optimized) HLO, e.g. 'f32[16,3]'."""
    hlo = jax.jit(fn).lower(*args).compile().as_text()
    return re.findall(r"= (f32\[[\d,]+\])\{[\d,]+\} dot\(", hlo)


def test_kernel_first_steps_give_the_same_products_with_the_kernel_on_the_left():
    """After `prepare_for_steps`, a Dense computes (kernel^T x^T)^T and tied logits (table
    x^T)^T: the same values, and the compiled dot keeps the kernel first ([out, rows])."""
    config = CONFIG.replace(d_ff=16)
    dense = layers.Dense(
        8, 16, names=("embed", "mlp"), config=config, init=layers.fan_in_init(), rngs=nnx.Rngs(0)
    )
    embed = layers.Embed(config, rngs=nnx.Rngs(1))
    x = jnp.asarray(np.random.RandomState(4).randn(3, 1, 8).astype(np.float32))

    def apply(module, method, prepare):
        graphdef, state = nnx.split(module)

        def fn(state, x):
            merged = nnx.merge(graphdef, state)
            if prepare:
                merged.prepare_for_steps()
            return getattr(merged, method)(x)

        return fn, state

    for module, method, out_features in ((dense, "__call__", 16), (embed, "attend", 32)):
        usual, state = apply(module, method, prepare=False)
        first, _ = apply(module, method, prepare=True)
        np.testing.assert_allclose(
            jax.jit(first)(state, x), jax.jit(usual)(state, x), rtol=1e-6, atol=1e-6
        )
        assert _dot_outputs(usual, state, x) == [f"f32[3,{out_features}]"]
        assert _dot_outputs(first, state, x) == [f"f32[{out_features},3]"]
