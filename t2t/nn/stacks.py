"""The encoder and decoder stacks: embeddings dropout, layers, final norm, logits.

Each stack owns one relative position table and computes its bias [1, N, L, S] once per call,
for all of its layers; the mask travels beside it as a boolean `masks.Visibility`, and the two
meet only inside the attention op (`t2t.nn.attention_ops`): nothing of size [B, N, L, S] is made
or accumulated outside it. Token embedding lives in the model (it is shared by encoder, decoder
and tied logits); stacks receive embedded tokens.

NOTE: T5 has no absolute positions. Relative positions are computed from the index within the
row; inside a packed segment these differences equal the differences of the segment's own
positions, and pairs across segments are masked, so packing needs no positions here.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from t2t.decoding import SHARED
from t2t.nn import axes, blocks, layers, masks, stacking
from t2t.nn.config import TransformerConfig
from t2t.nn.relative_position import RelativePositionBias
from t2t.nn.sharding import constrain


def _build_layers(module: nnx.Module, config: TransformerConfig, make) -> None:
    """Sets `layers_{i}` (unrolled) or the one stacked module `layers` (scanned) on `module`."""
    count = module.num_layers
    if config.scan_layers:
        setattr(
            module, stacking.LAYERS_MODULE, stacking.stack_modules([make() for _ in range(count)])
        )
    else:
        for i in range(count):
            setattr(module, stacking.layer_name(i), make())


def _layer_modules(module: nnx.Module):
    """What `stacking.apply_layers` runs: the stacked module, or the list of layer modules."""
    if module.scanned:
        return getattr(module, stacking.LAYERS_MODULE)
    return [getattr(module, stacking.layer_name(i)) for i in range(module.num_layers)]


class Encoder(nnx.Module):
    """Bidirectional stack: `layers_{i}` (or the scanned `layers`), `relpos_bias`,
    `encoder_norm`."""

    def __init__(self, config: TransformerConfig, *, rngs: layers.Keys):
        self.num_layers = config.num_encoder_layers
        self.scanned = config.scan_layers
        self.unroll = config.unroll_layers
        self.remat_policy = config.remat_policy
        self.dropout_rate = config.dropout_rate
        self.relpos_bias = RelativePositionBias(config, bidirectional=True, rngs=rngs)
        _build_layers(self, config, lambda: blocks.EncoderLayer(config, rngs=rngs))
        self.encoder_norm = layers.RMSNorm(config, rngs=rngs)

    def layer_modules(self):
        """The stacked layers module (scanned) or the list of layers, for `apply_layers`."""
        return _layer_modules(self)

    def __call__(self, x: jax.Array, visibility: masks.Visibility, *, rngs=None) -> jax.Array:
        """[B, L, D] embedded inputs and what each position may see -> [B, L, D]."""
        length = x.shape[1]
        positions = jnp.arange(length)
        bias = self.relpos_bias(positions, positions)  # [1, N, L, L]
        x = layers.dropout(x, self.dropout_rate, rngs)

        def body(layer, _, x, layer_rngs):
            return layer(x, bias, visibility, rngs=layer_rngs), None

        x, _ = stacking.apply_layers(
            body,
            _layer_modules(self),
            x,
            rngs=rngs,
            remat_policy=self.remat_policy,
            num_layers=self.num_layers,
            unroll=self.unroll,
        )
        x = self.encoder_norm(x)
        return layers.dropout(x, self.dropout_rate, rngs)


def _require_unscanned(stack: nnx.Module, what: str) -> None:
    if stack.scanned:
        raise ValueError(
            f"A scanned stack (scan_layers=True) has no {what}: its layers are one stacked "
            "module. Decode with the unscanned layout: `t2t.nn.to_layout(params, "
            "config.replace(scan_layers=False))` (the `t2t.models` wrappers do this)."
        )


class Decoder(nnx.Module):
    """Causal stack: `layers_{i}`, `relpos_bias`, `decoder_norm`, and `logits_dense` (untied)."""

    def __init__(self, config: TransformerConfig, *, cross_attention: bool, rngs: layers.Keys):
        self.num_layers = config.num_decoder_layers
        self.scanned = config.scan_layers
        self.unroll = config.unroll_layers
        self.remat_policy = config.remat_policy
        self.dropout_rate = config.dropout_rate
        self.logits_via_embedding = config.logits_via_embedding
        self.d_model = config.d_model
        shares = config.architecture == "encoder_decoder_shared"
        self.relpos_bias = RelativePositionBias(config, bidirectional=False, rngs=rngs)
        _build_layers(
            self,
            config,
            lambda: blocks.DecoderLayer(
                config, cross_attention=cross_attention, shares_encoder_layer=shares, rngs=rngs
            ),
        )
        self.decoder_norm = layers.RMSNorm(config, rngs=rngs)
        if not self.logits_via_embedding:
            self.logits_dense = layers.Dense(
                config.d_model,
                config.vocab_size,
                names=(axes.EMBED, axes.VOCAB),
                config=config,
                init=layers.fan_in_init(),
                rngs=rngs,
                lora_rank=config.lora_rank_for("logits_dense"),
            )

    def unrolled_layers(self) -> list[blocks.DecoderLayer]:
        """The layer modules in order, for decoding steps (unscanned stacks only)."""
        _require_unscanned(self, "layers to decode one by one")
        return _layer_modules(self)

    def __call__(
        self,
        x: jax.Array,
        self_visibility: masks.Visibility,
        encoded: jax.Array | None = None,
        cross_visibility: masks.Visibility | None = None,
        *,
        embedder: layers.Embed,
        shared_layers: list[blocks.EncoderLayer] | None = None,
        rngs: nnx.Rngs | None = None,
    ) -> jax.Array:
        """Teacher-forced decoder over whole sequences.

        Args:
          x: [B, T, D] embedded decoder inputs.
          self_visibility: the causal (and packing, prefix) mask of self-attention.
          encoded: [B, L, D] encoder output, or None without cross-attention.
          cross_visibility: which encoder positions each target position may see.
          embedder: the token embedding (for tied logits).
          shared_layers: the encoder's layers to borrow from (shared encoder-decoder only),
            as `Encoder.layer_modules()` gives them.
          rngs: dropout when given.

        Returns:
          logits [B, T, V] float32.
        """
        x, _ = self.run_layers(x, self_visibility, encoded, cross_visibility, shared_layers, rngs)
        return self.logits(x, embedder, rngs)

    def run_layers(
        self,
        x,
        self_visibility,
        encoded,
        cross_visibility,
        shared_layers,
        rngs,
        *,
        return_kv: bool = False,
    ):
        """The layers over [B, T, D]; returns the output and, with `return_kv`, every layer's
        self-attention keys and values (else an empty list)."""
        length = x.shape[1]
        positions = jnp.arange(length)
        self_bias = self.relpos_bias(positions, positions)  # [1, N, T, T]
        x = layers.dropout(x, self.dropout_rate, rngs)

        def body(layer, shared, x, layer_rngs):
            x, kv = layer(
                x,
                self_bias,
                self_visibility,
                encoded,
                cross_visibility,
                shared=shared,
                rngs=layer_rngs,
            )
            return x, kv if return_kv else None

        x, kvs = stacking.apply_layers(
            body,
            _layer_modules(self),
            x,
            rngs=rngs,
            remat_policy=self.remat_policy,
            shared=shared_layers,
            num_layers=self.num_layers,
            unroll=self.unroll,
        )
        return x, kvs if return_kv else []

    def logits(self, x: jax.Array, embedder: layers.Embed, rngs=None) -> jax.Array:
        """Final norm, dropout and the output projection: [B, T, D] -> [B, T, V] float32."""
        x = self.decoder_norm(x)
        x = layers.dropout(x, self.dropout_rate, rngs)
        if self.logits_via_embedding:
            # NOTE: tied logits rescale the decoder output by d_model**-0.5 (T5 v1.0).
            return embedder.attend(x * jnp.asarray(self.d_model**-0.5, x.dtype))
        return constrain(self.logits_dense(x).astype(jnp.float32), axes.BLV)

    def step(
        self,
        x: jax.Array,
        cache: dict,
        *,
        embedder: layers.Embed,
        shared_layers: list[blocks.EncoderLayer] | None = None,
    ) -> tuple[jax.Array, dict]:
        """One decoding position for every row.

        Args:
          x: [R, 1, D] the embedded new tokens, R = B rows (or B * K for K beams per input).
          cache: `index` [R] and `layers_{i}` dicts of R rows; with cross-attention, `shared`
            holds `cross_key_valid` [B, L] and `layers_{i}` dicts of the encoded inputs' keys
            and values, B rows (see `init_cache` of the encoder-decoder).
          embedder: the token embedding (for tied logits).
          shared_layers: encoder layers to borrow from (shared encoder-decoder only).

        Returns:
          logits [B, V] float32, and the cache with the index advanced by one.
        """
        index = cache["index"]  # [B]
        max_length = cache["layers_0"]["self_key"].shape[2]
        key_positions = jnp.arange(max_length)
        # Bias for the new query row only: [B, N, 1, S] (each row at its own position).
        self_bias = self.relpos_bias(index[:, None], key_positions)
        visible = key_positions[None, :] <= index[:, None]  # [B, S]
        self_visibility = masks.Visibility(dense=visible[:, None, None, :])  # [B, 1, 1, S]
        per_input = cache.get(SHARED)
        cross_visibility = None
        if per_input is not None:
            cross_visibility = masks.Visibility(key_valid=per_input["cross_key_valid"])  # [B, L]
        new_cache = dict(cache)
        for i, layer in enumerate(self.unrolled_layers()):
            shared = None if shared_layers is None else shared_layers[i]
            cross_kv = None
            if per_input is not None:
                cross_kv = (
                    per_input[f"layers_{i}"]["cross_key"],
                    per_input[f"layers_{i}"]["cross_value"],
                )
            x, new_cache[f"layers_{i}"] = layer.step(
                x,
                cache[f"layers_{i}"],
                index,
                self_bias,
                self_visibility,
                cross_kv,
                cross_visibility,
                shared=shared,
            )
        new_cache["index"] = index + 1
        return self.logits(x, embedder)[:, 0], new_cache

    def prepare_for_steps(
        self,
        embedder: layers.Embed,
        shared_layers: list[blocks.EncoderLayer] | None = None,
    ) -> None:
        """Has `step` multiply kernel first from here on in this trace (`layers.Dense`): every
        layer's step kernels and the output projection (the tied embedding or `logits_dense`)."""
        for i, layer in enumerate(self.unrolled_layers()):
            layer.prepare_for_steps(None if shared_layers is None else shared_layers[i])
        layers.prepare_for_steps(embedder if self.logits_via_embedding else self.logits_dense)

    def empty_cache(self, batch_size: int, max_length: int, num_heads: int, d_kv: int, dtype):
        """Zero self-attention caches [B, N, S, H] for every layer and a zero index [B]."""
        shape = (batch_size, num_heads, max_length, d_kv)
        cache = {"index": jnp.zeros((batch_size,), jnp.int32)}
        for i in range(self.num_layers):
            cache[stacking.layer_name(i)] = {
                "self_key": constrain(jnp.zeros(shape, dtype), axes.BNLH),
                "self_value": constrain(jnp.zeros(shape, dtype), axes.BNLH),
            }
        return cache


