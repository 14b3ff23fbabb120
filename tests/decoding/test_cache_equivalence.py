"""Cached decoding equals decoding that recomputes the whole prefix at every step.

The uncached `tokens_to_logits` below keeps the tokens so far in its "cache" (a [B, S] buffer
plus the index, batch-first like any cache) and runs the full teacher-forced network each step,
so it shares nothing with the network's KV cache.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import decoding

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


# first_cache_length 3: the model decodes in phases of a growing cache (3, 6, 12 positions).
@pytest.mark.parametrize("first_cache_length", [64, 3])
@pytest.mark.parametrize("method", ["greedy", "beam"])
def test_encoder_decoder_cached_equals_uncached(hf_t5, padded_inputs, method, first_cache_length):
    _, model, params = hf_t5
    inputs = jnp.asarray(padded_inputs(6, 10, seed=3))
    kwargs = dict(max_decode_length=DECODE_LENGTH)
    if method == "beam":
        kwargs.update(beam_size=3, alpha=0.6)

    @jax.jit
    def both(params):
        cached = model.predict_batch_with_aux(
            params,
            {"encoder_input_tokens": inputs},
            method=method,
            first_cache_length=first_cache_length,
            **kwargs,
        )
        fn, cache = _encoder_decoder_uncached(model, params, inputs)
        if method == "greedy":
            return cached[0], decoding.greedy(fn, cache, **kwargs)
        return cached[1]["beams"], decoding.beam_search(fn, cache, **kwargs)[0]

    cached, uncached = both(params)
    np.testing.assert_array_equal(cached, uncached)
    assert len(np.unique(np.asarray(cached))) > 5  # Not a degenerate repeated token.
