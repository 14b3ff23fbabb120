"""`infer`: the whole inference run, from a model directory (or an ensemble of checkpoints) and a
file or task to a JSONL file of records."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Sequence
from typing import Any

import seqio

from t2t import models
from t2t.errors import UserError
from t2t.inference.files import (
    DEFAULT_INPUTS_LENGTH,
    count_longer,
    predict_examples,
    read_examples,
    score_examples,
    write_jsonl,
)
from t2t.inference.predictor import Predictor
from t2t.inference.tasks import check_mode, task_records


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

    check_mode(mode)
    if (input_file is None) == (task is None):
        raise ValueError("Pass exactly one of input_file (JSONL/TSV) and task (a task or mixture).")
    loaded, params = model_dir_lib.load_members(
        model_dir, checkpoints, step=step, partitioner=partitioner
    )
    predictor = Predictor(
        models.model_for(loaded.config), partitioner=partitioner, **predictor_options
    )
    lengths = (inputs_length, targets_length)
    if task is not None:
        records = _task_records(predictor, params, loaded, task, mode, split, lengths, num_examples)
    else:
        vocabulary = _file_vocabulary(loaded, model_dir, checkpoints, vocabulary_file)
        examples = read_examples(input_file)[:num_examples]
        records = _file_records(predictor, params, loaded, vocabulary, examples, mode, lengths)
    return write_jsonl(output_file, records)


def _task_records(
    predictor, params, loaded, task, mode, split, lengths, num_examples
) -> Iterable[dict]:
    """`infer`'s records of a registered task or mixture, checked readable offline and
    tokenized within the model's vocabulary; `lengths` = (inputs, targets) or (None, None)."""
    from t2t.data import registry

    inputs_length, targets_length = lengths
    if bool(inputs_length) != bool(targets_length):
        raise ValueError("Pass both inputs_length and targets_length for a task, or neither.")
    provider = registry.get_task_or_mixture(task)
    registry.check_ready(provider)
    registry.check_vocabulary_fits(
        provider,
        loaded.config.vocab_size,
        fix="Infer on tasks tokenized with the model's vocabulary.",
    )
    lengths = {"inputs": inputs_length, "targets": targets_length} if inputs_length else None
    return task_records(
        predictor,
        params,
        task,
        mode=mode,
        split=split,
        lengths=lengths,
        num_examples=num_examples,
    )


def _file_vocabulary(loaded, model_dir, checkpoints, vocabulary_file):
    """The vocabulary of a file's examples: `vocabulary_file`, else the checkpoint's."""
    from t2t.data import vocab

    if not vocabulary_file:
        return _checkpoint_vocabulary(loaded, model_dir, checkpoints)
    vocabulary = vocab.load_vocabulary(vocabulary_file)
    vocab_size = loaded.config.vocab_size
    if vocabulary.vocab_size > vocab_size:  # ids past the embedding: NaN
        raise UserError(
            f"The vocabulary {vocabulary_file} has {vocabulary.vocab_size} ids but the model's "
            f"embedding only {vocab_size} rows. Pass the vocabulary the model was trained "
            "with (or none: its model directory carries it)."
        )
    return vocabulary


def _file_records(predictor, params, loaded, vocabulary, examples, mode, lengths) -> Iterable[dict]:
    """`infer`'s records of a file's examples. Without `lengths` (inputs, targets), texts are cut
    to what the model trained on: one 100k-character line must not ask for an unbounded batch."""
    inputs_length, targets_length = lengths
    trained = loaded.metadata.get("task_feature_lengths") or {}
    inputs_length = inputs_length or int(trained.get("inputs") or DEFAULT_INPUTS_LENGTH)
    if mode == "predict":
        _note_cut(examples, vocabulary, inputs_length, None)
        return predict_examples(
            predictor, params, vocabulary, examples, inputs_length=inputs_length
        )
    targets_length = targets_length or int(trained.get("targets") or DEFAULT_INPUTS_LENGTH)
    _note_cut(examples, vocabulary, inputs_length, targets_length)
    return score_examples(
        predictor,
        params,
        vocabulary,
        examples,
        inputs_length=inputs_length,
        targets_length=targets_length,
    )


def _note_cut(examples, vocabulary, inputs_length: int, targets_length: int | None) -> None:
    """Tells on stderr how many examples are longer than the lengths (they will be cut)."""
    cut = count_longer(examples, vocabulary, inputs_length, targets_length)
    if cut:
        targets = f", targets {targets_length}" if targets_length else ""
        print(
            f"note: {cut} of {len(examples)} examples' texts were longer than the feature "
            f"lengths (inputs {inputs_length}{targets} tokens, EOS included) and were cut; set "
            "--inputs_length/--targets_length to change them.",
            file=sys.stderr,
            flush=True,
        )


def _checkpoint_vocabulary(loaded, model_dir, checkpoints) -> seqio.Vocabulary:
    from t2t.checkpoints import model_dir as model_dir_lib

    path = model_dir or model_dir_lib.parse_member(checkpoints[0], model_dir)[0]
    return model_dir_lib.open_model_dir(path).vocabulary(loaded.step)
