"""Encoder and decoder layers: pre-norm residual sublayers, `x + Dropout(Sublayer(Norm(x)))`.

A decoder layer serves three architectures: the encoder-decoder (self-attention, cross-attention,
MLP), the decoder-only LM (no cross-attention), and the shared encoder-decoder, where the layer
owns only its cross-attention and borrows the self-attention, the MLP and their norms from the
encoder layer of the same index (passed in as `shared`).
"""

from __future__ import annotations

import jax
from flax import nnx

from t2t.nn import attention, axes, layers, masks
from t2t.nn.config import TransformerConfig
from t2t.nn.sharding import constrain

KV = tuple[jax.Array, jax.Array]


class EncoderLayer(nnx.Module):
    """Bidirectional self-attention then MLP, each a pre-norm residual branch."""

    def __init__(self, config: TransformerConfig, *, rngs: layers.Keys):
        self.dropout_rate = config.dropout_rate
        self.pre_attention_layer_norm = layers.RMSNorm(config, rngs=rngs)
        self.attention = attention.MultiHeadAttention(config, rngs=rngs)
        self.pre_mlp_layer_norm = layers.RMSNorm(config, rngs=rngs)
        self.mlp = layers.Mlp(config, rngs=rngs)

    def __call__(
        self,
        x: jax.Array,
        bias: jax.Array | None,
        visibility: masks.Visibility,
        *,
        rngs=None,
    ) -> jax.Array:
        """[B, L, D] -> [B, L, D]; `bias` [1, N, L, L] relative positions, `visibility` the mask."""
        x, y = self.pre_attention_layer_norm.residual(x)
        y = self.attention(y, y, bias, visibility, rngs=rngs)
        x, y = self.pre_mlp_layer_norm.residual(x, layers.dropout(y, self.dropout_rate, rngs))
        y = self.mlp(y, rngs=rngs)
        return constrain(x + layers.dropout(y, self.dropout_rate, rngs), axes.BLD)


