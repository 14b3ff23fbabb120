"""Examples of registered seqio tasks and mixtures, predicted or scored in order, task by task."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import seqio

from t2t.inference.files import convert
from t2t.inference.predictor import Params, Predictor


def _text(example: Mapping[str, Any], name: str, vocabulary: seqio.Vocabulary) -> str:
    raw = example.get(f"{name}_pretokenized")
    if raw is not None:
        return raw.decode("utf-8") if isinstance(raw, bytes) else str(raw)
    return vocabulary.decode(np.asarray(example[name]).tolist())


def task_examples(
    name: str,
    *,
    split: str,
    lengths: Mapping[str, int] | None = None,
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
            dataset = task.get_dataset(
                sequence_length=lengths, split=split, shuffle=False, num_epochs=1, seed=0
            )
        except TypeError as error:
            raise ValueError(
                f"Task {task.name} needs feature lengths ({error}); pass "
                "inputs_length and targets_length."
            ) from error
        if num_examples is not None:
            dataset = dataset.take(num_examples)
        examples = list(dataset.as_numpy_iterator())
        if not examples:
            raise ValueError(f"Task {task.name} has no examples in split {split!r}.")
        task_lengths = (
            dict(lengths)
            if lengths
            else {
                feature: max(1, max(len(e[feature]) for e in examples))
                for feature in ("inputs", "targets")
            }
        )
        yield task, examples, task_lengths


def task_records(
    predictor: Predictor,
    params: Params,
    name: str,
    *,
    mode: str = "predict",
    split: str = "validation",
    lengths: Mapping[str, int] | None = None,
    num_examples: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Predicts or scores a task's (or each task of a mixture's) examples, in order.

    Records are those of `predict_examples` / `score_examples` plus "task". Prediction decodes
    the predictor's `max_decode_length` tokens, else the task's targets length.
    """
    check_mode(mode)
    for task, examples, task_lengths in task_examples(
        name, split=split, lengths=lengths, num_examples=num_examples
    ):
        vocabulary = task.output_features["targets"].vocabulary
        if mode == "predict":
            unlabeled = [
                {"inputs": e["inputs"], "targets": np.zeros(0, np.int32)} for e in examples
            ]
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
            yield {
                "task": task.name,
                "inputs": _text(example, "inputs", vocabulary),
                "target": _text(example, "targets", vocabulary),
                **output,
            }


def check_mode(mode: str) -> None:
    if mode not in ("predict", "score"):
        raise ValueError(f"mode must be 'predict' or 'score', got {mode!r}.")
