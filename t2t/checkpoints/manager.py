"""Orbax checkpoints of a training run, with the input pipeline's position, written atomically.

Each checkpoint is a step directory `<model_dir>/checkpoints/<step>/` holding four items:

  params         the network parameters (an `nnx.State`, stored as a dict of arrays)
  opt_state      the optimizer state
  data_iterator  every host's input-pipeline position, so a resumed run reads exactly the batches
                 an uninterrupted run would have read
  metadata       JSON: the step, the `TransformerConfig`, and whatever the trainer adds

On a disk Orbax writes a step into a temporary directory and renames it into place only when
every item is complete; on an object store (gs://), which has no rename, it writes the step in
place and `commit_success.txt` last, and a step counts only with it. Either way a crash in the
middle of a save leaves the earlier checkpoints untouched and the half-written one is never
mistaken for a checkpoint (it is cleaned up on the next start). A save the file system has no
room for raises `CheckpointWriteError`, saying what is kept.
Every checkpoint carries checksums of its arrays and data-iterator files (`integrity`), checked
on every restore: a damaged checkpoint raises `CorruptCheckpointError` naming what differs, and
`restore()` of the latest step falls back to the newest intact one, saying so.
Retention keeps the last `keep` steps and, for every tracked metric, the best step by that metric.
Restores take abstract targets carrying shardings, so a checkpoint written on one mesh restores
straight into the shards of another.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from t2t import files
from t2t.checkpoints import integrity
from t2t.checkpoints.integrity import CorruptCheckpointError  # noqa: F401 (re-exported)
from t2t.nn.config import TransformerConfig

CHECKPOINTS_SUBDIR = "checkpoints"
DAMAGED_SUBDIR = "damaged_checkpoints"  # where a training run moves checkpoints that fail checks
SET_ASIDE_RECORD = "SET_ASIDE.json"  # in a step set aside on an object store: the copy is whole
_COMMIT_MARKER = "commit_success.txt"  # Orbax's sign of a finished step on an object store
_ITEMS = ("params", "opt_state", "data_iterator", "metadata")


class _ReportedByTheCaller(logging.Filter):
    """Orbax logs an error of its background save thread, traceback and all, then raises it to
    the caller (`CheckpointManager.save`, `wait_until_finished`), which reports it: once is
    enough."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (
            record.levelno >= logging.ERROR
            and "_SignalingThread.run() raised an exception" in str(record.msg)
        )


logging.getLogger("absl").addFilter(_ReportedByTheCaller())


class SavableIterator(Protocol):
    """What the manager needs of an input pipeline (`t2t.data.pipeline.InputPipeline` has it)."""

    def save(self, directory: str) -> Any: ...

    def restore(self, directory: str) -> None: ...


# -- the data-iterator item ----------------------------------------------------------------------


class DataIteratorHandler(ocp.CheckpointHandler):
    """Saves and restores each host's input-pipeline position in its own subdirectory."""

    def save(self, directory: epath.Path, args: DataIteratorSave) -> None:
        path = os.fspath(directory / f"process_{jax.process_index()}")
        args.iterator.save(path)
        integrity.write_file_digests(path)  # after the files: the digests vouch for them

    def restore(self, directory: epath.Path, args: DataIteratorRestore) -> SavableIterator:
        path = directory / f"process_{jax.process_index()}"
        if path.exists():
            damaged = integrity.verify_file_digests(os.fspath(path))
            if damaged:
                raise _DamagedIterator(
                    f"data-iterator files of process {jax.process_index()} differ from their "
                    f"checksums: {', '.join(damaged)}"
                )
        if not path.exists():
            raise MissingIteratorStateError(
                f"The checkpoint at {directory} holds no data-iterator state for process "
                f"{jax.process_index()} (expected {path}). It was written by a run with fewer "
                "hosts; restore without the data iterator (restore_data=False) to start the "
                "input pipeline afresh."
            )
        args.iterator.restore(os.fspath(path))
        return args.iterator


