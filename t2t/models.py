"""Model wrappers: a network together with its data contract.

The network (`t2t.nn`) maps token arrays to logits and knows nothing of batches. A model wrapper
owns everything between seqio batches and the network: which feature converter makes the
batches, the training loss (`loss_fn`), decoding (`predict_batch`), scoring of given targets
(`score_batch`) and rank classification. Every method is a pure function of `params` (an
`nnx.State` of the network's parameters) and arrays, so callers can `jax.jit`, shard and
differentiate them; the optimizer stays outside.

    model = EncoderDecoderModel(t2t.nn.get_preset("t5_small"))
    params = model.init_params(jax.random.PRNGKey(0))
    loss, metrics = jax.jit(model.loss_fn)(params, batch, dropout_rng)
    beam = t2t.decoding.DecodingConfig(method="beam", beam_size=4, alpha=0.6)
    tokens = jax.jit(functools.partial(model.predict_batch, config=beam))(params, batch)
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t2t import decoding, losses
from t2t import nn as t2t_nn

if TYPE_CHECKING:  # seqio is the data layer's; the network, loss and decoding run without it
    import seqio

Batch = Mapping[str, jax.Array]


def _require(batch: Batch, names: Sequence[str], what: str) -> None:
    missing = [name for name in names if name not in batch]
    if missing:
        raise ValueError(
            f"{what} needs batch features {list(names)}; missing {missing}, got {sorted(batch)}. "
            "Make batches with the model's feature_converter()."
        )


def sequence_log_likelihood(logits: jax.Array, targets: jax.Array, weights: jax.Array) -> jax.Array:
    """Sum of weight * log p(target): logits [B, T, V], targets and weights [B, T] -> [B]."""
    log_probs = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, T, V]
    token_log_probs = jnp.take_along_axis(log_probs, targets[..., None], axis=-1)[..., 0]
    return jnp.sum(token_log_probs * weights.astype(jnp.float32), axis=-1)


def encode_candidates(vocabulary: seqio.Vocabulary, labels: Sequence[str]) -> np.ndarray:
    """Tokenizes label strings for rank classification, each followed by EOS: -> [C, T] int32.

    Rows are padded with 0 to the longest label.
    """
    ids = [list(vocabulary.encode(label)) + [decoding.EOS_ID] for label in labels]
    out = np.zeros((len(ids), max(map(len, ids))), np.int32)
    for row, tokens in enumerate(ids):
        out[row, : len(tokens)] = tokens
    return out


def _shift_right(targets: jax.Array) -> jax.Array:
    """Decoder inputs from targets: [B, T] -> [B, T] with 0 first (unpacked rows only)."""
    return jnp.pad(targets[:, :-1], ((0, 0), (1, 0)))


class BaseModel(abc.ABC):
    """What both architectures share: parameters, loss and decoding dispatch.

    Attributes:
      config: the network's `TransformerConfig`.
      graphdef: the network's graph, built abstractly (no memory); `module(params)` merges it.
      z_loss: weight of the auxiliary z-loss (docs/spec.md section 6).
      loss_normalizing_factor: None (sum), a number, "num_real_target_tokens",
        "num_total_target_tokens" or "average_per_sequence" (T5X's per-sequence mean).
      label_smoothing: T5X's label smoothing of the targets (0: none; `t2t.losses`).
    """

    def __init__(
        self,
        config: t2t_nn.TransformerConfig,
        *,
        z_loss: float = 1e-4,
        loss_normalizing_factor: float | str | None = None,
        label_smoothing: float = 0.0,
    ):
        if not isinstance(config, t2t_nn.TransformerConfig):
            raise TypeError(f"Expected a TransformerConfig, got {type(config).__name__}.")
        self.config = config
        self.z_loss = z_loss
        self.loss_normalizing_factor = loss_normalizing_factor
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"Expected 0 <= label_smoothing < 1, got {label_smoothing!r}.")
        self.label_smoothing = label_smoothing
        abstract = nnx.eval_shape(lambda: t2t_nn.build(config, nnx.Rngs(params=0)))
        self.graphdef, self._abstract_params = nnx.split(abstract)
        self._decoding_graphdef = None  # built at the first decode of a scanned model

    def feature_converter(
        self,
        *,
        pack: bool = True,
        has_inputs: bool = True,
        for_inference: bool = False,
        count_trimmed: bool = False,
        trim: bool = True,
    ) -> seqio.FeatureConverter:
        """The seqio converter that makes this model's batches: its data contract, the one
        training, evaluation and inference all use.

        Args:
          pack: pack several examples per row (training); False pads each (prediction,
            scoring, evaluation).
          has_inputs: whether the task has `inputs` (False: a targets-only LM task).
          for_inference: batches to decode or score. Both decoder-only architectures then read
            prefix-LM features: `decoder_causal_attention` marks the prompt (inputs), which
            decoding needs (the plain LM ignores it as a mask), and the loss weights cover the
            targets only, so a score is log p(targets | inputs).
          count_trimmed: count the over-length examples trimmed (`t2t.data.features`).
          trim: cut over-length examples first (False where seqio already trimmed them).
        """
        from t2t.data import features

        architecture = self.config.architecture
        if for_inference and self.config.is_decoder_only:
            architecture = "prefix_lm"
        return features.feature_converter(
            architecture, has_inputs=has_inputs, pack=pack, count_trimmed=count_trimmed, trim=trim
        )

    def abstract_params(self) -> nnx.State:
        """The parameter tree with `jax.ShapeDtypeStruct` leaves (no memory used)."""
        return self._abstract_params

    def init_params(self, rng: jax.Array) -> nnx.State:
        """Randomly initialized parameters (unsharded; `t2t.partitioning` shards its own init)."""
        config = self.config
        return jax.jit(lambda key: nnx.split(t2t_nn.build(config, nnx.Rngs(params=key)))[1])(rng)

    def module(self, params: nnx.State) -> nnx.Module:
        """The network with `params` merged in (call inside the traced function)."""
        return nnx.merge(self.graphdef, params)

    def decoding_module(self, params: nnx.State) -> nnx.Module:
        """The network for cached decoding: `module(params)`, unscanned.

        NOTE: decoding steps run the layers one by one, each with its own cache entry, so a
        model trained with `scan_layers` decodes through the unscanned view of its parameters
        (`t2t.nn.to_layout`): the same function, with per-layer slices of the stacked arrays.
        """
        if not self.config.scan_layers:
            return self.module(params)
        unscanned = self.config.replace(scan_layers=False)
        if self._decoding_graphdef is None:
            abstract = nnx.eval_shape(lambda: t2t_nn.build(unscanned, nnx.Rngs(params=0)))
            self._decoding_graphdef = nnx.split(abstract)[0]
        return nnx.merge(self._decoding_graphdef, t2t_nn.to_layout(params, unscanned))

    # -- training ----------------------------------------------------------------------------

    @abc.abstractmethod
    def _logits(self, params: nnx.State, batch: Batch, rngs: nnx.Rngs | None) -> jax.Array:
        """[B, T, V] logits of the target positions (dropout when `rngs` is given)."""

    def loss_fn(
        self, params: nnx.State, batch: Batch, dropout_rng: jax.Array | None
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Cross-entropy with z-loss over the weighted target tokens.

        Args:
          params: the network parameters.
          batch: model features of `feature_converter()` (packed or not).
          dropout_rng: a PRNG key for dropout, or None for a deterministic pass.

        Returns:
          The scalar loss (normalized by `loss_normalizing_factor`) and aux values that add up
          over microbatches (`t2t.optim.accumulate_gradients`): those of
          `t2t.losses.compute_weighted_loss` (`cross_ent_sum`, `z_loss_sum`, `weight_sum`, and
          `loss_denominator` for batch-dependent factors) plus `num_correct_tokens`, the weight
          of the target tokens whose argmax is right. Token accuracy is
          `num_correct_tokens / weight_sum`.
        """
        _require(batch, ("decoder_target_tokens", "decoder_loss_weights"), "loss_fn")
        rngs = None if dropout_rng is None else nnx.Rngs(dropout=dropout_rng)
        logits = self._logits(params, batch, rngs)
        targets, weights = batch["decoder_target_tokens"], batch["decoder_loss_weights"]
        loss, aux = losses.compute_weighted_loss(
            logits,
            targets,
            weights,
            z_loss=self.z_loss,
            loss_normalizing_factor=self.loss_normalizing_factor,
            label_smoothing=self.label_smoothing,
            segment_ids=batch.get("decoder_segment_ids"),
        )
        correct = (jnp.argmax(logits, axis=-1) == targets).astype(jnp.float32)
        aux = dict(aux)
        aux["num_correct_tokens"] = jnp.sum(correct * weights.astype(jnp.float32))
        return loss, aux

    # -- scoring -----------------------------------------------------------------------------

    def score_batch(self, params: nnx.State, batch: Batch) -> jax.Array:
        """Log-likelihood of each row's weighted target tokens: -> [B] float32 (unpacked rows)."""
        _require(batch, ("decoder_target_tokens", "decoder_loss_weights"), "score_batch")
        logits = self._logits(params, batch, None)
        return sequence_log_likelihood(
            logits, batch["decoder_target_tokens"], batch["decoder_loss_weights"]
        )

    # -- decoding ----------------------------------------------------------------------------

    @abc.abstractmethod
    def decoding_setup(
        self, params: nnx.State, batch: Batch, max_decode_length: int, kernel_first: bool = False
    ) -> tuple[decoding.TokensToLogits, Any, jax.Array]:
        """(tokens_to_logits, initial cache, start tokens [B]) for `t2t.decoding`; with
        `kernel_first`, the steps multiply kernel first (`DecodingConfig.kernel_first_steps`)."""

    @abc.abstractmethod
    def _default_length(self, batch: Batch) -> int:
        """How many tokens to decode when the config does not say."""

    @abc.abstractmethod
    def _batch_size(self, batch: Batch) -> int:
        """The number of rows B of `batch`."""

    def _cache_offset(self, batch: Batch) -> int:
        """Self-attention cache positions before the first decoded one (a prefilled prompt)."""
        del batch
        return 0

    def predict_batch_with_aux(
        self,
        params: nnx.State | Sequence[nnx.State],
        batch: Batch,
        config: decoding.DecodingConfig | None = None,
        *,
        rng: jax.Array | None = None,
        **overrides,
    ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """Decodes a batch; see `predict_batch`. Beam search adds to aux `scores` [B] (the best
        beam's), `beams` [B, K, T] and `beam_scores` [B, K]."""
        config = decoding.DecodingConfig.of(config, **overrides)
        max_decode_length = config.max_decode_length or self._default_length(batch)
        rows = self._batch_size(batch) * (config.beam_size if config.method == "beam" else 1)
        platform = jax.default_backend()  # where this decode runs: the step's matmul order
        tokens_to_logits, cache, start = self._setup_maybe_ensemble(
            params, batch, max_decode_length, config.uses_kernel_first_steps(rows, platform)
        )
        offset = self._cache_offset(batch)

        def resize_cache(cache, steps: int):
            return t2t_nn.resize_cache(cache, offset + steps)

        loop = decoding.DecodeLoop(
            max_decode_length=max_decode_length,
            min_length=config.min_length,
            start_tokens=start,
            resize_cache=resize_cache,
            first_cache_length=config.first_cache_length,
        )
        if config.method == "greedy":
            return decoding.greedy(tokens_to_logits, cache, loop), {}
        if config.method == "sample":
            if rng is None:
                raise ValueError("method='sample' needs rng, a PRNG key.")
            tokens = decoding.sample(
                tokens_to_logits,
                cache,
                rng,
                loop,
                temperature=config.temperature,
                top_k=config.top_k,
                top_p=config.top_p,
            )
            return tokens, {}
        beams, scores = decoding.beam_search(
            tokens_to_logits,
            cache,
            loop,
            beam_size=config.beam_size,
            alpha=config.alpha,
            rule=config.beam_rule,
        )
        return beams[:, 0], {"scores": scores[:, 0], "beams": beams, "beam_scores": scores}

    def predict_batch(
        self,
        params: nnx.State | Sequence[nnx.State],
        batch: Batch,
        config: decoding.DecodingConfig | None = None,
        *,
        rng: jax.Array | None = None,
        **overrides,
    ) -> jax.Array:
        """Decodes a batch: -> [B, T] int32 output tokens (EOS-terminated, zeros after).

        Args:
          params: the network parameters, or a sequence of N parameter sets of this network to
            decode as an ensemble (logits averaged before the softmax, paper section 3.6).
          batch: model features; encoder-decoder uses `encoder_input_tokens`, decoder-only the
            prompt in `decoder_input_tokens` with `decoder_causal_attention` marking it.
          config: a `t2t.decoding.DecodingConfig` (method, beam size and rule, lengths,
            sampling; default: `DecodingConfig()`). Decoding longer than
            its `first_cache_length` runs in phases of a growing self-attention cache (see
            `t2t.decoding`); the tokens do not change.
          rng: a PRNG key; needed by `method="sample"` only.
          **overrides: fields of `DecodingConfig` replacing the config's (`method`,
            `beam_size`, `alpha`, `beam_rule`, `max_decode_length`, `min_length`,
            `temperature`, `top_k`, `top_p`, ...); another name is a ValueError naming them.
        """
        return self.predict_batch_with_aux(params, batch, config, rng=rng, **overrides)[0]

    def _setup_maybe_ensemble(self, params, batch, max_decode_length, kernel_first):
        if isinstance(params, nnx.State):
            return self.decoding_setup(params, batch, max_decode_length, kernel_first)
        members = [self.decoding_setup(p, batch, max_decode_length, kernel_first) for p in params]
        if not members:
            raise ValueError("Expected one parameter set or a non-empty sequence of them.")
        fn = decoding.ensemble_tokens_to_logits([m[0] for m in members])
        return fn, tuple(m[1] for m in members), members[0][2]

    # -- rank classification -----------------------------------------------------------------

    @abc.abstractmethod
    def rank_classification(
        self, params: nnx.State, batch: Batch, candidates: jax.Array
    ) -> tuple[jax.Array, jax.Array]:
        """Picks, for every row, the candidate target the model finds most likely.

        Args:
          params: the network parameters.
          batch: the inputs (as for `predict_batch`), B rows.
          candidates: [C, T] int32 candidate targets (label strings through
            `encode_candidates`: EOS-terminated, zero-padded).

        Returns:
          best [B] int32 candidate index, and scores [B, C] (log-likelihood of each candidate).
        """


class EncoderDecoderModel(BaseModel):
    """T5's encoder-decoder (and the paper's shared-parameter variant) with seqio's
    `EncDecFeatureConverter` batches."""

    def __init__(self, config: t2t_nn.TransformerConfig, **kwargs):
        if config.is_decoder_only:
            raise ValueError(
                f"EncoderDecoderModel needs an encoder-decoder config, got architecture "
                f"{config.architecture!r}; use DecoderOnlyModel."
            )
        super().__init__(config, **kwargs)

    def _logits(self, params, batch, rngs):
        _require(batch, ("encoder_input_tokens", "decoder_input_tokens"), "EncoderDecoderModel")
        return self.module(params)(
            batch["encoder_input_tokens"],
            batch["decoder_input_tokens"],
            batch.get("encoder_segment_ids"),
            batch.get("decoder_segment_ids"),
            batch.get("encoder_positions"),
            batch.get("decoder_positions"),
            rngs=rngs,
        )

    def _default_length(self, batch: Batch) -> int:
        if "decoder_target_tokens" not in batch:
            raise ValueError("Pass max_decode_length, or a batch with decoder_target_tokens.")
        return batch["decoder_target_tokens"].shape[1]

    def _batch_size(self, batch):
        _require(batch, ("encoder_input_tokens",), "predict_batch")
        return batch["encoder_input_tokens"].shape[0]

    def decoding_setup(self, params, batch, max_decode_length, kernel_first=False):
        _require(batch, ("encoder_input_tokens",), "predict_batch")
        module = self.decoding_module(params)
        inputs = batch["encoder_input_tokens"]
        cache = module.init_cache(module.encode(inputs), inputs, max_decode_length)
        if kernel_first:
            module.prepare_for_steps()
        start = jnp.full((inputs.shape[0],), decoding.PAD_ID, jnp.int32)
        return module.decode_step, cache, start

    def rank_classification(self, params, batch, candidates):
        _require(batch, ("encoder_input_tokens",), "rank_classification")
        module = self.module(params)
        inputs = batch["encoder_input_tokens"]  # [B, L]
        num_rows, num_candidates = inputs.shape[0], candidates.shape[0]
        # NOTE: encode once, then score every (row, candidate) pair: row-major [B * C].
        encoded = jnp.repeat(module.encode(inputs), num_candidates, axis=0)  # [B * C, L, D]
        targets = jnp.tile(jnp.asarray(candidates, jnp.int32), (num_rows, 1))  # [B * C, T]
        logits = module.decode(
            encoded, jnp.repeat(inputs, num_candidates, axis=0), _shift_right(targets)
        )
        scores = sequence_log_likelihood(logits, targets, targets > 0)
        scores = scores.reshape(num_rows, num_candidates)
        return jnp.argmax(scores, axis=1).astype(jnp.int32), scores


class DecoderOnlyModel(BaseModel):
    """The paper's decoder-only language model and prefix LM with seqio's
    `DecoderFeatureConverter` batches (`PrefixLMFeatureConverter` when tasks have inputs).

    The plain LM attends causally everywhere; the prefix LM attends fully over the inputs prefix
    marked by `decoder_causal_attention`. Decoding takes the prompt from `decoder_input_tokens`:
    the positions where `decoder_causal_attention` is 1 hold [0, x_1, ..., x_P] for inputs
    x_1..x_P, and the output is the continuation after x_P.
    """

    def __init__(self, config: t2t_nn.TransformerConfig, **kwargs):
        if not config.is_decoder_only:
            raise ValueError(
                f"DecoderOnlyModel needs architecture 'decoder_only' or 'prefix_lm', got "
                f"{config.architecture!r}; use EncoderDecoderModel."
            )
        super().__init__(config, **kwargs)

    @property
    def is_prefix_lm(self) -> bool:
        return self.config.architecture == "prefix_lm"

    def _causal_attention(self, batch: Batch) -> jax.Array | None:
        if not self.is_prefix_lm:
            return None
        _require(batch, ("decoder_causal_attention",), "The prefix LM")
        return batch["decoder_causal_attention"]

    def _logits(self, params, batch, rngs):
        _require(batch, ("decoder_input_tokens",), "DecoderOnlyModel")
        return self.module(params)(
            batch["decoder_input_tokens"],
            batch.get("decoder_segment_ids"),
            batch.get("decoder_positions"),
            self._causal_attention(batch),
            rngs=rngs,
        )

    def _default_length(self, batch: Batch) -> int:
        _require(batch, ("decoder_input_tokens",), "predict_batch")
        return batch["decoder_input_tokens"].shape[1]

    def _prompt_lengths(self, batch: Batch) -> jax.Array:
        """[B] P, the number of input tokens (decoder_causal_attention covers P + 1)."""
        _require(batch, ("decoder_input_tokens", "decoder_causal_attention"), "Prompting")
        return jnp.sum(batch["decoder_causal_attention"] > 0, axis=1).astype(jnp.int32) - 1

    def _cache_offset(self, batch: Batch) -> int:
        return batch["decoder_input_tokens"].shape[1]  # The prefill's width W.

    def _batch_size(self, batch):
        _require(batch, ("decoder_input_tokens",), "predict_batch")
        return batch["decoder_input_tokens"].shape[0]

    def decoding_setup(self, params, batch, max_decode_length, kernel_first=False):
        module = self.decoding_module(params)
        prompt = batch["decoder_input_tokens"]  # [B, W]
        lengths = self._prompt_lengths(batch)
        # NOTE: the prefill covers the whole row, x_P included, so the prefix's keys see x_P as
        # they did in training; decoding restarts at position P with x_P, rewriting its own
        # entry with the same values. Positions after P are hidden until overwritten.
        cache = module.init_cache(
            prompt,
            prompt.shape[1] + max_decode_length,
            prompt_lengths=lengths,
            decoder_causal_attention=self._causal_attention(batch),
        )
        if kernel_first:
            module.prepare_for_steps()
        start = jnp.take_along_axis(prompt, lengths[:, None], axis=1)[:, 0]
        return module.decode_step, cache, start

    def rank_classification(self, params, batch, candidates):
        num_rows, num_candidates = batch["decoder_input_tokens"].shape[0], candidates.shape[0]
        scored = candidate_rows(
            batch["decoder_input_tokens"], self._prompt_lengths(batch), candidates
        )
        scores = self.score_batch(params, scored).reshape(num_rows, num_candidates)
        return jnp.argmax(scores, axis=1).astype(jnp.int32), scores


def candidate_rows(prompt: jax.Array, lengths: jax.Array, candidates: jax.Array) -> Batch:
    """A decoder-only batch scoring every candidate after every prompt: B x C rows, row
    `b * C + c` holding prompt b followed by candidate c, weighted on the candidate only.

    Example: the prompt row [0, 5, 6, 0] (decoder inputs: 0, then the P = 2 prompt tokens 5 6,
    then padding to the width W = 4) and candidates [[7, 1, 0], [8, 9, 1]] (T = 3) give rows
    of width W + T = 7:

        decoder_target_tokens     [5, 6, 7, 1, 0, 0, 0]   [5, 6, 8, 9, 1, 0, 0]
        decoder_input_tokens      [0, 5, 6, 7, 1, 0, 0]   [0, 5, 6, 8, 9, 1, 0]
        decoder_loss_weights      [0, 0, 1, 1, 0, 0, 0]   [0, 0, 1, 1, 1, 0, 0]
        decoder_causal_attention  [1, 1, 1, 0, 0, 0, 0]   (the same for every candidate)

    Args:
      prompt: [B, W] decoder input tokens of the prompts (0 first, each prompt left-aligned).
      lengths: [B] prompt lengths P (decoder_causal_attention covers P + 1 positions).
      candidates: [C, T] EOS-terminated, zero-padded candidate targets.

    Returns:
      The four decoder-only features, each [B * C, W + T].
    """
    candidates = jnp.asarray(candidates, jnp.int32)
    num_rows, num_candidates = prompt.shape[0], candidates.shape[0]
    width = prompt.shape[1] + candidates.shape[1]
    positions = jnp.arange(width)  # [W + T]
    # Targets: x_1..x_P from the prompt, then the candidate, then padding.
    inputs = jnp.take_along_axis(
        prompt, jnp.clip(positions + 1, 0, prompt.shape[1] - 1)[None], axis=1
    )  # [B, W + T]
    offset = positions[None, :] - lengths[:, None]  # [B, W + T]: position in the candidate
    cand = candidates[:, jnp.clip(offset, 0, candidates.shape[1] - 1)]  # [C, B, W + T]
    cand = jnp.swapaxes(cand, 0, 1)  # [B, C, W + T]
    in_prompt = (positions[None, :] < lengths[:, None])[:, None, :]
    targets = jnp.where(in_prompt, inputs[:, None, :], jnp.where(offset[:, None] >= 0, cand, 0))
    targets = jnp.where(offset[:, None] < candidates.shape[1], targets, 0)
    weights = jnp.logical_and(~in_prompt, targets > 0)  # [B, C, W + T]
    targets = targets.reshape(num_rows * num_candidates, width)
    causal = jnp.repeat(
        (positions[None, :] <= lengths[:, None]).astype(jnp.int32), num_candidates, axis=0
    )
    return {
        "decoder_target_tokens": targets,
        "decoder_input_tokens": _shift_right(targets),
        "decoder_loss_weights": weights.reshape(num_rows * num_candidates, width),
        "decoder_causal_attention": causal,
    }


def model_for(config: t2t_nn.TransformerConfig, **kwargs) -> BaseModel:
    """The wrapper matching `config.architecture`."""
    if config.is_decoder_only:
        return DecoderOnlyModel(config, **kwargs)
    return EncoderDecoderModel(config, **kwargs)
