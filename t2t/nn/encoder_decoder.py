"""The encoder-decoder Transformer of T5 (and the paper's shared-parameter variant).

Parameter tree (T5X names): `token_embedder/embedding`, `encoder/...`, `decoder/...`.

NOTE (architecture `encoder_decoder_shared`, paper Table 2 "Enc-dec, shared"): decoder layer i
reuses encoder layer i's self-attention, MLP, pre-attention norm and pre-MLP norm (the decoder
applies them with a causal mask). The decoder keeps its own cross-attention
(`encoder_decoder_attention`), its `pre_cross_attention_layer_norm`, its final `decoder_norm`, its
causal relative position table and, when untied, `logits_dense`. Shared weights exist once, under
`encoder/layers_{i}`, so the parameter count reflects the sharing.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.decoding import SHARED
from t2t.nn import layers, masks, stacks
from t2t.nn.config import TransformerConfig


class EncoderDecoder(nnx.Module):
    """T5: `token_embedder`, `encoder`, `decoder`.

    Shapes: B batch, L input length, T target length, D d_model, V vocab, N heads, H d_kv,
    S max decode length. Token id 0 is padding (and the decoder start token).
    """

    def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs):
        if config.is_decoder_only:
            raise ValueError(
                f"EncoderDecoder needs an encoder-decoder architecture, got "
                f"{config.architecture!r}; use DecoderOnly (or t2t.nn.build) instead."
            )
        self.config = config
        rngs = layers.param_keys(rngs)
        self.token_embedder = layers.Embed(config, rngs=rngs)
        self.encoder = stacks.Encoder(config, rngs=rngs)
        self.decoder = stacks.Decoder(config, cross_attention=True, rngs=rngs)
        self.prompt_length = config.prompt_length
        if self.prompt_length:
            self.prompt = layers.Prompt(config, rngs=rngs)

    def encoder_keys(self, encoder_input_tokens: jax.Array) -> jax.Array:
        """The tokens the encoder output stands for, for attention masks: the inputs [B, L],
        after P non-padding placeholders (1) for a soft prompt: [B, P + L]."""
        if not self.prompt_length:
            return encoder_input_tokens
        rows = encoder_input_tokens.shape[0]
        placeholders = jnp.ones((rows, self.prompt_length), encoder_input_tokens.dtype)
        return jnp.concatenate([placeholders, encoder_input_tokens], axis=1)

    def _shared_layers(self):
        if self.config.architecture == "encoder_decoder_shared":
            return self.encoder.layer_modules()
        return None

    def encode(
        self,
        encoder_input_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        encoder_positions: jax.Array | None = None,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Encodes the inputs.

        Args:
          encoder_input_tokens: [B, L] int, 0 = padding.
          encoder_segment_ids: [B, L] packing segment ids, or None (unpacked).
          encoder_positions: [B, L] positions within segments; accepted for the seqio feature
            contract, not needed (relative positions only, see `t2t.nn.stacks`).
          rngs: `nnx.Rngs(dropout=key)` to train with dropout; None is deterministic.

        Returns:
          [B, L, D] in the compute dtype ([B, P + L, D] with a soft prompt of P vectors).
        """
        del encoder_positions
        check_tokens("encoder_input_tokens", encoder_input_tokens)
        x = self.token_embedder(encoder_input_tokens)
        if self.prompt_length:
            _refuse_packed_prompt(encoder_segment_ids)
            x = self.prompt.prepend(x)  # [B, P + L, D]
        valid = self.encoder_keys(encoder_input_tokens) > 0  # [B, L] (P + L with a prompt)
        visibility = masks.Visibility(
            query_valid=valid,
            key_valid=valid,
            query_segments=encoder_segment_ids,
            key_segments=encoder_segment_ids,
        )
        return self.encoder(x, visibility, rngs=rngs)

    def decode(
        self,
        encoded: jax.Array,
        encoder_input_tokens: jax.Array,
        decoder_input_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        decoder_segment_ids: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Teacher-forced decoding: logits for every target position.

        Args:
          encoded: [B, L, D] from `encode`.
          encoder_input_tokens: [B, L] int (for the cross-attention padding mask).
          decoder_input_tokens: [B, T] int, targets shifted right (0 starts each segment).
          encoder_segment_ids: [B, L] or None.
          decoder_segment_ids: [B, T] or None.
          decoder_positions: [B, T]; accepted for the seqio contract, not needed.
          rngs: dropout when given.

        Returns:
          logits [B, T, V] float32.
        """
        del decoder_positions
        check_tokens("decoder_input_tokens", decoder_input_tokens)
        _check_packing(encoder_segment_ids, decoder_segment_ids)
        # NOTE: no decoder padding mask: padding is at the end of each row (or a separate
        # segment when packed), so the causal mask already hides it from real positions.
        self_visibility = masks.Visibility(
            causal=True, query_segments=decoder_segment_ids, key_segments=decoder_segment_ids
        )
        cross_visibility = masks.Visibility(
            key_valid=self.encoder_keys(encoder_input_tokens) > 0,
            query_segments=decoder_segment_ids,
            key_segments=encoder_segment_ids,
        )
        x = self.token_embedder(decoder_input_tokens)
        return self.decoder(
            x,
            self_visibility,
            encoded,
            cross_visibility,
            embedder=self.token_embedder,
            shared_layers=self._shared_layers(),
            rngs=rngs,
        )

    def __call__(
        self,
        encoder_input_tokens: jax.Array,
        decoder_input_tokens: jax.Array,
        encoder_segment_ids: jax.Array | None = None,
        decoder_segment_ids: jax.Array | None = None,
        encoder_positions: jax.Array | None = None,
        decoder_positions: jax.Array | None = None,
        *,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """[B, L] inputs, [B, T] decoder inputs -> logits [B, T, V] float32."""
        _check_packing(encoder_segment_ids, decoder_segment_ids)
        encoded = self.encode(
            encoder_input_tokens, encoder_segment_ids, encoder_positions, rngs=rngs
        )
        return self.decode(
            encoded,
            encoder_input_tokens,
            decoder_input_tokens,
            encoder_segment_ids,
            decoder_segment_ids,
            decoder_positions,
            rngs=rngs,
        )

    def init_cache(
        self, encoded: jax.Array, encoder_input_tokens: jax.Array, max_decode_length: int
    ) -> dict:
        """The decoding cache, with cross-attention keys/values computed once.

        Args:
          encoded: [B, L, D] from `encode` (unpacked inputs).
          encoder_input_tokens: [B, L] int, for the padding mask.
          max_decode_length: S, the most positions `decode_step` will be called for.

        Returns:
          A dict pytree, every leaf batch-first: `index` [B] int32 (0), per layer `layers_{i}`:
          `self_key`/`self_value` [B, N, S, H] (zeros), and under `shared` (the per-input
          entries that beam search keeps at B rows, see `t2t.decoding`): `cross_key_valid`
          [B, L] bool (the encoder positions that are not padding) and per layer
          `layers_{i}`: `cross_key`/`cross_value` [B, N, L, H].
        """
        c = self.config
        cache = self.decoder.empty_cache(
            encoded.shape[0], max_decode_length, c.num_heads, c.d_kv, c.compute_dtype
        )
        per_input = {"cross_key_valid": self.encoder_keys(encoder_input_tokens) > 0}
        for i, layer in enumerate(self.decoder.unrolled_layers()):
            k, v = layer.encoder_decoder_attention.project_kv(encoded)
            per_input[f"layers_{i}"] = {"cross_key": k, "cross_value": v}
        cache[SHARED] = per_input
        return cache

    def prepare_for_steps(self) -> None:
        """Makes `decode_step` multiply kernel first (faster with few rows on CPU; see
        `layers.kernel_first_matmul`). Call inside the traced function, once, after
        `init_cache` (whose encoder and cross-attention products keep the usual form) and
        before the decoding loop: it copies the step kernels transposed. Logits are unchanged up
        to float rounding."""
        self.decoder.prepare_for_steps(self.token_embedder, self._shared_layers())

    def decode_step(self, decoder_input_tokens: jax.Array, cache: dict) -> tuple[jax.Array, dict]:
        """One token per row at the cache's index; deterministic.

        Args:
          decoder_input_tokens: [B, 1] int, the previous output (0 at the first step); or
            [B * K, 1] for K beams per input, with the cache's `shared` entries at B rows.
          cache: from `init_cache` or a previous step.

        Returns:
          logits [B, V] float32 for the next token, and the updated cache.
        """
        x = self.token_embedder(decoder_input_tokens)  # [B, 1, D]
        return self.decoder.step(
            x, cache, embedder=self.token_embedder, shared_layers=self._shared_layers()
        )


def _refuse_packed_prompt(encoder_segment_ids) -> None:
    if encoder_segment_ids is not None:
        raise ValueError(
            "A soft prompt (prompt_length > 0) is prepended to each row of inputs, so rows must "
            "hold one example each: train with pack=False (t2t.runs.DataOptions.pack = False; "
            "gin/finetuning/prompt_tuning.gin sets it)."
        )


def _check_packing(encoder_segment_ids, decoder_segment_ids) -> None:
    if (encoder_segment_ids is None) != (decoder_segment_ids is None):
        raise ValueError(
            "Packed inputs need segment ids for both encoder and decoder; got only one of "
            "encoder_segment_ids / decoder_segment_ids."
        )


def check_tokens(name: str, tokens: jax.Array) -> None:
    """Raises ValueError unless `tokens` is a [batch, length] integer array."""
    if tokens.ndim != 2 or not jnp.issubdtype(tokens.dtype, jnp.integer):
        raise ValueError(
            f"{name} must be a [batch, length] integer array, got shape {tokens.shape} and dtype "
            f"{tokens.dtype}."
        )
