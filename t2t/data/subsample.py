"""A training task capped at N examples: a subset chosen by the run's seed.

The paper's and its companion studies' low-resource settings train on a few hundred or thousand
examples of a task. `subsample` reads the task's examples in their fixed order once to count
them, draws N distinct indices with the seed (`numpy.random.default_rng(seed).choice`), and keeps
exactly those examples, so the same seed always gives the same subset and different seeds give
different ones; shuffling and repeating happen after, over the subset alone.

Example: 10 examples, N = 3: seed 0 keeps the examples at indices [5, 6, 9], seed 1 those at
[3, 4, 7] (`subset_indices(10, 3, seed)`), whatever the shuffling of the training run.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np


def subset_indices(num_available: int, max_examples: int, seed: int) -> np.ndarray:
    """Sorted distinct indices of the kept examples (all of them when N >= the count)."""
    if max_examples >= num_available:
        return np.arange(num_available)
    chosen = np.random.default_rng(seed).choice(num_available, max_examples, replace=False)
    return np.sort(chosen)


def count_examples(dataset) -> int:
    """The number of elements of a finite `tf.data.Dataset` (iterating it when unknown)."""
    known = int(dataset.cardinality())
    if known >= 0:
        return known
    return int(dataset.reduce(np.int64(0), lambda count, _: count + 1))


def subsample(dataset, max_examples: int, seed: int) -> tuple[Any, dict[str, Any]]:
    """The elements of a finite dataset at `subset_indices`, in their original order.

    Args:
      dataset: a finite, deterministically ordered `tf.data.Dataset` (a task's split read
        with shuffle=False and one epoch).
      max_examples: N.
      seed: chooses the subset.

    Returns:
      (the subset dataset, a description for the run's metadata: N, the count available, the
      seed and a digest of the chosen indices).

    Raises:
      ValueError: for N < 1.
    """
    import tensorflow as tf

    if not isinstance(max_examples, int) or max_examples < 1:
        raise ValueError(f"max_train_examples must be a positive int, got {max_examples!r}.")
    available = count_examples(dataset)
    if available == 0:
        raise ValueError("The training split has no examples to subsample.")
    indices = subset_indices(available, max_examples, seed)
    keep = np.zeros(available, bool)
    keep[indices] = True
    keep_tensor = tf.constant(keep)
    subset = (
        dataset.enumerate()
        .filter(lambda i, _: tf.gather(keep_tensor, i))
        .map(lambda _, example: example)
    )
    digest = hashlib.sha256(indices.astype(np.int64).tobytes()).hexdigest()[:16]
    return subset, {
        "max_examples": max_examples,
        "examples_available": available,
        "examples_kept": int(len(indices)),
        "subset_seed": seed,
        "subset_digest": digest,
    }
