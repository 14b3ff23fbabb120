"""Host-side batches for evaluation and predictions: fixed shapes from finite datasets.

The last batch of a finite split is usually short. Jitted steps want one shape (and a batch
divisible by the data axis), so short batches are padded with all-zero rows: zero tokens and
zero loss weights, which add nothing to any sum an eval step computes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

import numpy as np

from t2t.data import pipeline

Batch = dict[str, np.ndarray]


def pad_batch(batch: Mapping[str, np.ndarray], size: int) -> Batch:
    """Pads every feature's batch dimension with zero rows up to `size`.

    Example: a batch of 3 rows padded to 4 gets one row of zeros in every feature.

    Raises:
      ValueError: when the batch already has more than `size` rows.
    """
    out = {}
    for name, value in batch.items():
        value = np.asarray(value)
        if value.shape[0] > size:
            raise ValueError(f"Feature {name!r} has {value.shape[0]} rows, more than {size}.")
        padding = [(0, size - value.shape[0])] + [(0, 0)] * (value.ndim - 1)
        out[name] = np.pad(value, padding)
    return out


def eval_batches(config: pipeline.PipelineConfig,
                 num_batches: int | None = None) -> Callable[[], Iterator[Batch]]:
    """A function giving, on every call, the same batches of one pass over `config`'s data.

    Args:
      config: the data to read; should be finite (`num_epochs=1`) and unshuffled.
      num_batches: stop after this many batches (None: the whole split).

    Returns:
      A zero-argument callable returning an iterator of numpy batches with exactly
      `config.per_host_batch_size` rows each (the last one padded with zero rows).
    """
    if config.num_epochs is None and num_batches is None:
        raise ValueError(
            "An eval set that repeats forever needs num_batches; set num_epochs=1 or a number of "
            "batches."
        )
    dataset = pipeline.build_dataset(config)
    if num_batches is not None:
        dataset = dataset.take(num_batches)

    def batches() -> Iterator[Batch]:
        for batch in dataset.as_numpy_iterator():
            yield pad_batch(batch, config.per_host_batch_size)

    return batches
