"""Decisions taken on a validation metric: early stopping and reducing the rate on a plateau.

The companion studies of the T5 paper fine-tune with early stopping on a validation metric, and
many recipes lower the learning rate when that metric stops improving. Both watch one metric of
the trainer's evaluations (`Trainer.evaluate`'s keys, e.g. "builtin_package/accuracy"):

- `EarlyStopping(metric, mode, patience)`: training stops after `patience` evaluations in a row
  without an improvement of more than `min_delta`; the best checkpoint is kept.
- `ReduceOnPlateau(metric, mode, patience, factor)`: after `patience` evaluations without
  improvement the updates are multiplied by `factor` (down to `min_scale`), then the count
  starts again after `cooldown` evaluations.

The watchers' counts live in each checkpoint's metadata and the rate multiplier in the optimizer
state (`scale_by_plateau`), so a resumed run decides exactly as an uninterrupted one would.

Example (mode "max", patience 2): accuracies 0.50, 0.60, 0.58, 0.61, 0.59, 0.60 -> best 0.61 at
the 4th evaluation; the 5th and 6th do not improve on it, so training stops after the 6th.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

MODES = ("max", "min")


@dataclasses.dataclass(frozen=True)
class EarlyStopping:
    """Stop after `patience` evaluations without improving `metric`.

    Attributes:
      metric: an evaluation key, e.g. "builtin_package/accuracy" or "glue_rte/loss".
      mode: "max" (higher is better) or "min".
      patience: evaluations without improvement before stopping.
      min_delta: the least change that counts as an improvement.
    """

    metric: str
    mode: str = "max"
    patience: int = 3
    min_delta: float = 0.0

    def __post_init__(self):
        _check(self, "EarlyStopping")

    def decide(self, watch: Watch, step: int, value: float) -> Decision:
        """Records one evaluation in `watch`; stop once `patience` of them in a row did not
        improve on the best."""
        best = watch.observe(step, value, self)
        if watch.since_best < self.patience:
            return Decision(best=best)
        return Decision(
            best=best,
            stop=True,
            note=f"stopping early, {self.metric} has not improved for {self.patience} "
            f"evaluations; best {watch.best:.4g} at step {watch.best_step} (checkpoint kept)",
        )


@dataclasses.dataclass(frozen=True)
class ReduceOnPlateau:
    """Multiply the updates by `factor` after `patience` evaluations without improvement.

    Attributes:
      metric, mode, patience, min_delta: as in `EarlyStopping`.
      factor: the multiplier applied at each plateau, in (0, 1).
      min_scale: the smallest overall multiplier.
      cooldown: evaluations after a reduction before counting again.
    """

    metric: str
    mode: str = "max"
    patience: int = 2
    min_delta: float = 0.0
    factor: float = 0.5
    min_scale: float = 1e-3
    cooldown: int = 0

    def __post_init__(self):
        _check(self, "ReduceOnPlateau")
        if not 0 < self.factor < 1:
            raise ValueError(f"ReduceOnPlateau.factor must be in (0, 1), got {self.factor!r}.")
        if not 0 < self.min_scale <= 1:
            raise ValueError(
                f"ReduceOnPlateau.min_scale must be in (0, 1], got {self.min_scale!r}."
            )

    def decide(self, watch: Watch, step: int, value: float, scale: float) -> Decision:
        """Records one evaluation in `watch`; after `patience` of them in a row without
        improvement (and no cooldown left), the update scale goes from `scale` to
        `max(scale * factor, min_scale)` and the cooldown starts."""
        if watch.observe(step, value, self):
            return Decision(best=True)
        if watch.cooling:
            watch.cooling, watch.since_best = watch.cooling - 1, 0
            return Decision(best=False)
        if watch.since_best < self.patience:
            return Decision(best=False)
        new = max(scale * self.factor, self.min_scale)
        watch.cooling, watch.since_best = self.cooldown, 0
        return Decision(
            best=False,
            scale=new,
            note=f"{self.metric} has not improved on {watch.best:.4g} for {self.patience} "
            f"evaluations; update scale {scale:.3g} -> {new:.3g}",
        )


def _check(watcher, name: str) -> None:
    if watcher.mode not in MODES:
        raise ValueError(f"{name}.mode must be 'max' or 'min', got {watcher.mode!r}.")
    if not isinstance(watcher.patience, int) or watcher.patience < 1:
        raise ValueError(f"{name}.patience must be a positive int, got {watcher.patience!r}.")


@dataclasses.dataclass
class Watch:
    """What a watcher has seen: the best value, where, and evaluations since an improvement."""

    best: float | None = None
    best_step: int | None = None
    since_best: int = 0
    cooling: int = 0

    def improves(self, value: float, watcher) -> bool:
        if self.best is None:
            return True
        if watcher.mode == "max":
            return value > self.best + watcher.min_delta
        return value < self.best - watcher.min_delta

    def observe(self, step: int, value: float, watcher) -> bool:
        """Records one evaluation; returns whether it is the best so far."""
        if self.improves(value, watcher):
            self.best, self.best_step, self.since_best = value, step, 0
            return True
        self.since_best += 1
        return False


@dataclasses.dataclass(frozen=True)
class Decision:
    """What a watcher makes of one evaluation.

    Attributes:
      best: the evaluation is the best so far (its checkpoint is worth keeping).
      stop: training stops here (`EarlyStopping`).
      scale: the new update scale (`ReduceOnPlateau`), None when it stays.
      note: what to tell the person watching, None when nothing happened.
    """

    best: bool
    stop: bool = False
    scale: float | None = None
    note: str | None = None


def metric_value(results: dict[str, float], watcher) -> float:
    """The watched metric of one evaluation.

    Raises:
      ValueError: when the evaluation has no such key (listing the keys it has).
    """
    if watcher.metric not in results:
        raise ValueError(
            f"{type(watcher).__name__} watches {watcher.metric!r}, which the evaluation does "
            f"not report; it reports {sorted(results)}. Name one of those (eval tasks give "
            "<task>/loss and <task>/token_accuracy, evaluators the task metrics, e.g. "
            "<task>/accuracy)."
        )
    return float(results[watcher.metric])


# -- the rate multiplier in the optimizer state ----------------------------------------------------


class PlateauScale(NamedTuple):
    """The multiplier `ReduceOnPlateau` has set (1 until the first plateau)."""

    scale: jax.Array  # float32 []


def scale_by_plateau() -> optax.GradientTransformation:
    """Multiplies every update by the state's `scale`, which the trainer lowers on plateaus."""

    def init(params):
        del params
        return PlateauScale(jnp.ones((), jnp.float32))

    def update(updates, state, params=None):
        del params
        return jax.tree.map(lambda u: (u * state.scale).astype(u.dtype), updates), state

    return optax.GradientTransformation(init, update)


def _is_plateau(x: Any) -> bool:
    return isinstance(x, PlateauScale)


def plateau_scale(opt_state: Any) -> float | None:
    """The current multiplier in an optimizer state (None: no `scale_by_plateau` in it)."""
    found = [x for x in jax.tree.leaves(opt_state, is_leaf=_is_plateau) if _is_plateau(x)]
    return float(jax.device_get(found[0].scale)) if found else None


def with_plateau_scale(opt_state: Any, value: float) -> Any:
    """The optimizer state with the multiplier set to `value` (keeping its sharding)."""

    def replace(x):
        if not _is_plateau(x):
            return x
        sharding = getattr(x.scale, "sharding", None)
        new = jnp.asarray(value, jnp.float32)
        return PlateauScale(jax.device_put(new, sharding) if sharding is not None else new)

    return jax.tree.map(replace, opt_state, is_leaf=_is_plateau)
