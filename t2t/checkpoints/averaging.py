"""Checkpoint averaging: the element-wise mean of several checkpoints' parameters.

Averaging the last checkpoints of a run smooths out the noise of the final updates; the T5 paper
(section 3.6) compares it with ensembling and finds it gives part of the ensemble's gain at the
cost of one model. Checkpoints are read one at a time into a float32 running sum, so memory
holds one checkpoint plus the sum, whatever N is; the result is written as a new single-
checkpoint model directory that evaluation, inference and export read like any other.

    averaged = average_checkpoints("/runs/t5_small", last=4)
    write_averaged("/runs/t5_small_avg4", averaged)
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from t2t import files
from t2t.checkpoints import manager as manager_lib
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.checkpoints.integrity import CorruptCheckpointError


@dataclasses.dataclass
class Averaged:
    """The mean parameters of `steps` of the model directory `source`."""

    params: nnx.State
    steps: list[int]
    metadata: dict[str, Any]
    source: str


def select_steps(
    saved: Sequence[int], *, steps: Sequence[int] | None = None, last: int | None = None
) -> list[int]:
    """The checkpoints to average: the given `steps`, or the `last` N saved ones.

    Example: saved [100, 200, 300, 400], last=3 -> [200, 300, 400]; steps=[100, 400] ->
    [100, 400].

    Raises:
      ValueError: neither or both given, a step that was not saved, or N out of range.
    """
    saved = sorted(saved)
    if (steps is None) == (last is None):
        raise ValueError(
            f"Pass either steps (a list of saved steps) or last (a count), not "
            f"{'both' if steps is not None else 'neither'}; saved steps: {saved}."
        )
    if last is not None:
        if not 1 <= last <= len(saved):
            raise ValueError(
                f"last={last}: expected a count between 1 and the {len(saved)} saved "
                f"checkpoints {saved}."
            )
        return saved[-last:]
    chosen = sorted(set(int(s) for s in steps))
    missing = [s for s in chosen if s not in saved]
    if not chosen or missing:
        raise ValueError(
            f"Cannot average steps {list(steps)}: {missing or 'none given'} not saved; saved "
            f"steps: {saved}."
        )
    return chosen


@jax.jit
def _accumulate(total: nnx.State, params: nnx.State) -> nnx.State:
    return jax.tree.map(lambda s, p: s + p.astype(jnp.float32), total, params)


def average_checkpoints(
    model_dir: str | os.PathLike,
    *,
    steps: Sequence[int] | None = None,
    last: int | None = None,
    partitioner: Any = None,
) -> Averaged:
    """The mean of the parameters of the chosen checkpoints (see `select_steps`).

    Args:
      model_dir: the run's model directory.
      steps: the steps to average, or
      last: average the last N saved checkpoints.
      partitioner: restore (and sum) in the shards of this `t2t.partitioning.Partitioner`;
        None for the default device.

    Returns:
      The averaged parameters (in the checkpoints' parameter dtype) with the metadata of the
      latest averaged step.

    Raises:
      ValueError: for a bad step selection, or checkpoints of different networks.
    """
    directory = model_dir_lib.ModelDir(model_dir)
    chosen = select_steps(directory.steps(), steps=steps, last=last)
    config = directory.config(chosen[-1])
    total, dtypes, metadata = None, None, {}
    for step in chosen:
        if directory.config(step) != config:
            raise ValueError(
                f"Checkpoints {chosen[-1]} and {step} of {directory.path} belong to different "
                "networks (their configs differ); average checkpoints of one run."
            )
        try:
            params, step_metadata = directory.restore_params(
                step, config=config, partitioner=partitioner
            )
        except CorruptCheckpointError as error:
            others = [s for s in directory.steps() if s != step]
            raise CorruptCheckpointError(
                error.directory,
                error.step,
                error.item,
                f"{error.detail}. Average intact checkpoints instead: name them with --steps "
                f"(the other saved steps: {others}; `t2t check {directory.path}` says which "
                "are intact)",
            ) from None
        if total is None:
            # NOTE: the running sum is float32 whatever the parameter dtype: summing N bfloat16
            # checkpoints in bfloat16 would round every partial sum to 8 mantissa bits.
            dtypes = jax.tree.map(lambda p: p.dtype, params)
            total = jax.tree.map(lambda p: p.astype(jnp.float32), params)
        else:
            total = _accumulate(total, params)
        metadata = step_metadata
        del params  # one checkpoint in memory at a time, besides the sum
    mean = jax.tree.map(lambda s, dtype: (s / len(chosen)).astype(dtype), total, dtypes)
    return Averaged(mean, chosen, dict(metadata), directory.path)


def write_averaged(
    output_dir: str | os.PathLike, averaged: Averaged, *, step: int | None = None
) -> str:
    """Writes the averaged parameters as a one-checkpoint model directory.

    The checkpoint holds parameters only (no optimizer state: it is for evaluation, inference
    and export) and the metadata of the latest averaged step plus `averaged_steps` and
    `averaged_from`. The source's `config.gin`, `model_config.json` and `spiece.model` are
    copied beside it.

    Args:
      output_dir: the new model directory (must not hold checkpoints yet).
      averaged: what `average_checkpoints` returned.
      step: the step to save under (default: the latest averaged step).

    Returns:
      `output_dir`.
    """
    output_dir = os.fspath(output_dir)
    if files.isdir(files.join(output_dir, manager_lib.CHECKPOINTS_SUBDIR)):
        raise ValueError(
            f"{output_dir} already holds checkpoints; write the averaged checkpoint to a new "
            "directory so it cannot be confused with (or pruned like) a training checkpoint."
        )
    step = averaged.steps[-1] if step is None else int(step)
    metadata = {
        **averaged.metadata,
        "step": step,
        "averaged_steps": list(averaged.steps),
        "averaged_from": files.absolute(averaged.source),
    }
    manager = manager_lib.CheckpointManager(output_dir, keep=None, async_save=False)
    manager.save(step, params=averaged.params, metadata=metadata)
    manager.wait_until_finished()
    manager.close()
    for name in (
        model_dir_lib.CONFIG_GIN,
        model_dir_lib.MODEL_CONFIG_JSON,
        model_dir_lib.VOCABULARY_FILE,
    ):
        source = files.join(averaged.source, name)
        if files.exists(source):
            files.copy(source, files.join(output_dir, name))
    return output_dir
