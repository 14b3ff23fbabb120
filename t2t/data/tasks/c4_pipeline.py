"""Registers seqio tasks that read the C4 pipeline's output (`python -m c4_pipeline`).

The pipeline writes `c4-<split>.tfrecord-*` shards of `tf.train.Example`s with a `text` feature.
`register_c4_pipeline_task` turns such a directory into a pretraining task: the text becomes the
`targets` feature, is tokenized, cached (if `t2t cache` is run), corrupted by the objective (span
corruption by default, as in the paper), and gets EOS appended after the objective trims it.
Importing this module registers nothing; call the function (from a gin file or a tasks module).
"""

from __future__ import annotations

import functools
from typing import Callable, Optional

import seqio
import tensorflow as tf

from t2t import files

_SPLITS = ("train", "validation")


def split_patterns(data_dir: str) -> dict[str, str]:
    """Returns {split: shard pattern} for the splits the pipeline wrote to `data_dir`.

    Raises:
        ValueError: when `data_dir` holds no train shards.
    """
    patterns = {split: f"{data_dir.rstrip('/')}/c4-{split}.tfrecord-*" for split in _SPLITS}
    found = {split: p for split, p in patterns.items() if files.glob(p)}
    if "train" not in found:
        raise ValueError(
            f"No C4 pipeline shards in {data_dir!r} (expected files matching "
            f"{patterns['train']!r}). Run `python -m c4_pipeline --wet_paths=... "
            "--output_dir=DIR` and pass DIR."
        )
    return found


def _default_objective() -> Callable:
    import preprocessors  # The top-level package of objectives; imported when a task is built.

    return preprocessors.span_corruption


def register_c4_pipeline_task(
    name: str,
    data_dir: str,
    vocabulary: seqio.Vocabulary,
    *,
    objective: Optional[Callable] = None,
) -> seqio.Task:
    """Registers (and returns) a seqio task over a C4 pipeline output directory.

    Args:
        name: the task's registry name, e.g. "c4_pipeline_span_corruption".
        data_dir: the pipeline's `--output_dir` (local or remote).
        vocabulary: the vocabulary for inputs and targets (it must have sentinel extra ids for
            span corruption).
        objective: a seqio preprocessor (dataset, sequence_length, output_features) -> dataset
            that reads the tokenized `targets` and yields `inputs`/`targets`;
            `preprocessors.span_corruption` (noise density 0.15, mean span length 3) when None.

    Returns:
        The registered `seqio.Task` (splits: train, and validation when the pipeline wrote one).

    Raises:
        ValueError: when `data_dir` has no shards, or `name` is already registered.
    """
    if name in seqio.TaskRegistry.names():
        raise ValueError(f"A task named {name!r} is already registered; choose another name.")
    source = seqio.TFExampleDataSource(
        split_to_filepattern=split_patterns(data_dir),
        feature_description={"text": tf.io.FixedLenFeature([], tf.string)},
    )
    output_features = {
        "inputs": seqio.Feature(vocabulary, add_eos=True, required=False),
        "targets": seqio.Feature(vocabulary, add_eos=True),
    }
    return seqio.TaskRegistry.add(
        name,
        source=source,
        preprocessors=[
            functools.partial(
                seqio.preprocessors.rekey, key_map={"inputs": None, "targets": "text"}
            ),
            seqio.preprocessors.tokenize,
            seqio.CacheDatasetPlaceholder(),
            objective or _default_objective(),
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=output_features,
        metric_fns=[],
    )
