"""The decoder-only Transformers of the paper's Table 2: the causal LM and the prefix LM.

One module serves both: the prefix LM is the LM with a fully visible mask over the prefix, given
per position by `decoder_causal_attention` (1 on the prefix, as seqio's PrefixLM feature converter
makes it). Parameter tree (T5X names): `token_embedder/embedding`, `decoder/layers_{i}/
{pre_self_attention_layer_norm, self_attention, pre_mlp_layer_norm, mlp}`, `decoder/relpos_bias`,
`decoder/decoder_norm`, `decoder/logits_dense` (untied).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.nn import layers, masks, stacks
from t2t.nn.config import TransformerConfig
from t2t.nn.encoder_decoder import check_tokens


class DecoderOnly(nnx.Module):
    """A causal (or prefix) language model over inputs + targets.

    Shapes: B batch, T length, P prompt length, S max decode length, V vocab, N heads, H d_kv.
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if not config.is_decoder_only:
            raise ValueError(
                f"DecoderOnly needs architecture 'decoder_only' or 'prefix_lm', got "
                f"{config.architecture!r}; use EncoderDecoder (or t2t.nn.build) instead."
            )
        self.config = config
        rngs = layers.param_keys(rngs)
        self.token_embedder = layers.Embed(config, rngs=rngs)
        self.decoder = stacks.Decoder(config, cross_attention=False, rngs=rngs)

    def _visibility(self, decoder_segment_ids, decoder_causal_attention) -> masks.Visibility:
        """Causal, widened to the fully visible prefix of a prefix LM, within packed segments."""
        return masks.Visibility(
            causal=True,
            prefix=None if decoder_causal_attention is None else decoder_causal_attention > 0,
            query_segments=decoder_segment_ids,
            key_segments=decoder_segment_ids,
        )

    def __call__(
        self,
        decoder_input_tokens: jax.Array,
        decoder_segment_ids: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        decoder_causal_attention: jax.Array | None = None,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Teacher-forced logits.

        Args:
          decoder_input_tokens: [B, T] int, the sequence shifted right (0 starts each segment).
          decoder_segment_ids: [B, T] packing segment ids, or None.
          decoder_positions: [B, T]; accepted for the seqio contract, not needed.
          decoder_causal_attention: [B, T], 1 on the fully visible prefix (prefix LM), or None
            for a plain causal LM.
          rngs: `nnx.Rngs(dropout=key)` to train with dropout; None is deterministic.

        Returns:
          logits [B, T, V] float32.
        """
        del decoder_positions
        check_tokens("decoder_input_tokens", decoder_input_tokens)
        visibility = self._visibility(decoder_segment_ids, decoder_causal_attention)
        x = self.token_embedder(decoder_input_tokens)
        return self.decoder(x, visibility, embedder=self.token_embedder, rngs=rngs)

    def init_cache(
        self,
        decoder_input_tokens: jax.Array,
        max_decode_length: int,
        *,
        prompt_lengths: jax.Array | None = None,
        decoder_causal_attention: jax.Array | None = None,
    ) -> dict:
        """A decoding cache prefilled with a prompt in one parallel pass.

        The prompt is given as decoder inputs (already shifted right), e.g. `[0, x1, ..., x_{P-1}]`
        for a prompt `x1..xP`; the next `decode_step` then takes `x_P` and returns the first
        generated token's logits. An empty prompt ([B, 0]) gives an empty cache at index 0.

        Args:
          decoder_input_tokens: [B, P] int prompt, padded at the end of each row.
          max_decode_length: S >= P, the most positions the cache holds.
          prompt_lengths: [B] int, the real prompt length per row (default P for every row).
            Each row continues at its own length; its padded positions are overwritten.
          decoder_causal_attention: [B, P], 1 on the fully visible prefix (prefix LM).

        Returns:
          The cache: `index` [B] int32 (= prompt_lengths) and per layer `layers_{i}` with
          `self_key`/`self_value` [B, N, S, H].
        """
        batch, prompt_length = decoder_input_tokens.shape
        if prompt_length > max_decode_length:
            raise ValueError(
                f"The prompt ({prompt_length} positions) does not fit max_decode_length="
                f"{max_decode_length}; raise max_decode_length."
            )
        c = self.config
        cache = self.decoder.empty_cache(
            batch, max_decode_length, c.num_heads, c.d_kv, c.compute_dtype
        )
        if prompt_lengths is None:
            prompt_lengths = jnp.full((batch,), prompt_length, jnp.int32)
        if prompt_length:
            visibility = self._visibility(None, decoder_causal_attention)
            x = self.token_embedder(decoder_input_tokens)
            _, kvs = self.decoder.run_layers(x, visibility, None, None, None, None, return_kv=True)
            for i, (k, v) in enumerate(kvs):
                layer = cache[f"layers_{i}"]
                layer["self_key"] = _write_prefix(layer["self_key"], k)
                layer["self_value"] = _write_prefix(layer["self_value"], v)
        cache["index"] = jnp.asarray(prompt_lengths, jnp.int32)
        return cache

    def prepare_for_steps(self) -> None:
        """Makes `decode_step` multiply kernel first; see `EncoderDecoder.prepare_for_steps`.
        Call it after `init_cache`, whose prompt pass keeps the usual form."""
        self.decoder.prepare_for_steps(self.token_embedder)

    def decode_step(self, decoder_input_tokens: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        """One token per row at the cache's index; deterministic.

        Args:
          decoder_input_tokens: [B, 1] int.
          cache: from `init_cache` or a previous step.

        Returns:
          logits [B, V] float32 for the next token, and the updated cache.
        """
        x = self.token_embedder(decoder_input_tokens)  # [B, 1, D]
        return self.decoder.step(x, cache, embedder=self.token_embedder)


def _write_prefix(cache: jax.Array, new: jax.Array) -> jax.Array:
    """[B, N, S, H] cache, [B, N, P, H] prompt keys/values -> cache with positions [0, P) set."""
    return jax.lax.dynamic_update_slice_in_dim(cache, new.astype(cache.dtype), 0, axis=2)
