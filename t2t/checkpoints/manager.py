"""Orbax checkpoints of a training run, with the input pipeline's position, written atomically.

Each checkpoint is a step directory `<model_dir>/checkpoints/<step>/` holding four items:

  params         the network parameters (an `nnx.State`, stored as a dict of arrays)
  opt_state      the optimizer state
  data_iterator  every host's input-pipeline position, so a resumed run reads exactly the batches
                 an uninterrupted run would have read
  metadata       JSON: the step, the `TransformerConfig`, and whatever the trainer adds

Orbax writes a step into a temporary directory and renames it into place only when every item is
complete, so a crash in the middle of a save leaves the earlier checkpoints untouched and the
half-written one is never mistaken for a checkpoint (it is cleaned up on the next start).
Retention keeps the last `keep` steps and, for every tracked metric, the best step by that metric.
Restores take abstract targets carrying shardings, so a checkpoint written on one mesh restores
straight into the shards of another.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from t2t.nn.config import TransformerConfig

CHECKPOINTS_SUBDIR = "checkpoints"
_ITEMS = ("params", "opt_state", "data_iterator", "metadata")


class SavableIterator(Protocol):
    """What the manager needs of an input pipeline (`t2t.data.pipeline.InputPipeline` has it)."""

    def save(self, directory: str) -> Any: ...

    def restore(self, directory: str) -> None: ...


# -- the data-iterator item ----------------------------------------------------------------------


class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves and restores each host's input-pipeline position in its own subdirectory."""

    def save(self, directory: epath.Path, args: DataIteratorSave) -> None:
        args.iterator.save(os.fspath(directory / f"process_{jax.process_index()}"))

    def restore(self, directory: epath.Path, args: DataIteratorRestore) -> SavableIterator:
        path = directory / f"process_{jax.process_index()}"
        if not path.exists():
            raise ValueError(
                f"The checkpoint at {directory} holds no data-iterator state for process "
                f"{jax.process_index()} (expected {path}). It was written by a run with fewer "
                "hosts; restore without the data iterator (restore_data=False) to start the "
                "input pipeline afresh."
            )
        args.iterator.restore(os.fspath(path))
        return args.iterator


@ocp.args.register_with_handler(DataIteratorHandler, for_save=True)
@dataclasses.dataclass
class DataIteratorSave(ocp.args.CheckpointArgs):
    iterator: SavableIterator


@ocp.args.register_with_handler(DataIteratorHandler, for_restore=True)
@dataclasses.dataclass
class DataIteratorRestore(ocp.args.CheckpointArgs):
    iterator: SavableIterator


# -- retention ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class BestMetric:
    """A metric whose best checkpoint is kept, e.g. `BestMetric("glue_cola/matthews_corrcoef")`.

    Attributes:
      name: a key of the metrics dict passed to `CheckpointManager.save`.
      mode: "max" when higher is better (accuracy, BLEU), "min" when lower is (loss).
    """

    name: str
    mode: str = "max"

    def __post_init__(self):
        if self.mode not in ("max", "min"):
            raise ValueError(f"BestMetric.mode must be 'max' or 'min', got {self.mode!r}.")

    def policy(self) -> ocp.checkpoint_managers.PreservationPolicy:
        worst = float("-inf") if self.mode == "max" else float("inf")
        # NOTE: BestN sorts by the metric and preserves the n at the "best" end; `reverse`
        # selects which end (checked by tests for both modes). Steps saved without this metric
        # rank worst, so they are never kept on its account.
        return ocp.checkpoint_managers.BestN(
            get_metric_fn=lambda metrics: float(metrics.get(self.name, worst)),
            reverse=self.mode == "min",
            n=1,
            keep_checkpoints_without_metrics=False,
        )


# -- the manager -------------------------------------------------------------------------------


@dataclasses.dataclass
class Restored:
    """What `CheckpointManager.restore` returns."""

    step: int
    params: nnx.State
    opt_state: Any | None
    metadata: dict[str, Any]


