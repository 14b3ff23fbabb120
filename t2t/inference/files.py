"""Text examples from files: reading JSONL and TSV, tokenizing them into model features (through
the model's feature converter), predicting or scoring them, and writing JSONL records."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import seqio
from flax import nnx

from t2t import decoding, files, models
from t2t.inference.predictor import DEFAULT_MAX_DECODE_LENGTH, Example, Params, Predictor

INPUT_FORMATS = ("jsonl", "tsv")


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
    with files.open_file(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as error:
                raise ValueError(
                    f"{path}:{number} is not UTF-8 text ({error.reason} at byte {error.start} "
                    "of the line); --input_file takes UTF-8 JSONL or TSV."
                ) from None
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
            f'{where}: expected {{"inputs": "...", "targets"?: "..."}}, got {line[:80]}.'
        )
    example = {"inputs": record["inputs"]}
    if record.get("targets") is not None:
        if not isinstance(record["targets"], str):
            raise ValueError(f"{where}: 'targets' must be a string, got {record['targets']!r}.")
        example["targets"] = record["targets"]
    return example


def _parse_tsv_line(line: str, where: str) -> dict[str, str]:
    columns = line.split("\t")
    if len(columns) > 2:
        raise ValueError(
            f"{where}: expected 'inputs' or 'inputs<TAB>targets', got {len(columns)} "
            "tab-separated columns."
        )
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
        encoded.append(
            {
                "inputs": ids(example["inputs"], inputs_length),
                "targets": np.zeros(0, np.int32)
                if targets is None
                else ids(targets, targets_length),
            }
        )
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
    encoded, lengths = encode_examples(
        examples, vocabulary, inputs_length=inputs_length, with_targets=False
    )
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
    encoded, lengths = encode_examples(
        examples, vocabulary, inputs_length=inputs_length, targets_length=targets_length
    )
    scores = predictor.score(params, convert(predictor.model, encoded, lengths))
    return [
        {"inputs": e["inputs"], "target": e["targets"], "score": s}
        for e, s in zip(examples, scores)
    ]


def write_jsonl(path: str, records: Iterable[Mapping[str, Any]]) -> int:
    """Writes records as JSON lines (atomically, from process 0 only); returns the count."""
    count = 0
    if jax.process_index() != 0:
        return sum(1 for _ in records)
    files.makedirs(files.parent(files.absolute(path)))
    with files.atomic_writer(path) as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
            count += 1
    return count


def count_longer(
    examples: Sequence[Mapping[str, str]],
    vocabulary: seqio.Vocabulary,
    inputs_length: int,
    targets_length: int | None,
) -> int:
    """How many examples have a text longer than its length (EOS included), to be cut."""

    def longer(text: str | None, length: int | None) -> bool:
        return length is not None and text is not None and len(vocabulary.encode(text)) > length - 1

    return sum(
        longer(e["inputs"], inputs_length) or longer(e.get("targets"), targets_length)
        for e in examples
    )
