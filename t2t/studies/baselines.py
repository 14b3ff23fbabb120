"""The constant baseline of a task: always answer its most frequent training target.

A study calls a run degenerate when its score is at or below this baseline (the companion
studies count such restarts). For a classification task it is the majority class; for a
regression task scored by correlation, a constant has no correlation and scores 0; for
generation, the ROUGE of always writing the most common training summary.

    scores = constant_baseline("builtin_package")   # {"accuracy": 15.26}
    task_score(scores)                               # 15.26 (the mean of the task's metrics)
"""

from __future__ import annotations

import collections
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

# Feature lengths wide enough that no built-in or benchmark example is cut.
_LENGTHS = {"inputs": 4096, "targets": 1024}


def _texts(task, split: str, limit: int | None = None) -> list[dict[str, Any]]:
    dataset = task.get_dataset(_LENGTHS, split=split, shuffle=False, num_epochs=1)
    if limit is not None:
        dataset = dataset.take(limit)
    return list(dataset.as_numpy_iterator())


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def constant_baseline(
    task_name: str, *, split: str = "validation", train_limit: int | None = 20000
) -> dict[str, float]:
    """The task's metrics when every prediction is its most frequent training target.

    Args:
      task_name: a registered seqio task with predict metric functions.
      split: the evaluated split.
      train_limit: read at most this many training examples to find the most frequent target.

    Returns:
      {metric: value}; a correlation of a constant (NaN) is 0.
    """
    import seqio

    task = seqio.get_mixture_or_task(task_name)
    counts = collections.Counter(
        _text(e["targets_pretokenized"]) for e in _texts(task, "train", train_limit)
    )
    constant = counts.most_common(1)[0][0]
    examples = _texts(task, split)
    post = task.postprocess_fn or (lambda value, **_: value)
    targets = [post(_text(e["targets_pretokenized"]), example=e, is_target=True) for e in examples]
    predictions = [post(constant, example=e, is_target=False) for e in examples]
    scores: dict[str, float] = {}
    for metric_fn in task.predict_metric_fns:
        for name, value in metric_fn(targets, predictions).items():
            value = float(getattr(value, "value", value))
            scores[name] = 0.0 if math.isnan(value) else value
    return scores


def task_score(metrics: Mapping[str, float]) -> float:
    """One number per task, GLUE's way: the mean of its metrics (NaN counts as 0)."""
    values = [0.0 if math.isnan(float(v)) else float(v) for v in metrics.values()]
    return float(np.mean(values)) if values else float("nan")