class _DamagedIterator(ValueError):
    """Raised inside the data-iterator handler; the manager reports it with the step."""


class MissingIteratorStateError(ValueError):
    """The checkpoint was written by fewer hosts than restore it (not damage: no fallback)."""


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
    skipped: list[CorruptCheckpointError] = dataclasses.field(default_factory=list)


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
        # NOTE: Orbax's array writers reject relative paths (`make demo` passes runs/demo).
        path = files.absolute(model_dir)
        self.model_dir = path
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
        self._options = options
        self._manager = self._open()
        self._saving: int | None = None  # the step of the latest save begun

    def _open(self) -> ocp.CheckpointManager:
        return ocp.CheckpointManager(
            self.directory,
            options=self._options,
            item_names=_ITEMS,
            # NOTE: the array handlers are named so that `item_metadata` can read the saved
            # shapes (to refuse another network's checkpoint before reading any array).
            item_handlers={
                "data_iterator": DataIteratorHandler(),
                "params": ocp.StandardCheckpointHandler(),
                "opt_state": ocp.StandardCheckpointHandler(),
            },
        )

    # -- queries -------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def reload(self) -> None:
        """Re-reads which steps exist (after another process changed the directory)."""
        self._manager.reload()

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
        one after the batches of `step` were consumed. The metadata gains `checksums`, the
        fingerprints of every array saved (`integrity`).
        """
        pure = nnx.to_pure_dict(params)
        checksums = {"algorithm": integrity.ALGORITHM, "params": integrity.fingerprints(pure)}
        if opt_state is not None:
            checksums["opt_state"] = integrity.fingerprints(opt_state)
        items: dict[str, ocp.args.CheckpointArgs] = {
            "params": ocp.args.StandardSave(pure),
            "metadata": ocp.args.JsonSave(
                _jsonable({"step": step, **(metadata or {}), "checksums": checksums})
            ),
        }
        if opt_state is not None:
            items["opt_state"] = ocp.args.StandardSave(opt_state)
        if data_iterator is not None:
            items["data_iterator"] = DataIteratorSave(data_iterator)
        self._saving = step
        try:
            saved = self._manager.save(
                step,
                args=ocp.args.Composite(**items),
                metrics=None if metrics is None else {k: float(v) for k, v in metrics.items()},
                force=True,
            )
        except Exception as error:  # noqa: BLE001 (a full disk is said; anything else raised)
            raise self._no_room(error) from error
        if not saved:
            logging.warning("Orbax skipped the checkpoint of step %d.", step)

    def is_saving_in_progress(self) -> bool:
        """Whether an asynchronous save has not been committed yet."""
        return self._manager.is_saving_in_progress()

    def wait_until_finished(self) -> None:
        """Blocks until every pending asynchronous save is on disk.

        Raises:
          CheckpointWriteError: the save could not be written for want of room.
        """
        try:
            self._manager.wait_until_finished()
        except Exception as error:  # noqa: BLE001 (a full disk is said; anything else raised)
            raise self._no_room(error) from error

    def _no_room(self, error: Exception) -> Exception:
        """`error` itself, or a CheckpointWriteError when the file system had no room for it."""
        why = files.out_of_room(error)
        if why is None:
            return error
        with contextlib.suppress(Exception):
            self._manager.reload()
        return CheckpointWriteError(self.directory, self._saving, why, self.all_steps())

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
        on_damaged: Callable[[CorruptCheckpointError], None] | None = None,
    ) -> Restored:
        """Restores `step` (default: the newest intact checkpoint) into the given abstract targets.

        Every array read is checked against the checksums saved with it. With `step=None`, a
        checkpoint that cannot be read or fails its checks is skipped for the one before it (a
        warning names what was damaged, and `on_damaged` is called with the error); the skipped
        ones are listed in `Restored.skipped`.

        Args:
          step: the step to restore; None for the newest intact one.
          abstract_params: the parameter state as `jax.ShapeDtypeStruct`s carrying shardings
            (`Partitioner.abstract_model`); arrays are read straight into those shards.
          abstract_opt_state: the same for the optimizer state; None to skip it (fine-tuning
            from a pretrained checkpoint, evaluation).
          data_iterator: a freshly built input pipeline to move to the saved position; None to
            skip it.
          on_damaged: called with each damaged checkpoint skipped (e.g. to move it aside).

        Raises:
          FileNotFoundError: when there is no checkpoint (at `step`).
          CorruptCheckpointError: `step` (or, for None, every checkpoint) is damaged.
          IncompatibleCheckpointError: the checkpoint holds another network's arrays.
        """
        if step is not None:
            return self._restore_step(
                self._resolve_step(step), abstract_params, abstract_opt_state, data_iterator
            )
        return self._restore_newest(abstract_params, abstract_opt_state, data_iterator, on_damaged)

    def _restore_newest(
        self,
        abstract_params: nnx.State,
        abstract_opt_state: Any,
        data_iterator: SavableIterator | None,
        on_damaged: Callable[[CorruptCheckpointError], None] | None,
    ) -> Restored:
        """The newest checkpoint that restores intact, the damaged ones after it skipped."""
        candidates = self.all_steps()
        if not candidates:
            raise FileNotFoundError(f"No checkpoint under {self.directory}.")
        skipped: list[CorruptCheckpointError] = []
        for candidate in reversed(candidates):
            try:
                restored = self._restore_step(
                    candidate, abstract_params, abstract_opt_state, data_iterator
                )
            except CorruptCheckpointError as error:
                skipped.append(error)
                if on_damaged is not None:
                    on_damaged(error)
                else:
                    logging.warning("%s Trying the checkpoint before it.", error)
                continue
            if skipped and on_damaged is None:
                logging.warning(
                    "Restored step %d instead (skipped damaged steps %s).",
                    candidate,
                    [e.step for e in skipped],
                )
            restored.skipped = skipped
            return restored
        raise CorruptCheckpointError(
            os.fspath(self.directory),
            skipped[0].step,
            "every checkpoint",
            "no intact checkpoint is left: "
            + "; ".join(f"step {e.step} ({e.item}: {e.detail})" for e in skipped),
        )

    def _restore_step(
        self,
        step: int,
        abstract_params: nnx.State,
        abstract_opt_state: Any,
        data_iterator: SavableIterator | None,
    ) -> Restored:
        metadata = self.read_metadata(step)
        targets = {"params": nnx.to_pure_dict(abstract_params)}
        if abstract_opt_state is not None:
            targets["opt_state"] = abstract_opt_state
        self._check_shapes(step, targets)
        items: dict[str, ocp.args.CheckpointArgs] = {
            name: ocp.args.StandardRestore(target) for name, target in targets.items()
        }
        if data_iterator is not None:
            items["data_iterator"] = DataIteratorRestore(data_iterator)
        try:
            with _quiet_abandoned_reads():
                restored = self._manager.restore(step, args=ocp.args.Composite(**items))
        except _DamagedIterator as error:
            raise self._damaged(step, "data_iterator", str(error)) from error
        except MissingIteratorStateError:
            raise
        except Exception as error:  # noqa: BLE001
            if _ITERATOR_MISMATCH in str(error):  # intact, but another input pipeline's state
                raise IncompatibleDataPipelineError(os.fspath(self.directory), step) from error
            # What is left after the shape check is unreadable data; TensorStore raises bare
            # Exceptions for it (a truncated file), Orbax KeyErrors for missing entries.
            raise self._damaged(step, _item_of(error, items), _first_line(error)) from error
        expected = metadata.get("checksums") or {}
        for name in targets:
            if name in expected:
                wrong = integrity.mismatches(expected[name], restored[name])
                if wrong:
                    raise self._damaged(step, name, integrity.describe(wrong))
        return Restored(
            step=step,
            params=_fill(abstract_params, restored["params"]),
            opt_state=restored["opt_state"] if abstract_opt_state is not None else None,
            metadata=metadata,
        )

    def _check_shapes(self, step: int, targets: Mapping[str, Any]) -> None:
        """Refuses, before reading any array, a checkpoint of another network or optimizer."""
        try:
            with _quiet_abandoned_reads():
                saved = self._manager.item_metadata(step)
        except Exception as error:  # noqa: BLE001 (an unreadable item: damage)
            item = _item_of(error, _ITEMS)
            raise self._damaged(
                step, "array metadata" if item == "arrays" else item, _first_line(error)
            ) from error
        for name, target in targets.items():
            item = saved.get(name) if hasattr(saved, "get") else None
            if item is None:
                raise self._damaged(step, name, "the item is missing")
            tree = getattr(item, "tree", item)
            have = {
                integrity.leaf_name(p): tuple(x.shape)
                for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
                if hasattr(x, "shape")
            }
            want = {
                integrity.leaf_name(p): tuple(x.shape)
                for p, x in jax.tree_util.tree_flatten_with_path(target)[0]
                if hasattr(x, "shape")
            }
            if have != want:
                raise IncompatibleCheckpointError(os.fspath(self.directory), step, name, have, want)

    def _damaged(self, step: int, item: str, detail: str) -> CorruptCheckpointError:
        return CorruptCheckpointError(os.fspath(self.directory), step, item, detail)

    def read_metadata(self, step: int | None = None) -> dict[str, Any]:
        """The metadata JSON of `step` (default: the latest), without reading any array."""
        step = self._resolve_step(step)
        args = ocp.args.Composite(metadata=ocp.args.JsonRestore())
        try:
            with _quiet_abandoned_reads():
                restored = self._manager.restore(step, args=args)
            metadata = restored["metadata"]
        except Exception as error:  # noqa: BLE001 (missing or unparsable JSON: damage)
            raise self._damaged(step, "metadata", _first_line(error)) from error
        if not isinstance(metadata, Mapping):
            raise self._damaged(step, "metadata", f"expected a JSON object, read {metadata!r}")
        return dict(metadata)

    # -- integrity -----------------------------------------------------------------------------

    def verify(self, step: int) -> tuple[str, list[str]]:
        """Reads every array and file of `step` and checks them against their checksums.

        Arrays are read one item at a time onto the host's first device, in the shapes and
        dtypes they were saved with, so no model or optimizer configuration is needed.

        Returns:
          ("ok" | "damaged" | "unverified", problems): "unverified" for a checkpoint written
          without checksums (by an older t2t) that reads without error.
        """
        try:
            metadata = self.read_metadata(step)
            with _quiet_abandoned_reads():
                saved = self._manager.item_metadata(step)
        except CorruptCheckpointError as error:
            return "damaged", [f"{error.item}: {error.detail}"]
        except Exception as error:  # noqa: BLE001
            item = _item_of(error, _ITEMS)
            return "damaged", [
                f"{'array metadata' if item == 'arrays' else item}: {_first_line(error)}"
            ]
        checksums = metadata.get("checksums") or {}
        problems = []
        for name in ("params", "opt_state"):
            item = saved.get(name)
            if item is None:
                if name == "params" or name in checksums:
                    problems.append(f"{name}: the item is missing")
                continue
            problem = self._verify_item(step, name, item, checksums.get(name))
            if problem:
                problems.append(f"{name}: {problem}")
        problems += self._verify_iterators(step)
        if problems:
            return "damaged", problems
        return ("ok" if checksums else "unverified"), []

    def _verify_item(self, step: int, name: str, item: Any, checksums: Any) -> str | None:
        """What is wrong with array item `name` of `step` (read on the first CPU), or None."""
        device = jax.local_devices(backend="cpu")[0]
        target = jax.tree.map(
            lambda a: jax.ShapeDtypeStruct(
                a.shape, a.dtype, sharding=jax.sharding.SingleDeviceSharding(device)
            ),
            getattr(item, "tree", item),
        )
        try:
            with _quiet_abandoned_reads():
                values = self._manager.restore(
                    step, args=ocp.args.Composite(**{name: ocp.args.StandardRestore(target)})
                )[name]
        except Exception as error:  # noqa: BLE001
            return _first_line(error)
        if checksums is not None:
            wrong = integrity.mismatches(checksums, values)
            if wrong:
                return integrity.describe(wrong)
        return None

    def _verify_iterators(self, step: int) -> list[str]:
        """The data-iterator folders of `step` whose files differ from their digests."""
        problems = []
        iterators = self.directory / str(step) / "data_iterator"
        if iterators.exists():
            for path in sorted(iterators.iterdir()):
                if path.is_dir():
                    damaged = integrity.verify_file_digests(os.fspath(path))
                    if damaged:
                        problems.append(
                            f"data_iterator/{path.name}: files differ from their "
                            f"checksums: {', '.join(damaged)}"
                        )
        return problems

    def set_aside(self, step: int) -> str:
        """Moves the checkpoint of `step` to `<model_dir>/damaged_checkpoints/<step>` (kept for
        inspection, out of the way of new saves); returns its new path.

        On a disk this is one rename. On an object store it is a copy, then the deletion of the
        original, commit marker first: stopped at any point and repeated, it ends with the step
        set aside once and gone from the checkpoints (a copy left unfinished, without its
        `SET_ASIDE` record, is finished by the next attempt, not duplicated).
        """
        source = files.join(os.fspath(self.directory), str(step))
        parent = files.join(files.parent(os.fspath(self.directory)), DAMAGED_SUBDIR)
        files.makedirs(parent)
        if files.is_remote(source) and not files.exists(files.join(source, _COMMIT_MARKER)):
            finished = self._set_aside_copy_of(source, parent)
            if finished is not None:  # an earlier move stopped after its copy: end it
                files.rmtree(source)
                self._manager.reload()
                return finished
        target, suffix = files.join(parent, str(step)), 1
        while files.exists(target) and (
            not files.is_remote(target) or files.exists(files.join(target, SET_ASIDE_RECORD))
        ):
            target = files.join(parent, f"{step}.{suffix}")
            suffix += 1
        if not files.is_remote(source):
            files.move(source, target)
        else:
            files.copytree(source, target)
            files.write_text(
                files.join(target, SET_ASIDE_RECORD),
                json.dumps({"step": step, "from": source, "time": time.time()}),
            )
            # Orbax counts a step on an object store as saved while its commit marker exists:
            # gone first, the step stops being a checkpoint before any of its files go.
            files.remove(files.join(source, _COMMIT_MARKER))
            files.rmtree(source)
        self._manager.reload()
        return target

    @staticmethod
    def _set_aside_copy_of(source: str, parent: str) -> str | None:
        """The newest whole copy in `parent` of the step at `source`, when one was made."""
        copies = []
        for name in files.listdir(parent):
            record = files.join(parent, name, SET_ASIDE_RECORD)
            if files.exists(record):
                made = json.loads(files.read_text(record))
                if made.get("from") == source:
                    copies.append((made.get("time", 0.0), files.join(parent, name)))
        return max(copies)[1] if copies else None

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


class CheckpointWriteError(OSError):
    """A checkpoint the file system had no room for (a full disk, the file-size limit)."""

    def __init__(self, directory, step: int | None, why: str, kept: list[int]):
        kept_text = (
            f"the checkpoints saved before it are intact (steps {kept}) and the run resumes from "
            f"step {kept[-1]}"
            if kept
            else "no checkpoint was saved before it, so the run starts from step 0"
        )
        super().__init__(
            f"Saving the checkpoint of step {step} in {directory} failed: {why}. Nothing of it "
            f"counts: {kept_text}. Make room (or raise the limit), then run the same command "
            "again."
        )
        self.step, self.kept = step, kept


class IncompatibleCheckpointError(ValueError):
    """A checkpoint whose arrays have other shapes than the network (or optimizer) restoring it."""

    def __init__(
        self,
        directory: str,
        step: int,
        item: str,
        saved: Mapping[str, tuple],
        wanted: Mapping[str, tuple],
    ):
        differ = sorted(k for k in set(saved) | set(wanted) if saved.get(k) != wanted.get(k))
        shown = "; ".join(
            f"{k}: {saved.get(k, 'absent')} in the checkpoint, {wanted.get(k, 'absent')} here"
            for k in differ[:3]
        )
        more = f" (and {len(differ) - 3} more)" if len(differ) > 3 else ""
        what = "network" if item == "params" else "optimizer"
        super().__init__(
            f"The checkpoint of step {step} in {directory} belongs to another {what}: {shown}"
            f"{more}. Resume with the configuration that wrote it (its model_config.json and "
            "config.gin are beside it), or give a new MODEL_DIR; to start a new run from its "
            "parameters, use INIT_CHECKPOINT."
        )
        self.step, self.item = step, item


# tf.data's words when a saved iterator does not fit the dataset restoring it.
_ITERATOR_MISMATCH = "Failed to restore dataset iterator"


class IncompatibleDataPipelineError(ValueError):
    """An intact checkpoint whose saved input-pipeline position does not fit this run's
    pipeline (another objective, preprocessing or t2t version changed the tf.data graph)."""

    def __init__(self, directory: str, step: int):
        super().__init__(
            f"The checkpoint of step {step} in {directory} is intact, but its saved data position "
            "does not fit this run's input pipeline (tf.data says the dataset definition "
            "changed: another objective, preprocessing, or a t2t version that builds it "
            "differently). Resume with the configuration and version that wrote it, or start a "
            "new MODEL_DIR from its parameters with INIT_CHECKPOINT. Nothing was moved."
        )
        self.step = step


def _first_line(error: BaseException) -> str:
    """An Orbax/TensorStore error in one line, naming the array when TensorStore's spec does."""
    text = str(error).strip() or type(error).__name__
    line = text.splitlines()[0].split(" See full TensorStore details")[0]
    named = re.findall(r"'path': '([^'/][^']*?)/?'", text)  # the array's key in the store
    return (f"array {named[-1]!r}: " if named else "") + line[:400]


