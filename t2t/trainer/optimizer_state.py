"""A released checkpoint's Adafactor statistics and step, put into a run's optimizer state: to
continue pretraining a release where it stopped rather than with fresh second moments.

T5X and Mesh TensorFlow keep Adafactor's factored second moments per parameter as `v_row` and
`v_col` (or `v` for an unfactored one), the same statistics optax's `scale_by_factored_rms`
keeps under the same names (Mesh TensorFlow's slots are renamed by meaning on reading:
`t2t.checkpoints.mtf.slot_name`). The run's state is made as usual (`tx.init`), then every
slot leaf, wherever the run's wrappers put it (fine-tuning masks, scanned layers), is replaced
by the checkpoint's, and every counter is set to the checkpoint's step, so the second-moment
decay and the learning-rate schedule go on from there.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import numpy as np

from t2t.checkpoints import stored
from t2t.checkpoints.released import Released
from t2t.pytrees import adafactor_slot, key_names


def import_slots(opt_state: Any, opened: Released) -> Any:
    """`opt_state` (the run's, freshly initialized) with `opened`'s slots and step.

    Raises:
      ValueError: the checkpoint holds no optimizer state, one with momentum, or slots the
        run's optimizer factors differently; or the run's optimizer keeps no Adafactor slots.
    """
    what = f"the {opened.format} checkpoint {opened.path}"
    if not opened.slots:
        raise ValueError(
            f"{what} holds no optimizer state, so init_optimizer_state cannot take one from it; "
            "start with a fresh optimizer state (the default)."
        )
    momentum = sorted(
        p for p, s in opened.slots.items() if "m" in s and tuple(s["m"].shape) != (1,)
    )
    if momentum:
        raise ValueError(
            f"{what} trained Adafactor with momentum (beta1; slot m of {momentum[0]} ...); t2t's "
            "Adafactor has none, so its state cannot be continued. Start with a fresh optimizer "
            "state."
        )
    known = _slot_paths(opened)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(opt_state)
    replaced, filled = [], 0
    for keypath, leaf in leaves:
        names = key_names(keypath)
        found = adafactor_slot(names, known)
        if found is not None:
            replaced.append(_slot_value(opened, *found, leaf, what))
            filled += 1
        elif names[-1] == "count" or names[-2:] == ("count", "value"):
            replaced.append(_full(leaf, opened.step))
        else:
            replaced.append(leaf)
    if not filled:
        raise ValueError(
            "init_optimizer_state needs the run's optimizer to be Adafactor (t2t.optim.adafactor),"
            " whose slots it fills; this run's optimizer keeps no v_row/v_col/v statistics."
        )
    return jax.tree_util.tree_unflatten(treedef, replaced)


def _slot_paths(opened: Released) -> set[tuple[str, ...]]:
    """The parameter paths the checkpoint has slots for, unscanned and as scanned layers."""
    paths = {tuple(p.split("/")) for p in opened.slots}
    for path in list(paths):
        if len(path) > 2 and re.fullmatch(r"layers_\d+", path[1]):
            paths.add((path[0], "layers", *path[2:]))
    return paths


def _slot_value(opened: Released, slot: str, path: tuple[str, ...], leaf, what: str):
    if path[1:2] == ("layers",):
        count = 1 + max(
            int(p.split("/")[1][len("layers_") :])
            for p in opened.slots
            if p.startswith(f"{path[0]}/layers_")
        )
        parts = [
            _stored_slot(opened, (path[0], f"layers_{i}", *path[2:]), slot, what)
            for i in range(count)
        ]
        array = stored.stacked(parts)
    else:
        array = _stored_slot(opened, path, slot, what)
    if tuple(array.shape) != tuple(leaf.shape):
        raise ValueError(
            f"{what}: the Adafactor slot {slot} of {'/'.join(path)} has shape "
            f"{tuple(array.shape)}, the run's optimizer keeps {tuple(leaf.shape)}: it factors "
            "this parameter differently. Bind t2t.optim.adafactor.min_dim_size_to_factor to the "
            "value the checkpoint was trained with (128 for T5's releases)."
        )
    return stored.placed(array, leaf)


def _stored_slot(opened: Released, path: tuple[str, ...], slot: str, what: str):
    slots = opened.slots.get("/".join(path), {})
    if slot not in slots:
        raise ValueError(
            f"{what} has no Adafactor slot {slot} for {'/'.join(path)} (it has "
            f"{sorted(slots) or 'none'})."
        )
    return slots[slot]


def _full(leaf, value: int):
    return jax.make_array_from_callback(
        tuple(leaf.shape),
        leaf.sharding,
        lambda index: np.full(_index_shape(leaf.shape, index), value, dtype=leaf.dtype),
    )


def _index_shape(shape, index) -> tuple[int, ...]:
    return tuple(len(range(*part.indices(size))) for part, size in zip(index, shape))
