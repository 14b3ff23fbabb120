"""Cached decoding equals decoding that recomputes the whole prefix at every step.

The uncached `tokens_to_logits` below keeps the tokens so far in its "cache" (a [B, S] buffer
plus the index, batch-first like any cache) and runs the full teacher-forced network each step,
so it shares nothing with the network's KV cache.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t import decoding, models
from t2t import nn as t2t_nn

DECODE_LENGTH = 12


def _uncached_step(full_logits):
    """tokens_to_logits from `full_logits(token_buffer [B, S]) -> [B, S, V]`."""

    def tokens_to_logits(tokens, cache):
        rows = jnp.arange(tokens.shape[0])
        buffer = cache["tokens"].at[rows, cache["index"]].set(tokens[:, 0])
        logits = full_logits(buffer, cache)[rows, cache["index"]]  # [B, V]
        return logits, {**cache, "tokens": buffer, "index": cache["index"] + 1}

    return tokens_to_logits


def _encoder_decoder_uncached(model, params, inputs):
    module = model.module(params)
    batch_size = inputs.shape[0]
    cache = {
        "tokens": jnp.zeros((batch_size, DECODE_LENGTH), jnp.int32),
        "index": jnp.zeros((batch_size,), jnp.int32),
        "encoded": module.encode(inputs),
        "inputs": inputs,
    }
    fn = _uncached_step(lambda buffer, c: module.decode(c["encoded"], c["inputs"], buffer))
    return fn, cache


@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_encoder_decoder_cached_equals_uncached(hf_t5, padded_inputs, method):
    _, model, params = hf_t5
    inputs = jnp.asarray(padded_inputs(6, 10, seed=3))
    kwargs = dict(max_decode_length=DECODE_LENGTH)
    if method == "beam":
        kwargs.update(beam_size=3, alpha=0.6)

    @jax.jit
    def both(params):
        cached = model.predict_batch_with_aux(
            params, {"encoder_input_tokens": inputs}, method=method, **kwargs
        )
        fn, cache = _encoder_decoder_uncached(model, params, inputs)
        if method == "greedy":
            return cached[0], decoding.greedy(fn, cache, **kwargs)
        return cached[1]["beams"], decoding.beam_search(fn, cache, **kwargs)[0]

    cached, uncached = both(params)
    np.testing.assert_array_equal(cached, uncached)
    assert len(np.unique(np.asarray(cached))) > 5  # Not a degenerate repeated token.


def _redraw(params, seed):
    """Fan-in scaled normal weights (random init decodes a single repeated token)."""
    leaves, treedef = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    new = [
        jax.random.normal(k, x.shape) * (x.shape[0] ** -0.5 if x.ndim == 2 else 1.0) * 2.0
        if x.ndim == 2 else x
        for k, x in zip(keys, leaves)
    ]
    return jax.tree_util.tree_unflatten(treedef, new)


@pytest.fixture(scope="module", params=["decoder_only", "prefix_lm"])
def decoder_only(request):
    config = t2t_nn.get_preset(
        "tiny", architecture=request.param, num_encoder_layers=0, vocab_size=64, d_model=32,
        d_ff=64, d_kv=8, num_heads=4, num_decoder_layers=2,
    )
    model = models.DecoderOnlyModel(config)
    return model, _redraw(model.init_params(jax.random.PRNGKey(0)), seed=1)


def _prompt_batch(prompt_lengths, width):
    """seqio PrefixLM-style inference features: [0, x_1..x_P, 0...] and P + 1 visible."""
    rng = np.random.default_rng(0)
    tokens = np.zeros((len(prompt_lengths), width), np.int32)
    causal = np.zeros_like(tokens)
    for row, length in enumerate(prompt_lengths):
        tokens[row, 1 : length + 1] = rng.integers(2, 64, length)
        causal[row, : length + 1] = 1
    return {"decoder_input_tokens": jnp.asarray(tokens),
            "decoder_causal_attention": jnp.asarray(causal)}


def test_decoder_only_prefilled_cache_equals_uncached(decoder_only):
    model, params = decoder_only
    batch = _prompt_batch([3, 7, 1, 5], width=8)
    lengths = jnp.array([3, 7, 1, 5])
    width = 8 + DECODE_LENGTH

    def full_logits(buffer, cache):
        causal = None
        if model.is_prefix_lm:
            causal = (jnp.arange(width)[None] <= cache["prompt_lengths"][:, None]).astype(jnp.int32)
        return model.module(params)(buffer, decoder_causal_attention=causal)

    @jax.jit
    def both(params):
        cached = model.predict_batch(params, batch, max_decode_length=DECODE_LENGTH)
        buffer = jnp.pad(batch["decoder_input_tokens"], ((0, 0), (0, DECODE_LENGTH)))
        cache = {"tokens": buffer, "index": lengths, "prompt_lengths": lengths}
        start = jnp.take_along_axis(buffer, lengths[:, None], axis=1)[:, 0]
        uncached = decoding.greedy(
            _uncached_step(full_logits), cache, max_decode_length=DECODE_LENGTH,
            start_tokens=start,
        )
        return cached, uncached

    cached, uncached = both(params)
    np.testing.assert_array_equal(cached, uncached)
    assert len(np.unique(np.asarray(cached))) > 5
