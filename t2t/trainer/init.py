"""A run's state (`TrainState`) and where it comes from: `init_or_restore` restores the model
directory's latest intact checkpoint, or makes the first state when there is none: random
initialization, or the parameters of a HF T5 directory or another run (`sources`), with a fresh
optimizer state.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Iterator
from typing import Any

import jax
import optax
from flax import nnx

from t2t import files, hosts
from t2t import nn as t2t_nn
from t2t.checkpoints import released
from t2t.checkpoints.manager import (
    DAMAGED_SUBDIR,
    CheckpointManager,
    CorruptCheckpointError,
)
from t2t.errors import UserError
from t2t.finetuning import FineTuning, depths_of_config
from t2t.nn.config import TransformerConfig
from t2t.partitioning import Partitioner
from t2t.trainer import monitors, optimizer_state, sources
from t2t.trainer.sources import load_params

# How to train from step 0 on purpose in a directory whose checkpoints are all damaged.
_START_OVER_HINT = (
    "To train from step 0 on purpose, rerun with --start_over (t2t train) or bind "
    "t2t.runs.CheckpointOptions.start_over = True; to keep {0} as it is, give MODEL_DIR a new "
    "directory."
)


def fresh_watches() -> dict[str, monitors.Watch]:
    return {"early_stopping": monitors.Watch(), "reduce_on_plateau": monitors.Watch()}


@dataclasses.dataclass
class TrainState:
    """What a run trains and resumes from. `init_or_restore` makes it; the trainer advances it
    and saves it with every checkpoint (the counters and watches in the metadata)."""

    params: nnx.State
    """The parameters, each array in its shards."""
    opt_state: Any
    """The optimizer's state for `params`, in the same shards."""
    step: int = 0
    """Updates made so far."""
    tokens_seen: int = 0
    """Non-padding target tokens trained on so far."""
    examples_seen: int = 0
    """Examples trained on so far (packed rows count each example they hold)."""
    watches: dict[str, monitors.Watch] = dataclasses.field(default_factory=fresh_watches)
    """What early stopping and reduce-on-plateau have seen."""
    stopped_early: int | None = None
    """The step early stopping ended the run at; such a run stays stopped."""
    origin: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Where the state came from: {"kind": "resume", "step": ...}, "random", "hf" or "t2t"."""


def optimizer_for(
    tx: optax.GradientTransformation,
    config: TransformerConfig,
    finetuning: FineTuning,
    reduce_on_plateau: monitors.ReduceOnPlateau | None = None,
) -> optax.GradientTransformation:
    """`tx` as the run applies it: wrapped by the fine-tuning method (frozen groups, gradual
    unfreezing, layer-wise rates) and, with reduce-on-plateau, followed by its scale."""
    tx = finetuning.wrap(tx, depths_of_config(config))
    if reduce_on_plateau is not None:
        tx = optax.chain(tx, monitors.scale_by_plateau())
    return tx


def init_or_restore(
    manager: CheckpointManager,
    config: TransformerConfig,
    tx: optax.GradientTransformation,
    partitioner: Partitioner,
    *,
    train_data: Iterator | None = None,
    init_checkpoint: str | None = None,
    init_optimizer_state: bool = False,
    finetuning: FineTuning | None = None,
    seed: int = 0,
    start_over: bool = False,
    abstract_params: nnx.State | None = None,
) -> TrainState:
    """The state a run starts from, every array created or restored directly in its shards.

    With a checkpoint in `manager`'s directory: its latest intact one (parameters, optimizer
    state, counters, and `train_data`'s position when it can be saved), damaged newer ones set
    aside in `damaged_checkpoints/` with a message. Without: the parameters of
    `init_checkpoint` (a HF T5 directory or a t2t model directory) or a random initialization
    from `seed`, and a fresh optimizer state.

    Args:
      manager: the model directory's checkpoints.
      config: the run's network.
      tx: the optimizer as the run applies it (`optimizer_for`).
      partitioner: the run's mesh and sharding rules.
      train_data: the run's input pipeline; restored to its saved position when it has
        `save` and `restore` (an `InputPipeline`).
      init_checkpoint: where the first parameters come from when the directory has none.
      init_optimizer_state: take `init_checkpoint`'s Adafactor slots and step as well (a
        released checkpoint: `optimizer_state.import_slots`).
      finetuning: the fine-tuning method (its re-initialized groups and prompt init).
      seed: seeds the random initialization.
      start_over: train from step 0 although the directory once held checkpoints that are
        all damaged.
      abstract_params: `abstract_model(config, partitioner, seed)` when the caller has it.

    Raises:
      UserError: every checkpoint the directory holds, or held, is damaged (and `start_over`
        does not ask to start from step 0 regardless).
    """
    finetuning = finetuning or FineTuning()
    if abstract_params is None:
        abstract_params = abstract_model(config, partitioner, seed)
    latest = manager.latest_step()
    if latest is None and not start_over:
        _refuse_silent_restart(manager)
    if latest is not None:
        return _restore(manager, abstract_params, tx, partitioner, train_data)
    params, origin = _first_params(
        config, abstract_params, partitioner, init_checkpoint, finetuning, seed
    )
    opt_state = partitioner.init_optimizer(tx, params)
    if not init_optimizer_state:
        return TrainState(params, opt_state, origin=origin)
    opened = _released_source(init_checkpoint)
    with partitioner.context():
        opt_state = optimizer_state.import_slots(opt_state, opened)
    return TrainState(
        params, opt_state, step=opened.step, origin={**origin, "optimizer_state": True}
    )


def _released_source(init_checkpoint: str | None) -> released.Released:
    """The released checkpoint whose optimizer state a run continues."""
    if init_checkpoint is None:
        raise UserError("init_optimizer_state = True needs an init_checkpoint to take it from.")
    path, step = sources.resolve(init_checkpoint)
    kind = sources.checkpoint_kind(path)
    if kind not in released.FORMATS:
        raise UserError(
            f"init_optimizer_state takes a released checkpoint's Adafactor state (T5X, T5X on "
            f"Orbax, Mesh TensorFlow); {init_checkpoint} is a {kind} checkpoint, whose "
            "optimizer state t2t does not import. Leave init_optimizer_state unset."
        )
    return released.open_checkpoint(path, step)


def _first_params(
    config: TransformerConfig,
    abstract_params: nnx.State,
    partitioner: Partitioner,
    init_checkpoint: str | None,
    finetuning: FineTuning,
    seed: int,
) -> tuple[nnx.State, dict]:
    """A fresh run's parameters and their origin: `init_checkpoint`'s, or random from `seed`."""
    if init_checkpoint:
        return load_params(
            init_checkpoint,
            config,
            abstract_params,
            partitioner=partitioner,
            reinit=finetuning.reinit,
            seed=seed,
            prompt_init=finetuning.prompt_init,
        )
    module = partitioner.init_model(lambda: t2t_nn.build(config, nnx.Rngs(params=seed)))
    return nnx.split(module)[1], {"kind": "random", "seed": seed}


def abstract_model(config: TransformerConfig, partitioner: Partitioner, seed: int) -> nnx.State:
    """The parameters' shapes, dtypes and shardings, nothing allocated."""
    return partitioner.abstract_model(lambda: t2t_nn.build(config, nnx.Rngs(params=seed)))[1]


