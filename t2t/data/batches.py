"""Fixed-shape host batches from finite data: the two ways t2t pads a short last batch.

The last batch of a finite split is usually short, and jitted steps want one shape (and a batch
divisible by the data axis). What the padding rows may be depends on what the step computes:

- **Sums** (teacher-forced loss and accuracy, `pad_batch`): all-zero rows, whose zero loss
  weights add nothing to any sum.
- **Decoding** (prediction, scoring, rank classification, `stack_rows`): copies of the last real
  row, whose outputs are dropped. Zero rows would decode too, but a decoding loop runs until
  every row has finished, and a row of padding may never emit EOS; a copy finishes exactly when
  the row it copies does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

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


def stack_rows(rows: Sequence[Mapping[str, np.ndarray]], size: int) -> Batch:
    """Stacks single-example feature dicts into a batch of `size` rows, repeating the last.

    Example: rows a, b, c stacked to 4 give the batch a, b, c, c.

    Raises:
      ValueError: with no rows, or more than `size`.
    """
    if not rows or len(rows) > size:
        raise ValueError(f"Expected 1 to {size} rows, got {len(rows)}.")
    padded = list(rows) + [rows[-1]] * (size - len(rows))
    return {name: np.stack([np.asarray(row[name]) for row in padded]) for name in rows[0]}


def eval_batches(
    config: pipeline.PipelineConfig, num_batches: int | None = None
) -> Callable[[], Iterator[Batch]]:
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
    pipeline.check_readable(config)  # a missing task or file fails now, not at the first eval
    built = []  # the tf.data graph, built at the first call: a run that never evaluates skips it

    def batches() -> Iterator[Batch]:
        if not built:
            dataset = pipeline.build_dataset(config)
            built.append(dataset.take(num_batches) if num_batches is not None else dataset)
        for batch in built[0].as_numpy_iterator():
            yield pad_batch(batch, config.per_host_batch_size)

    return batches