class DecoderLayer(nnx.Module):
    """Causal self-attention, optional cross-attention over the encoder output, then MLP."""

    def __init__(
        self,
        config: TransformerConfig,
        *,
        cross_attention: bool,
        shares_encoder_layer: bool = False,
        rngs: layers.Keys,
    ):
        self.dropout_rate = config.dropout_rate
        self.has_cross_attention = cross_attention
        if not shares_encoder_layer:
            self.pre_self_attention_layer_norm = layers.RMSNorm(config, rngs=rngs)
            self.self_attention = attention.MultiHeadAttention(config, rngs=rngs)
        if cross_attention:
            self.pre_cross_attention_layer_norm = layers.RMSNorm(config, rngs=rngs)
            self.encoder_decoder_attention = attention.MultiHeadAttention(config, rngs=rngs)
        if not shares_encoder_layer:
            self.pre_mlp_layer_norm = layers.RMSNorm(config, rngs=rngs)
            self.mlp = layers.Mlp(config, rngs=rngs)

    def _borrowed(self, shared: EncoderLayer | None):
        """(self-attention norm, self-attention, MLP norm, MLP): own, or the shared layer's."""
        if shared is None:
            return (
                self.pre_self_attention_layer_norm,
                self.self_attention,
                self.pre_mlp_layer_norm,
                self.mlp,
            )
        return (
            shared.pre_attention_layer_norm,
            shared.attention,
            shared.pre_mlp_layer_norm,
            shared.mlp,
        )

    def __call__(
        self,
        x: jax.Array,
        self_bias: jax.Array | None,
        self_visibility: masks.Visibility,
        encoded: jax.Array | None = None,
        cross_visibility: masks.Visibility | None = None,
        *,
        shared: EncoderLayer | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> tuple[jax.Array, KV]:
        """The layer over a whole sequence.

        Args:
          x: [B, T, D].
          self_bias: [1, N, T, T] relative position bias.
          self_visibility: the causal (and packing, prefix) mask of self-attention.
          encoded: [B, L, D] encoder output (encoder-decoder only).
          cross_visibility: which encoder positions each target position may see.
          shared: the encoder layer to borrow from (shared encoder-decoder only).
          rngs: dropout when given.

        Returns:
          The new [B, T, D], and this layer's self-attention keys and values, each [B, N, T, H]
          (to fill a decoding cache; XLA drops them when unused).
        """
        norm, self_attention, mlp_norm, mlp = self._borrowed(shared)
        x, y = norm.residual(x)
        k, v = self_attention.project_kv(y)
        y = self_attention.attend(y, k, v, self_bias, self_visibility, rngs=rngs)
        delta = layers.dropout(y, self.dropout_rate, rngs)
        if self.has_cross_attention:
            x, y = self.pre_cross_attention_layer_norm.residual(x, delta)
            cross_kv = self.encoder_decoder_attention.project_kv(encoded)
            y = self.encoder_decoder_attention.attend(
                y, *cross_kv, None, cross_visibility, rngs=rngs
            )
            delta = layers.dropout(y, self.dropout_rate, rngs)
        x, y = mlp_norm.residual(x, delta)
        y = mlp(y, rngs=rngs)
        return constrain(x + layers.dropout(y, self.dropout_rate, rngs), axes.BLD), (k, v)

    def step(
        self,
        x: jax.Array,
        cache: dict[str, jax.Array],
        index: jax.Array,
        self_bias: jax.Array,
        self_visibility: masks.Visibility,
        cross_kv: KV | None = None,
        cross_visibility: masks.Visibility | None = None,
        *,
        shared: EncoderLayer | None = None,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """One decoding position, deterministic.

        Args:
          x: [R, 1, D], the new token's activations: R = B rows, or B * K for K beams per input
            (row r belongs to input r // K).
          cache: `self_key`, `self_value` [R, N, S, H].
          index: [R] int32, the position of the new token in each row.
          self_bias: [R, N, 1, S], the relative position bias of the new row.
          self_visibility: the cache positions each row may see ([R, 1, 1, S] `dense`).
          cross_kv: the encoded inputs' keys and values, each [B, N, L, H] (with cross-attention).
          cross_visibility: the encoder positions that are not padding ([B, L] `key_valid`).
          shared: the encoder layer to borrow from (shared encoder-decoder only).

        Returns:
          [R, 1, D] and the cache with the new key and value written at `index`.
        """
        norm, self_attention, mlp_norm, mlp = self._borrowed(shared)
        y = norm(x)
        k_new, v_new = self_attention.project_kv(y)  # [R, N, 1, H]
        cache = dict(cache)
        cache["self_key"] = attention.write_cache(cache["self_key"], k_new, index)
        cache["self_value"] = attention.write_cache(cache["self_value"], v_new, index)
        x = x + self_attention.attend(
            y, cache["self_key"], cache["self_value"], self_bias, self_visibility
        )
        if self.has_cross_attention:
            x = self._cross_attend_beams(x, cross_kv, cross_visibility)
        return x + mlp(mlp_norm(x)), cache

    def prepare_for_steps(self, shared: EncoderLayer | None = None) -> None:
        """Puts the kernels `step` multiplies by in kernel-first form (`layers.Dense`); the
        cross-attention keys and values, computed once before the steps, keep theirs."""
        _, self_attention, _, mlp = self._borrowed(shared)
        layers.prepare_for_steps(self_attention, mlp)
        if self.has_cross_attention:
            cross = self.encoder_decoder_attention
            layers.prepare_for_steps(cross.query, cross.out)

    def _cross_attend(self, x, cross_kv: KV, cross_visibility, rngs):
        y = self.pre_cross_attention_layer_norm(x)
        y = self.encoder_decoder_attention.attend(y, *cross_kv, None, cross_visibility, rngs=rngs)
        return x + layers.dropout(y, self.dropout_rate, rngs)

    def _cross_attend_beams(self, x: jax.Array, cross_kv: KV, cross_visibility) -> jax.Array:
        """Cross-attention of [B * K, 1, D] beam rows over their inputs' [B, N, L, H] keys.

        NOTE: the K beams of an input are attended as K query positions over one copy of its
        keys and values, so a beam search step reads them once per input, not once per beam.
        """
        rows, inputs = x.shape[0], cross_kv[0].shape[0]
        if rows % inputs:
            raise ValueError(
                f"Expected the decoding rows ({rows}) to be a multiple of the encoded inputs "
                f"({inputs}): K beams per input."
            )
        beams = x.reshape(inputs, rows // inputs, x.shape[-1])  # [B, K, D]
        return self._cross_attend(beams, cross_kv, cross_visibility, None).reshape(x.shape)