@contextlib.contextmanager
def _quiet_abandoned_reads():
    """Lets a failed restore end quietly. When one array read fails, Orbax closes its event loop
    while the other reads are in flight; their TensorStore callbacks then print "Event loop is
    closed" tracebacks from background threads (hundreds of lines for one damaged file) and
    their coroutines "Exception ignored" reports. Here a failed run first waits for the reads
    it started, so the one clear error raised instead is all the user sees.
    """
    from orbax.checkpoint._src import asyncio_utils

    original = getattr(asyncio_utils, "_run_sync_via_new_loop", None)
    if original is None:  # NOTE: an Orbax without this helper: nothing to patch
        yield
        return

    def run_draining(coro):
        loop = asyncio.new_event_loop()
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(coro)
        except BaseException:
            pending = asyncio.all_tasks(loop)
            if pending:
                loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            raise
        finally:
            asyncio.set_event_loop(None)
            loop.close()

    asyncio_utils._run_sync_via_new_loop = run_draining
    try:
        yield
    finally:
        asyncio_utils._run_sync_via_new_loop = original


def _item_of(error: BaseException, items: Mapping[str, Any]) -> str:
    """Which item an Orbax/TensorStore error was about, when its message names the path."""
    text = str(error)
    for name in items:
        if f"/{name}/" in text or f"/{name}'" in text or f'"{name}"' in text:
            return name
    return "arrays"


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
            f"Checkpoint metadata must be JSON-serializable; got {type(value).__name__}: {value!r}."
        ) from None


def dumps_metadata(metadata: Mapping[str, Any]) -> str:
    """The metadata as the JSON text stored with a checkpoint (for model cards, logs)."""
    return json.dumps(_jsonable(metadata), indent=2, sort_keys=True)
