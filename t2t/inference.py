"""Batched prediction and scoring of tasks, mixtures and files of examples; models or ensembles.

A `Predictor` runs a model wrapper's `predict_batch` (greedy, beam or sampling) and `score_batch`
over any number of examples in fixed-size batches, so each function compiles once; the last
batch is padded with copies of its last row and the copies' outputs dropped. Parameters are an
argument of every call, so evaluation reuses one `Predictor` for every checkpoint, and a tuple of
parameter sets decodes an ensemble whose logits are averaged before the softmax (paper section
3.6, `t2t.decoding.ensemble_tokens_to_logits`).

Examples reach the model through the same unpacked seqio feature converter evaluation uses
(`model.feature_converter`): task examples as their task makes them, file examples (JSONL
`{"inputs": ..., "targets"?: ...}` or TSV `inputs[<TAB>targets]`) tokenized with the checkpoint's
vocabulary and followed by EOS, as seqio tasks do. Results are written as JSONL records:

    {"inputs": "...", "prediction": "...", "target": "..."}      (predict; target when given)
    {"inputs": "...", "target": "...", "score": -3.21}           (score: log-likelihood)

Multi-host: with a `Partitioner`, every host walks the same examples, feeds its slice of each
global batch, and receives the whole batch's outputs (replicated), so all hosts write the same
records; write files from process 0 only.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import seqio
from flax import nnx

from t2t import decoding, models

Example = Mapping[str, np.ndarray]
Params = nnx.State | Sequence[nnx.State]
INPUT_FORMATS = ("jsonl", "tsv")
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
          config: how to decode (`t2t.decoding.DecodingConfig`; default: `DecodingConfig()`
            with its gin bindings). Its `max_decode_length` None decodes the examples' targets
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
        method = config.method

        def predict(params, batch, rng, max_decode_length):
            extra = {"rng": rng} if method == "sample" else {}
            tokens, aux = model.predict_batch_with_aux(
                params, batch, config, max_decode_length=max_decode_length, **extra)
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
        self._predict = jax.jit(predict, static_argnums=3, **replicated)
        self._score = jax.jit(score, **replicated)
        self._rank = jax.jit(rank, **replicated)

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

    def rank(self, params: Params, examples: Iterable[Example], candidates: np.ndarray
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
        """Fixed-size batches (the last one padded with copies of its last row) and row counts."""
        rows: list[Example] = []
        for example in examples:
            rows.append(example)
            if len(rows) == self.batch_size:
                yield self._place(_stack(rows, self.batch_size)), len(rows)
                rows = []
        if rows:
            yield self._place(_stack(rows, self.batch_size)), len(rows)

    def _place(self, batch: dict[str, np.ndarray]) -> Any:
        if self.partitioner is None:
            return batch
        per_host = self.batch_size // self._num_shards
        start = self._shard_index * per_host
        local = {name: value[start:start + per_host] for name, value in batch.items()}
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


def _stack(rows: Sequence[Example], size: int) -> dict[str, np.ndarray]:
    padded = list(rows) + [rows[-1]] * (size - len(rows))
    return {name: np.stack([np.asarray(row[name]) for row in padded]) for name in rows[0]}


# -- examples from files ------------------------------------------------------------------------


def read_examples(path: str, file_format: str | None = None) -> list[dict[str, str]]:
    """Reads `{"inputs": str, "targets"?: str}` examples from a JSONL or TSV file.

    Args:
      path: the file; its extension (`.jsonl`/`.json`, `.tsv`/`.txt`) gives the format unless
        `file_format` does.
      file_format: "jsonl" or "tsv".

    Raises:
      ValueError: an unknown format or a malformed line (with its number).
    """
    file_format = file_format or _format_of(path)
    if file_format not in INPUT_FORMATS:
        raise ValueError(f"file_format must be one of {INPUT_FORMATS}, got {file_format!r}.")
    examples = []
    parse = _parse_jsonl_line if file_format == "jsonl" else _parse_tsv_line
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not UTF-8 text ({error.reason} at byte {error.start} "
                    "of the line); --input_file takes UTF-8 JSONL or TSV.") from None
            if line.strip():
                examples.append(parse(line, f"{path}:{number}"))
    if not examples:
        raise ValueError(f"{path} holds no examples.")
    return examples


def _format_of(path: str) -> str:
    extension = os.path.splitext(path)[1].lower()
    formats = {".jsonl": "jsonl", ".json": "jsonl", ".tsv": "tsv", ".txt": "tsv"}
    if extension not in formats:
        raise ValueError(
            f"Cannot tell the format of {path} from its extension; name it .jsonl or .tsv, or "
            "pass file_format ('jsonl' or 'tsv')."
        )
    return formats[extension]


def _parse_jsonl_line(line: str, where: str) -> dict[str, str]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise ValueError(f"{where}: not a JSON object ({error}).") from None
    if not isinstance(record, dict) or not isinstance(record.get("inputs"), str):
        raise ValueError(
            f'{where}: expected {{"inputs": "...", "targets"?: "..."}}, got {line[:80]}.')
    example = {"inputs": record["inputs"]}
    if record.get("targets") is not None:
        if not isinstance(record["targets"], str):
            raise ValueError(f"{where}: 'targets' must be a string, got {record['targets']!r}.")
        example["targets"] = record["targets"]
    return example


def _parse_tsv_line(line: str, where: str) -> dict[str, str]:
    columns = line.split("\t")
    if len(columns) > 2:
        raise ValueError(f"{where}: expected 'inputs' or 'inputs<TAB>targets', got {len(columns)} "
                         "tab-separated columns.")
    return dict(zip(("inputs", "targets"), columns))


DEFAULT_INPUTS_LENGTH = 512  # tokens, when neither the flags nor the checkpoint give lengths


def encode_examples(
    examples: Sequence[Mapping[str, str]],
    vocabulary: seqio.Vocabulary,
    *,
    inputs_length: int | None = None,
    targets_length: int | None = None,
    with_targets: bool = True,
) -> tuple[list[dict[str, np.ndarray]], dict[str, int]]:
    """Tokenizes text examples and makes their model features.

    Inputs and targets are encoded and followed by EOS; text longer than its length is cut
    before the EOS (seqio's `append_eos_after_trim`). Lengths default to the longest example.

    Args:
      examples: `{"inputs": str, "targets"?: str}` dicts.
      vocabulary: the checkpoint's vocabulary.
      inputs_length, targets_length: task feature lengths (tokens, EOS included).
      with_targets: False leaves targets empty (prediction must not see them).

    Returns:
      Task-feature examples `{"inputs": [L], "targets": [T]}` (int32, unpadded) and the
      lengths, for `convert`.
    """
    def ids(text, length):
        tokens = list(vocabulary.encode(text))
        if length is not None:
            tokens = tokens[: max(length - 1, 0)]
        return np.asarray(tokens + [decoding.EOS_ID], np.int32)

    encoded = []
    for example in examples:
        targets = example.get("targets") if with_targets else None
        encoded.append({
            "inputs": ids(example["inputs"], inputs_length),
            "targets": np.zeros(0, np.int32) if targets is None else ids(targets, targets_length),
        })
    lengths = {
        "inputs": inputs_length or max(len(e["inputs"]) for e in encoded),
        "targets": targets_length or max(1, max(len(e["targets"]) for e in encoded)),
    }
    return encoded, lengths


def convert(
    model: models.BaseModel, examples: Sequence[Example], lengths: Mapping[str, int]
) -> list[dict[str, np.ndarray]]:
    """Task-feature examples -> the model features of `model.feature_converter`, padded."""
    import tensorflow as tf

    signature = {name: tf.TensorSpec([None], tf.int32) for name in ("inputs", "targets")}
    dataset = tf.data.Dataset.from_generator(
        lambda: ({name: e[name] for name in signature} for e in examples),
        output_signature=signature,
    )
    converter = model.feature_converter(pack=False, for_inference=True, count_trimmed=True)
    return list(converter(dataset, dict(lengths)).as_numpy_iterator())


def predict_examples(
    predictor: Predictor,
    params: Params,
    vocabulary: seqio.Vocabulary,
    examples: Sequence[Mapping[str, str]],
    *,
    inputs_length: int | None = None,
) -> list[dict[str, Any]]:
    """Predicts text examples: records {"inputs", "prediction", "target"?, "score"? (beam)}.

    Decodes the predictor's `max_decode_length` tokens (DEFAULT_MAX_DECODE_LENGTH if unset);
    targets, when given, are copied to the records and never shown to the model.
    """
    encoded, lengths = encode_examples(examples, vocabulary, inputs_length=inputs_length,
                                       with_targets=False)
    features = convert(predictor.model, encoded, lengths)
    length = predictor.max_decode_length or DEFAULT_MAX_DECODE_LENGTH
    tokens, scores = predictor.predict(params, features, max_decode_length=length)
    records = []
    for i, example in enumerate(examples):
        record = {"inputs": example["inputs"], "prediction": vocabulary.decode(tokens[i].tolist())}
        if "targets" in example:
            record["target"] = example["targets"]
        if scores is not None:
            record["score"] = scores[i]
        records.append(record)
    return records


def score_examples(
    predictor: Predictor,
    params: nnx.State,
    vocabulary: seqio.Vocabulary,
    examples: Sequence[Mapping[str, str]],
    *,
    inputs_length: int | None = None,
    targets_length: int | None = None,
) -> list[dict[str, Any]]:
    """Scores text examples' targets: records {"inputs", "target", "score"}."""
    missing = [i for i, e in enumerate(examples) if "targets" not in e]
    if missing:
        raise ValueError(
            f"Scoring needs a target for every example; examples {missing[:10]} have none."
        )
    encoded, lengths = encode_examples(examples, vocabulary, inputs_length=inputs_length,
                                       targets_length=targets_length)
    scores = predictor.score(params, convert(predictor.model, encoded, lengths))
    return [{"inputs": e["inputs"], "target": e["targets"], "score": s}
            for e, s in zip(examples, scores)]


# -- examples from seqio tasks and mixtures -----------------------------------------------------


def _text(example: Mapping[str, Any], name: str, vocabulary: seqio.Vocabulary) -> str:
    raw = example.get(f"{name}_pretokenized")
    if raw is not None:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    return vocabulary.decode(np.asarray(example[name]).tolist())


def task_examples(
    name: str, *, split: str, lengths: Mapping[str, int] | None = None,
    num_examples: int | None = None,
) -> Iterator[tuple[seqio.Task, list[dict[str, Any]], dict[str, int]]]:
    """Each task of a task or mixture with its examples (in order) and feature lengths.

    Args:
      name: a registered task or mixture (a mixture's tasks are read one after the other, not
        sampled by rate).
      split: the split to read.
      lengths: task feature lengths; None measures the longest example of each task.
      num_examples: read at most this many examples per task.
    """
    from t2t.data import registry

    provider = registry.get_task_or_mixture(name)
    registry.check_ready(provider)
    for task in seqio.get_subtasks(provider):
        if "inputs" not in task.output_features:
            raise ValueError(
                f"Task {task.name} has no 'inputs' feature; inference needs inputs to condition on."
            )
        try:
            dataset = task.get_dataset(sequence_length=lengths, split=split, shuffle=False,
                                       num_epochs=1, seed=0)
        except TypeError as error:
            raise ValueError(f"Task {task.name} needs feature lengths ({error}); pass "
                             "inputs_length and targets_length.") from error
        if num_examples is not None:
            dataset = dataset.take(num_examples)
        examples = list(dataset.as_numpy_iterator())
        if not examples:
            raise ValueError(f"Task {task.name} has no examples in split {split!r}.")
        task_lengths = dict(lengths) if lengths else {
            feature: max(1, max(len(e[feature]) for e in examples))
            for feature in ("inputs", "targets")
        }
        yield task, examples, task_lengths


def task_records(
    predictor: Predictor, params: Params, name: str, *, mode: str = "predict",
    split: str = "validation", lengths: Mapping[str, int] | None = None,
    num_examples: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Predicts or scores a task's (or each task of a mixture's) examples, in order.

    Records are those of `predict_examples` / `score_examples` plus "task". Prediction decodes
    the predictor's `max_decode_length` tokens, else the task's targets length.
    """
    _check_mode(mode)
    for task, examples, task_lengths in task_examples(
        name, split=split, lengths=lengths, num_examples=num_examples
    ):
        vocabulary = task.output_features["targets"].vocabulary
        if mode == "predict":
            unlabeled = [{"inputs": e["inputs"], "targets": np.zeros(0, np.int32)}
                         for e in examples]
            features = convert(predictor.model, unlabeled, task_lengths)
            length = predictor.max_decode_length or task_lengths["targets"]
            tokens, scores = predictor.predict(params, features, max_decode_length=length)
            outputs = [{"prediction": vocabulary.decode(t.tolist())} for t in tokens]
            if scores is not None:
                for output, score in zip(outputs, scores):
                    output["score"] = score
        else:
            scores = predictor.score(params, convert(predictor.model, examples, task_lengths))
            outputs = [{"score": score} for score in scores]
        for example, output in zip(examples, outputs):
            yield {"task": task.name, "inputs": _text(example, "inputs", vocabulary),
                   "target": _text(example, "targets", vocabulary), **output}


def _check_mode(mode: str) -> None:
    if mode not in ("predict", "score"):
        raise ValueError(f"mode must be 'predict' or 'score', got {mode!r}.")


# -- the whole run --------------------------------------------------------------------------------


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> int:
    """Writes records as JSON lines (atomically, from process 0 only); returns the count."""
    count = 0
    if jax.process_index() != 0:
        return sum(1 for _ in records)
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    os.replace(temporary, path)
    return count


def infer(
    output_file: str,
    *,
    model_dir: str | None = None,
    input_file: str | None = None,
    task: str | None = None,
    mode: str = "predict",
    checkpoints: Sequence[str | int] = (),
    step: int | None = None,
    split: str = "validation",
    vocabulary_file: str | None = None,
    inputs_length: int | None = None,
    targets_length: int | None = None,
    num_examples: int | None = None,
    partitioner: Any = None,
    **predictor_options,
) -> int:
    """Predicts or scores a file of examples or a task/mixture and writes JSONL records.

    Args:
      output_file: the JSONL file to write.
      model_dir, checkpoints, step: what to load (see `load_members`).
      input_file: a JSONL or TSV file of examples (see `read_examples`), or
      task: a registered task or mixture name.
      mode: "predict" or "score".
      split: the task split.
      vocabulary_file: a SentencePiece model to use instead of the checkpoint's (files only;
        tasks carry their own vocabulary).
      inputs_length, targets_length: feature lengths (default: the lengths the checkpoint
        trained with, else 512 for files; a task's longest example); longer texts are cut
        and counted.
      num_examples: at most this many examples (per task).
      partitioner: a `t2t.partitioning.Partitioner` to run sharded.
      **predictor_options: `Predictor` options (the decoding config, batch_size).

    Returns:
      The number of records written.
    """
    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.data import vocab

    _check_mode(mode)
    if (input_file is None) == (task is None):
        raise ValueError("Pass exactly one of input_file (JSONL/TSV) and task (a task or mixture).")
    loaded, params = model_dir_lib.load_members(model_dir, checkpoints, step=step,
                                                partitioner=partitioner)
    predictor = Predictor(loaded.model, partitioner=partitioner, **predictor_options)
    if task is not None:
        lengths = None
        if inputs_length or targets_length:
            if not (inputs_length and targets_length):
                raise ValueError(
                    "Pass both inputs_length and targets_length for a task, or neither.")
            lengths = {"inputs": inputs_length, "targets": targets_length}
        records = task_records(predictor, params, task, mode=mode, split=split, lengths=lengths,
                               num_examples=num_examples)
        return write_jsonl(output_file, records)
    vocabulary = (vocab.load_vocabulary(vocabulary_file) if vocabulary_file
                  else _checkpoint_vocabulary(loaded, model_dir, checkpoints))
    examples = read_examples(input_file)[:num_examples]
    # Without lengths, cut to what the model trained on: one 100k-character line must not ask
    # for an unbounded batch.
    trained = loaded.metadata.get("task_feature_lengths") or {}
    inputs_length = inputs_length or int(trained.get("inputs") or DEFAULT_INPUTS_LENGTH)
    if mode == "score":
        targets_length = targets_length or int(trained.get("targets") or DEFAULT_INPUTS_LENGTH)
    cut = _count_longer(examples, vocabulary, inputs_length,
                        targets_length if mode == "score" else None)
    if mode == "predict":
        records = predict_examples(predictor, params, vocabulary, examples,
                                   inputs_length=inputs_length)
    else:
        records = score_examples(predictor, params, vocabulary, examples,
                                 inputs_length=inputs_length, targets_length=targets_length)
    if cut:
        print(f"note: {cut} of {len(examples)} examples' texts were longer "
              f"than the feature lengths (inputs {inputs_length}"
              + (f", targets {targets_length}" if mode == "score" else "")
              + " tokens, EOS included) and were cut; set --inputs_length/--targets_length "
              "to change them.", file=sys.stderr, flush=True)
    return write_jsonl(output_file, records)


def _count_longer(examples: Sequence[Mapping[str, str]], vocabulary: seqio.Vocabulary,
                  inputs_length: int, targets_length: int | None) -> int:
    """How many examples have a text longer than its length (EOS included), to be cut."""
    def longer(text: str | None, length: int | None) -> bool:
        return length is not None and text is not None and \
            len(vocabulary.encode(text)) > length - 1

    return sum(longer(e["inputs"], inputs_length) or longer(e.get("targets"), targets_length)
               for e in examples)


def _checkpoint_vocabulary(loaded, model_dir, checkpoints) -> seqio.Vocabulary:
    from t2t.checkpoints import model_dir as model_dir_lib

    path = model_dir or model_dir_lib.parse_member(checkpoints[0], model_dir)[0]
    return model_dir_lib.ModelDir(path).vocabulary(loaded.step)