class CheckpointManager:
    """Saves and restores training checkpoints under `<model_dir>/checkpoints/`.

    Example:
      manager = CheckpointManager(model_dir, keep=3, best=[BestMetric("eval/loss", "min")])
      manager.save(step, params=params, opt_state=opt_state, data_iterator=pipeline,
                   metadata={"config": config}, metrics={"eval/loss": 2.1})
      restored = manager.restore(abstract_params=..., abstract_opt_state=...,
                                 data_iterator=fresh_pipeline)
    """

    def __init__(
        self,
        model_dir: str | os.PathLike,
        *,
        keep: int | None = 3,
        best: Sequence[BestMetric] = (),
        async_save: bool = True,
        read_only: bool = False,
    ):
        """
        Args:
          model_dir: the run's directory; checkpoints go to its `checkpoints/` subdirectory.
          keep: how many of the most recent checkpoints to keep (None: all).
          best: metrics whose best checkpoint is kept besides the most recent ones.
          async_save: write arrays in the background while training continues.
          read_only: open existing checkpoints without creating or deleting anything.
        """
        path = os.fspath(model_dir)
        if "://" not in path:
            # NOTE: Orbax's array writers reject relative paths (`make demo` passes runs/demo).
            path = os.path.abspath(path)
        self.directory = epath.Path(path) / CHECKPOINTS_SUBDIR
        policies = [ocp.checkpoint_managers.LatestN(n=keep)] + [m.policy() for m in best]
        options = ocp.CheckpointManagerOptions(
            create=not read_only,
            read_only=read_only,
            cleanup_tmp_directories=not read_only,
            enable_async_checkpointing=async_save,
            preservation_policy=ocp.checkpoint_managers.AnyPreservationPolicy(policies),
            # NOTE: Orbax persists the metrics passed to `save` only when `best_fn` is set; its
            # value is unused beside a preservation policy, but without it the metrics of old
            # steps are unknown after a restart and the best checkpoints would be deleted.
            best_fn=(lambda metrics: 0.0) if best else None,
        )
        self._manager = ocp.CheckpointManager(
            self.directory,
            options=options,
            item_names=_ITEMS,
            item_handlers={"data_iterator": DataIteratorHandler()},
        )

    # -- queries -------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def metrics(self, step: int) -> dict[str, float] | None:
        """The metrics saved with `step`, or None."""
        metrics = self._manager.metrics(step)
        return None if metrics is None else {k: float(v) for k, v in metrics.items()}

    # -- save ----------------------------------------------------------------------------------

    def save(
        self,
        step: int,
        *,
        params: nnx.State,
        opt_state: Any = None,
        data_iterator: SavableIterator | None = None,
        metadata: Mapping[str, Any] | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> None:
        """Saves a checkpoint for `step` (asynchronously for arrays when `async_save`).

        The data iterator is saved synchronously, before this returns, so its position is the
        one after the batches of `step` were consumed.
        """
        items: dict[str, ocp.args.CheckpointArgs] = {
            "params": ocp.args.StandardSave(nnx.to_pure_dict(params)),
            "metadata": ocp.args.JsonSave(_jsonable({"step": step, **(metadata or {})})),
        }
        if opt_state is not None:
            items["opt_state"] = ocp.args.StandardSave(opt_state)
        if data_iterator is not None:
            items["data_iterator"] = DataIteratorSave(data_iterator)
        saved = self._manager.save(
            step,
            args=ocp.args.Composite(**items),
            metrics=None if metrics is None else {k: float(v) for k, v in metrics.items()},
            force=True,
        )
        if not saved:
            logging.warning("Orbax skipped the checkpoint of step %d.", step)

    def wait_until_finished(self) -> None:
        """Blocks until every pending asynchronous save is on disk."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    # -- restore -------------------------------------------------------------------------------

    def restore(
        self,
        step: int | None = None,
        *,
        abstract_params: nnx.State,
        abstract_opt_state: Any = None,
        data_iterator: SavableIterator | None = None,
    ) -> Restored:
        """Restores `step` (default: the latest) into the given abstract targets.

        Args:
          step: the step to restore; None for the latest.
          abstract_params: the parameter state as `jax.ShapeDtypeStruct`s carrying shardings
            (`Partitioner.abstract_model`); arrays are read straight into those shards.
          abstract_opt_state: the same for the optimizer state; None to skip it (fine-tuning
            from a pretrained checkpoint, evaluation).
          data_iterator: a freshly built input pipeline to move to the saved position; None to
            skip it.

        Raises:
          FileNotFoundError: when there is no checkpoint (at `step`).
        """
        step = self._resolve_step(step)
        items: dict[str, ocp.args.CheckpointArgs] = {
            "params": ocp.args.StandardRestore(nnx.to_pure_dict(abstract_params)),
            "metadata": ocp.args.JsonRestore(),
        }
        if abstract_opt_state is not None:
            items["opt_state"] = ocp.args.StandardRestore(abstract_opt_state)
        if data_iterator is not None:
            items["data_iterator"] = DataIteratorRestore(data_iterator)
        restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        params = _fill(abstract_params, restored["params"])
        return Restored(
            step=step,
            params=params,
            opt_state=restored["opt_state"] if abstract_opt_state is not None else None,
            metadata=dict(restored["metadata"]),
        )

    def read_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The metadata JSON of `step` (default: the latest), without reading any array."""
        step = self._resolve_step(step)
        args = ocp.args.Composite(metadata=ocp.args.JsonRestore())
        restored = self._manager.restore(step, args=args)
        return dict(restored["metadata"])

    def _resolve_step(self, step: int | None) -> int:
        steps = self.all_steps()
        if step is None:
            if not steps:
                raise FileNotFoundError(f"No checkpoint under {self.directory}.")
            return steps[-1]
        if step not in steps:
            raise FileNotFoundError(
                f"No checkpoint of step {step} under {self.directory}; saved steps: {steps}."
            )
        return step


def config_from_metadata(metadata: Mapping[str, Any]) -> TransformerConfig:
    """The `TransformerConfig` a checkpoint was trained with (saved under "config")."""
    if "config" not in metadata:
        raise ValueError(
            "This checkpoint's metadata has no 'config' entry, so the network it belongs to is "
            "unknown; pass the TransformerConfig explicitly (e.g. --gin_file=gin/models/...)."
        )
    return TransformerConfig(**metadata["config"])


def _fill(abstract: nnx.State, values: Mapping[str, Any]) -> nnx.State:
    """A copy of the abstract `nnx.State` with its leaves replaced by restored arrays."""
    state = jax.tree.map(lambda x: x, abstract)  # a new State; the abstract one stays as it is
    nnx.replace_by_pure_dict(state, values)
    return state


def _jsonable(value: Any) -> Any:
    """Metadata as JSON values: dataclasses (e.g. TransformerConfig) become dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    try:
        return float(value)  # numpy and jax scalars
    except (TypeError, ValueError):
        raise TypeError(
            f"Checkpoint metadata must be JSON-serializable; got {type(value).__name__}: "
            f"{value!r}."
        ) from None


def dumps_metadata(metadata: Mapping[str, Any]) -> str:
    """The metadata as the JSON text stored with a checkpoint (for model cards, logs)."""
    return json.dumps(_jsonable(metadata), indent=2, sort_keys=True)
