"""The prediction engine: a model wrapper's decoding, scoring and rank classification over any
number of model-feature examples in fixed-size batches, compiled once per shape; one model or an
ensemble (a tuple of parameter sets, logits averaged before the softmax)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t2t import decoding, models
from t2t.data import batches

Example = Mapping[str, np.ndarray]
Params = nnx.State | Sequence[nnx.State]
DEFAULT_MAX_DECODE_LENGTH = 128


class Predictor:
    """Prediction and scoring over iterables of model-feature examples, compiled once.

    Example:
      beam = decoding.DecodingConfig(method="beam", beam_size=4, alpha=0.6)
      predictor = Predictor(model, beam, batch_size=16)
      tokens, scores = predictor.predict(params, examples)   # a list of [T] arrays; beam scores
      log_likelihoods = predictor.score(params, examples)    # a list of floats
    """

    def __init__(
        self,
        model: models.BaseModel,
        config: decoding.DecodingConfig | None = None,
        *,
        batch_size: int = 32,
        partitioner: Any = None,
        **overrides,
    ):
        """
        Args:
          model: the model wrapper (`t2t.models`).
          config: how to decode (`t2t.decoding.DecodingConfig`; default: `DecodingConfig()`).
            Its `max_decode_length` None decodes the examples' targets
            length; its `seed` seeds sampling.
          batch_size: rows per call (the global batch with a partitioner).
          partitioner: a `t2t.partitioning.Partitioner` whose shards the parameters live in;
            None runs on the default device (or wherever the parameters are).
          **overrides: `DecodingConfig` fields replacing the config's.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}.")
        config = decoding.DecodingConfig.of(config, **overrides)
        self.config = config
        self.model = model
        self.batch_size = batch_size
        self.method = config.method
        self.partitioner = partitioner
        self._num_shards = 1
        if partitioner is not None:
            self._shard_index, self._num_shards = partitioner.data_shard()
            if batch_size % self._num_shards:
                raise ValueError(
                    f"batch_size {batch_size} must be divisible by the {self._num_shards} data "
                    "shards (hosts) of the partitioner."
                )
        self._rng = jax.random.PRNGKey(config.seed)
        self.max_decode_length = config.max_decode_length
        self._predict, self._score, self._rank = _jitted(model, config, partitioner)

    def predict(
        self, params: Params, examples: Iterable[Example], *, max_decode_length: int | None = None
    ) -> tuple[list[np.ndarray], list[float] | None]:
        """Decodes every example.

        Args:
          params: the parameters, or a sequence of parameter sets of the same network to decode
            as an ensemble.
          examples: model-feature dicts of single examples, all of the same shapes.
          max_decode_length: overrides the predictor's own for this call.

        Returns:
          The output tokens of each example ([T] int32, EOS-terminated, zero-padded) and, for
          beam search, each one's length-penalized log-probability (else None).
        """
        params = _as_params(params)
        length = max_decode_length or self.max_decode_length
        tokens, scores = [], []
        for index, (batch, size) in enumerate(self._batches(examples)):
            rng = jax.random.fold_in(self._rng, index)
            with self._context():
                out_tokens, out_scores = self._predict(params, batch, rng, length)
            tokens.extend(np.asarray(out_tokens)[:size])
            if out_scores is not None:
                scores.extend(np.asarray(out_scores)[:size].tolist())
        return tokens, (scores if self.method == "beam" else None)

    def score(self, params: Params, examples: Iterable[Example]) -> list[float]:
        """The log-likelihood of each example's targets (`score_batch`), in order; for an
        ensemble, the mean of its members' log-likelihoods."""
        params = _as_params(params)
        scores = []
        for batch, size in self._batches(examples):
            with self._context():
                scores.extend(np.asarray(self._score(params, batch))[:size].tolist())
        return scores

    def rank(
        self, params: Params, examples: Iterable[Example], candidates: np.ndarray
    ) -> tuple[list[int], list[list[float]]]:
        """Rank classification: for each example, the candidate target it finds most likely.

        Args:
          params: the parameters, or a sequence of them (an ensemble: candidates are ranked by
            the mean of the members' log-likelihoods).
          examples: model-feature dicts of single examples (their inputs are read).
          candidates: [C, T] int32, each an EOS-terminated, zero-padded target.

        Returns:
          The best candidate's index per example, and every candidate's log-likelihood.
        """
        params = _as_params(params)
        candidates = jnp.asarray(candidates, jnp.int32)
        best, scores = [], []
        for batch, size in self._batches(examples):
            with self._context():
                values = np.asarray(self._rank(params, batch, candidates))[:size]
            best.extend(int(i) for i in values.argmax(axis=1))
            scores.extend(values.tolist())
        return best, scores

    def _context(self):
        return contextlib.nullcontext() if self.partitioner is None else self.partitioner.context()

    def _batches(self, examples: Iterable[Example]) -> Iterator[tuple[Any, int]]:
        """Fixed-size batches (the last one padded with copies of its last row, see
        `t2t.data.batches`) and their real row counts."""
        rows: list[Example] = []
        for example in examples:
            rows.append(example)
            if len(rows) == self.batch_size:
                yield self._place(batches.stack_rows(rows, self.batch_size)), len(rows)
                rows = []
        if rows:
            yield self._place(batches.stack_rows(rows, self.batch_size)), len(rows)

    def _place(self, batch: dict[str, np.ndarray]) -> Any:
        if self.partitioner is None:
            return batch
        per_host = self.batch_size // self._num_shards
        start = self._shard_index * per_host
        local = {name: value[start : start + per_host] for name, value in batch.items()}
        return self.partitioner.make_global_batch(local)


def _as_params(params: Params) -> Params:
    if isinstance(params, nnx.State):
        return params
    params = tuple(params)
    if not params or not all(isinstance(p, nnx.State) for p in params):
        raise TypeError(
            "Expected an nnx.State of parameters or a non-empty sequence of them (an ensemble), "
            f"got {[type(p).__name__ for p in params] or 'an empty sequence'}."
        )
    return params


def _jitted(model: models.BaseModel, config: decoding.DecodingConfig, partitioner: Any):
    """The predictor's three jitted calls: decode, score, rank (an ensemble's: members' mean)."""
    method = config.method

    def predict(params, batch, rng, max_decode_length):
        extra = {"rng": rng} if method == "sample" else {}
        tokens, aux = model.predict_batch_with_aux(
            params, batch, config, max_decode_length=max_decode_length, **extra
        )
        return tokens, aux.get("scores")

    def score(params, batch):  # an ensemble's score: the mean of its members'
        if isinstance(params, nnx.State):
            return model.score_batch(params, batch)
        return jnp.mean(jnp.stack([model.score_batch(p, batch) for p in params]), axis=0)

    def rank(params, batch, candidates):  # [B, C] log-likelihoods (members' mean)
        members = [params] if isinstance(params, nnx.State) else list(params)
        scores = [model.rank_classification(p, batch, candidates)[1] for p in members]
        return jnp.mean(jnp.stack(scores), axis=0)

    replicated = {} if partitioner is None else {"out_shardings": partitioner.replicated}
    return (
        jax.jit(predict, static_argnums=3, **replicated),
        jax.jit(score, **replicated),
        jax.jit(rank, **replicated),
    )