def abstract_of(tree: Any) -> Any:
    """Shapes, dtypes and shardings of a tree of arrays (what compiling a step needs)."""
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _restore(manager, abstract_params, tx, partitioner, train_data) -> TrainState:
    savable = hasattr(train_data, "save") and hasattr(train_data, "restore")
    try:
        restored = manager.restore(
            abstract_params=abstract_params,
            abstract_opt_state=partitioner.abstract_optimizer(tx, abstract_params),
            data_iterator=train_data if savable else None,
            on_damaged=lambda error: _set_aside(manager, error),
        )
    except CorruptCheckpointError as error:
        if error.item != "every checkpoint":
            raise
        raise UserError(f"{error} {_START_OVER_HINT.format(manager.model_dir)}") from None
    if restored.skipped and jax.process_index() == 0:
        print(
            f"Resuming from step {restored.step}, the newest intact checkpoint.",
            file=sys.stderr,
            flush=True,
        )
    seen = restored.metadata
    return TrainState(
        restored.params,
        restored.opt_state,
        step=restored.step,
        tokens_seen=int(seen.get("tokens_seen", 0)),
        examples_seen=int(seen.get("examples_seen", 0)),
        watches={
            **fresh_watches(),
            **{k: monitors.Watch(**v) for k, v in seen.get("watches", {}).items()},
        },
        stopped_early=seen.get("stopped_early"),
        origin={"kind": "resume", "step": restored.step},
    )


def _refuse_silent_restart(manager: CheckpointManager) -> None:
    """Raises UserError when the directory once held checkpoints and none is intact now."""
    model_dir = manager.model_dir
    damaged = files.join(model_dir, DAMAGED_SUBDIR)
    held = files.listdir(damaged) if files.isdir(damaged) else []
    if held:
        raise UserError(
            f"{model_dir} has no intact checkpoint: the ones it held are damaged and were set "
            f"aside in {damaged} ({', '.join(held)}). Training now would start over from step "
            f"0. {_START_OVER_HINT.format(model_dir)}"
        )


def _set_aside(manager: CheckpointManager, error: CorruptCheckpointError) -> None:
    """Moves a damaged checkpoint out of the way of this run's saves (kept, not deleted)."""
    if jax.process_index() == 0:
        path = manager.set_aside(error.step)
        print(f"{error}\nMoved it to {path}.", file=sys.stderr, flush=True)
    if jax.process_count() > 1:
        hosts.agree(f"set aside step {error.step}", "")
        manager.reload()
