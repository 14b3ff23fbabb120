"""How a fine-tuning run adapts a pretrained network: what trains, what starts afresh, and how
each layer's updates are scaled over time.

One frozen `FineTuning` holds the choices a run makes (gin binds it as
`t2t.runs.train.finetuning = @t2t.finetuning.FineTuning()`; the files in `gin/finetuning/` set
it for each method of the paper):

- `trainable` / `frozen`: parameter groups or path regexes (`t2t.finetuning.groups`). Frozen
  parameters get zero updates and, when wholly frozen, no optimizer state.
- `reinit`: groups initialized randomly instead of loaded from the checkpoint (feature
  extraction with a new decoder).
- `unfreeze_every`: gradual unfreezing (paper section 3.5.1): training is split into episodes of
  this many steps; in episode e the top e + 1 layers of every stack train (encoder and decoder
  in parallel), and the embeddings, final norms and output projection train throughout.
- `layer_decay`: discriminative learning rates (Howard and Ruder, 2018): the updates of layer i
  of a stack of n layers are scaled by `layer_decay ** (n - 1 - i)`.
- `prompt_init`: how a new soft prompt starts ("vocabulary": copies of the embeddings of
  sampled vocabulary tokens, Lester et al.'s best; "random": the module's normal init).

The optimizer wrapping (`wrap`) is an `optax` composition: `optax.multi_transform` over the
labels trainable / frozen / partial (stacked layers trained in part), and a per-parameter,
per-step update scale for the layer methods. Every mask and scale is a function of the
parameter's path and shape, so the same run works in the scanned and unscanned layouts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from t2t.finetuning import groups

TRAINABLE, FROZEN, PARTIAL = "trainable", "frozen", "partial"
PROMPT_INITS = ("vocabulary", "random")


@dataclasses.dataclass(frozen=True)
class FineTuning:
    """The fine-tuning method of a run (see the module docstring).

    Attributes:
      trainable: specs of what trains (None: everything not `frozen`).
      frozen: specs of what does not train, applied after `trainable`.
      reinit: specs of parameters initialized randomly (with the run's seed) instead of taken
        from the initial checkpoint.
      unfreeze_every: steps per gradual-unfreezing episode (None: off).
      layer_decay: xi of layer-wise learning rates (None: off).
      prompt_init: "vocabulary" or "random" (a soft prompt's start).
    """

    trainable: Sequence[str] | None = None
    frozen: Sequence[str] = ()
    reinit: Sequence[str] = ()
    unfreeze_every: int | None = None
    layer_decay: float | None = None
    prompt_init: str = "vocabulary"

    def __post_init__(self):
        for name in ("trainable", "frozen", "reinit"):
            value = getattr(self, name)
            if value is not None:
                groups.check_specs(value, f"FineTuning.{name}")
                object.__setattr__(self, name, tuple(value))
        if self.unfreeze_every is not None and (
            not isinstance(self.unfreeze_every, int) or self.unfreeze_every < 1
        ):
            raise ValueError(
                f"FineTuning.unfreeze_every must be a positive number of steps or "
                f"None, got {self.unfreeze_every!r}."
            )
        if self.layer_decay is not None and not 0 < self.layer_decay <= 1:
            raise ValueError(
                f"FineTuning.layer_decay must be in (0, 1] or None (the paper-style "
                f"values are 0.8-0.95), got {self.layer_decay!r}."
            )
        if self.prompt_init not in PROMPT_INITS:
            raise ValueError(
                f"FineTuning.prompt_init must be one of {PROMPT_INITS}, got {self.prompt_init!r}."
            )

    @property
    def is_plain(self) -> bool:
        """Whether this is ordinary fine-tuning of every parameter."""
        return (
            self.trainable is None
            and not self.frozen
            and self.unfreeze_every is None
            and self.layer_decay is None
        )

    # -- what trains -------------------------------------------------------------------------

    def masks(self, params: Any, depths: Mapping[str, int] | None = None) -> Any:
        """A tree like `params`: True / False / [L] bool, whether (which layers of) each
        parameter trains at all (`groups.select`; `depths` default: read off `params`)."""
        depths = depths or groups.depths_of(params)
        specs = self.trainable if self.trainable is not None else ["all"]
        chosen = groups.select(params, specs, depths)
        if not self.frozen:
            return chosen
        return _and_not(chosen, groups.select(params, self.frozen, depths))

    def check(self, params: Any) -> None:
        """Raises ValueError for a spec that selects no parameter of this network (a typo, or a
        group the network lacks: adapters without `adapter_size`, an encoder of a decoder-only
        model)."""
        depths = groups.depths_of(params)
        for name in ("trainable", "frozen", "reinit"):
            for spec in getattr(self, name) or ():
                if not groups.count(params, groups.select(params, [spec], depths)):
                    raise ValueError(
                        f"FineTuning.{name}: {spec!r} selects no parameter of this network "
                        f"(stacks {depths}; additions need their config field: adapter_size "
                        "for 'adapters', lora_rank for 'lora', prompt_length for 'prompt')."
                    )

    def labels(self, params: Any, depths: Mapping[str, int] | None = None) -> Any:
        """The `optax.multi_transform` label of each parameter: trainable, frozen or partial."""
        masks = self.masks(params, depths)
        return _map_masks(
            lambda m: PARTIAL if isinstance(m, np.ndarray) else (TRAINABLE if m else FROZEN), masks
        )

    def describe(self, params: Any) -> dict[str, Any]:
        """What trains, for the run's metadata: specs, counts and the fraction trained."""
        total = groups.count(params, groups.select(params, ["all"]))
        trained = groups.count(params, self.masks(params))
        entry: dict[str, Any] = {
            "trainable": list(self.trainable) if self.trainable is not None else ["all"],
            "frozen": list(self.frozen),
            "trainable_parameters": trained,
            "total_parameters": total,
            "trainable_fraction": trained / total if total else 0.0,
        }
        for name in ("reinit", "unfreeze_every", "layer_decay"):
            value = getattr(self, name)
            if value:
                entry[name] = list(value) if isinstance(value, tuple) else value
        return entry

    # -- the optimizer -----------------------------------------------------------------------

    def wrap(
        self, tx: optax.GradientTransformation, depths: Mapping[str, int]
    ) -> optax.GradientTransformation:
        """`tx` restricted to the trainable parameters, with the layer methods' update scales.

        Wholly frozen parameters get `optax.set_to_zero()` (no state); parameters of scanned
        layers trained in part get `tx` with the frozen layers' updates zeroed.

        Args:
          tx: the run's optimizer.
          depths: {"encoder": layers, "decoder": layers} of the network (`depths_of_config`).
        """
        if self.is_plain:
            return tx
        depths = dict(depths)
        scaled = tx
        if self.layer_decay is not None or self.unfreeze_every is not None:
            scaled = optax.chain(tx, scale_by_layer(depths, self.layer_decay, self.unfreeze_every))

        def partial_masks(params):
            masks = self.masks(params, depths)
            return _map_masks(lambda m: m if isinstance(m, np.ndarray) else True, masks)

        return optax.multi_transform(
            {
                TRAINABLE: scaled,
                FROZEN: optax.set_to_zero(),
                PARTIAL: optax.chain(scaled, mask_layers(partial_masks)),
            },
            lambda params: self.labels(params, depths),
        )


def depths_of_config(config) -> dict[str, int]:
    """{"encoder": layers, "decoder": layers} of a `TransformerConfig`."""
    return {"encoder": config.num_encoder_layers, "decoder": config.num_decoder_layers}


def _map_masks(fn, masks: Any) -> Any:
    return jax.tree.map(fn, masks, is_leaf=lambda x: isinstance(x, (bool, np.ndarray)))


def _and_not(chosen: Any, frozen: Any) -> Any:
    def combine(a, b):
        out = np.logical_and(a, np.logical_not(b))
        if out.ndim == 0 or out.all() or not out.any():
            return bool(out.all())
        return out

    leaf = lambda x: isinstance(x, (bool, np.ndarray))  # noqa: E731
    return jax.tree.map(combine, chosen, frozen, is_leaf=leaf)


# -- update scales -------------------------------------------------------------------------------


class StepState(NamedTuple):
    """The number of updates made so far."""

    count: jax.Array  # int32 []


def _layer_shape(shape: tuple[int, ...], stacked: bool) -> tuple[int, ...]:
    """The shape a per-layer factor [L] (stacked) or [] broadcasts from: [L, 1, ..., 1]."""
    return (shape[0],) + (1,) * (len(shape) - 1) if stacked else ()


def layer_factors(
    path: str,
    shape: tuple[int, ...],
    depths: dict[str, int],
    layer_decay: float | None,
    unfreeze_every: int | None,
    step: jax.Array,
) -> jax.Array | float:
    """The factor of one parameter's update at `step` (0-based count of updates so far).

    Layer-wise rates: `layer_decay ** (n - 1 - i)`. Gradual unfreezing: 1 when layer i is among
    the top `step // unfreeze_every + 1` layers of its stack, else 0. Parameters outside the
    stacks (embeddings, soft prompt) get 1.
    """
    where = groups.position(path, shape, depths)
    if where.stack is None:
        return 1.0
    layers = where.layers()  # [L] or [1]
    from_top = where.num_layers - 1 - layers
    factor = jnp.ones(layers.shape, jnp.float32)
    if layer_decay is not None:
        factor = factor * jnp.asarray(layer_decay**from_top, jnp.float32)
    if unfreeze_every is not None:
        episode = step // unfreeze_every
        factor = factor * (jnp.asarray(from_top) <= episode).astype(jnp.float32)
    return factor.reshape(_layer_shape(shape, where.stacked))


def scale_by_layer(
    depths: Mapping[str, int], layer_decay: float | None, unfreeze_every: int | None
) -> optax.GradientTransformation:
    """Scales each parameter's update by its `layer_factors` at the current step."""

    def init(params):
        del params
        return StepState(jnp.zeros((), jnp.int32))

    def update(updates, state, params=None):
        del params
        factors = groups.map_params(
            lambda path, shape: layer_factors(
                path, shape, depths, layer_decay, unfreeze_every, state.count
            ),
            updates,
        )
        updates = jax.tree.map(lambda u, f: (u * f).astype(u.dtype), updates, factors)
        return updates, StepState(state.count + 1)

    return optax.GradientTransformation(init, update)


def mask_layers(masks_fn) -> optax.GradientTransformation:
    """Zeroes the updates of the layers a mask [L] leaves out (True: whole parameter kept)."""

    def init(params):
        del params
        return optax.EmptyState()

    def update(updates, state, params=None):
        masks = masks_fn(updates)

        def apply(u, m):
            if isinstance(m, np.ndarray):
                return u * jnp.asarray(m, u.dtype).reshape(_layer_shape(u.shape, True))
            return u

        return jax.tree.map(apply, updates, masks), state

    return optax.GradientTransformation(init, update)