_SELF_ATTENTION_CACHES = ("self_key", "self_value")


def resize_cache(cache, length: int):
    """The decoding cache with every self-attention key and value cache holding `length` positions.

    Growing pads zeros at the end: positions not written yet, which the causal mask hides until a
    step writes them. Shrinking drops positions at the end and is only correct while they are
    unwritten (decoding shrinks only the fresh cache, before its first step). The index, the
    per-input entries under `shared` and any other leaf pass unchanged, so this works on an
    ensemble's tuple of caches and on beam-expanded caches alike.

    Args:
      cache: a decoding cache (or a pytree of them) from `init_cache`, leaves `self_key` and
        `self_value` [R, N, S, H].
      length: the new S.

    Returns:
      The cache with those leaves [R, N, length, H].
    """
    if length < 1:
        raise ValueError(f"Expected a cache length >= 1, got {length}.")

    def resize(path, leaf):
        keys = [k.key for k in path if isinstance(k, jax.tree_util.DictKey)]
        if SHARED in keys or not keys or keys[-1] not in _SELF_ATTENTION_CACHES:
            return leaf
        current = leaf.shape[2]
        if length <= current:
            return leaf[:, :, :length]
        return jnp.pad(leaf, ((0, 0), (0, 0), (0, length - current), (0, 0)))

    return jax.tree_util.tree_map_with_path(resize, cache)
