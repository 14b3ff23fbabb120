"""`t2t convert`: one checkpoint of any format t2t reads written in another.

Sources, detected from their files: a t2t model directory, a HF T5 directory, a T5X checkpoint
(legacy or Orbax) and a Mesh TensorFlow checkpoint. Targets:

- `t2t`: a model directory with one checkpoint (parameters, the network config and, given one,
  the vocabulary), which `t2t eval`, `infer`, `export` and `train --gin.INIT_CHECKPOINT` read;
- `hf`: a HF T5 directory `T5ForConditionalGeneration.from_pretrained` loads (from a t2t
  model directory this is `t2t export`'s release, with its model card);
- `t5x`: a legacy T5X checkpoint (version 3, msgpack + TensorStore) with Adafactor slots in
  T5X's layout, which T5X's `RestoreCheckpointConfig(mode='specific')` restores: the source's
  own statistics where it has them (a t2t run trained with Adafactor, a T5X or Mesh TensorFlow
  checkpoint), else zeros as T5X's Adafactor starts (factored as its default,
  `min_dim_size_to_factor` 128).

Parameters are T5X's names in every format but HF's, so the conversions are renames; values are
copied exactly (float32 to float32 round trips are bit for bit).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

import jax
import numpy as np
from flax import nnx

from t2t import files
from t2t import nn as t2t_nn
from t2t.checkpoints import hf, released, stored, t5x
from t2t.checkpoints import manager as manager_lib
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.nn.config import TransformerConfig
from t2t.pytrees import adafactor_slot

T2T, HF, T5X = "t2t", "hf", "t5x"
TARGETS = (T2T, HF, T5X)
# T5X's Adafactor default: factor a matrix whose two largest dimensions are at least this.
T5X_MIN_DIM_SIZE_TO_FACTOR = 128


@dataclasses.dataclass
class Source:
    """A checkpoint opened for conversion, its arrays not read yet.

    Attributes:
      kind: "t2t", "hf" or one of `released.FORMATS`.
      path: what was read (a model directory, a step folder, a bundle prefix).
      step: the checkpoint's training step.
      config: its network.
      params: t2t parameter path (unscanned) -> array.
      slots: parameter path -> Adafactor slot name -> array (empty: none recorded).
      vocabulary: the SentencePiece model the checkpoint carries, if any.
    """

    kind: str
    path: str
    step: int
    config: TransformerConfig
    params: dict[tuple[str, ...], stored.StoredArray]
    slots: dict[tuple[str, ...], dict[str, stored.StoredArray]]
    vocabulary: str | None = None


def open_source(path: str, step: int | None = None) -> Source:
    """Opens the checkpoint at `path` (its newest step, or `step`) in whichever format it is.

    Raises:
      FileNotFoundError: `path` is no checkpoint t2t reads.
    """
    if files.isdir(files.join(path, manager_lib.CHECKPOINTS_SUBDIR)):
        return _open_t2t(path, step)
    if files.exists(files.join(path, hf.CONFIG_FILE)):
        config, named = hf.open_hf(path)  # read array by array, as it is written
        params = {tuple(name.split("/")): array for name, array in named.items()}
        vocabulary = files.join(path, model_dir_lib.VOCABULARY_FILE)
        vocabulary = vocabulary if files.exists(vocabulary) else None
        return Source(HF, path, 0 if step is None else step, config, params, {}, vocabulary)
    if released.detect(path) is not None:
        opened = released.open_checkpoint(path, step)
        params = {tuple(p.split("/")): a for p, a in opened.params.items()}
        slots = {tuple(p.split("/")): s for p, s in opened.slots.items()}
        return Source(opened.format, opened.path, opened.step, opened.config, params, slots)
    raise FileNotFoundError(
        f"{path} is no checkpoint t2t reads: expected a t2t model directory, a HF T5 directory, "
        "a T5X checkpoint (legacy or Orbax) or a Mesh TensorFlow checkpoint."
    )


def _open_t2t(path: str, step: int | None) -> Source:
    directory = model_dir_lib.ModelDir(path)
    loaded = directory.load(step)
    config = loaded.config
    pure, config = t2t_nn.merge_lora(nnx.to_pure_dict(loaded.params), config)
    if config.additions:
        raise ValueError(
            f"{path}'s network has {config.additions} (adapters or a soft prompt), which T5X's "
            "and HF's T5 do not have; only LoRA folds into the weights. Use the t2t checkpoint."
        )
    pure = t2t_nn.unstack_layers(pure)
    params = _in_memory(pure)
    try:
        vocabulary = directory.vocabulary_file(loaded.step)[0]
    except (ValueError, FileNotFoundError):
        vocabulary = None
    slots = _t2t_slots(path, loaded.step, set(params), config)
    return Source(
        T2T, path, loaded.step, config.replace(scan_layers=False), params, slots, vocabulary
    )


def _t2t_slots(path: str, step: int, params: set, config: TransformerConfig) -> dict:
    """The Adafactor slots of a t2t checkpoint's optimizer state, read from Orbax's own record
    of its tree (whatever the run's optimizer wrappers were); empty for another optimizer."""
    item = files.join(path, manager_lib.CHECKPOINTS_SUBDIR, str(step), "opt_state")
    if not files.exists(files.join(item, t5x.ORBAX_METADATA)):
        return {}
    scanned = {(p[0], "layers", *p[2:]) for p in params if p[1:2] and p[1].startswith("layers_")}
    slots: dict = {}
    for name, array in t5x.read_orbax_item(item).items():
        found = adafactor_slot(name.split("/"), params | scanned)
        if found is None:
            continue
        slot, param = found
        if param in scanned:
            for i in range(array.shape[0]):
                layer = (param[0], f"layers_{i}", *param[2:])
                slots.setdefault(layer, {})[slot] = stored.layer_of(array, i)
        else:
            slots.setdefault(param, {})[slot] = array
    if config.lora_rank and slots:
        return {}  # LoRA's factors had the slots; the merged kernels have none of their own
    return slots


def _in_memory(pure: dict) -> dict[tuple[str, ...], stored.StoredArray]:
    return {path: _device_array("/".join(path), value) for path, value in stored.leaves(pure)}


def _device_array(name: str, value: Any) -> stored.StoredArray:
    return stored.StoredArray(
        name, tuple(value.shape), np.dtype(value.dtype), lambda index: np.asarray(value[index])
    )


# -- writing -------------------------------------------------------------------------------------


def convert(
    source_path: str,
    destination: str,
    to: str,
    *,
    step: int | None = None,
    dtype: str | None = None,
    vocabulary_file: str | None = None,
    on_array: Callable[[str], None] | None = None,
) -> str:
    """Writes the checkpoint at `source_path` to `destination` in format `to` (`TARGETS`).

    Args:
      source_path: any checkpoint `open_source` reads.
      destination: a new directory (local or gs://).
      to: "t2t", "hf" or "t5x".
      step: which checkpoint of a model directory (default: the newest).
      dtype: "float32" or "bfloat16" for the parameters written (default: as stored); T5X and
        t2t targets only.
      vocabulary_file: the SentencePiece model to carry (t2t and hf targets); default: the
        source's own, if it carries one.
      on_array: called with each parameter's name as it is written (T5X target).

    Returns:
      The directory (T5X: the step folder) written.
    """
    if to not in TARGETS:
        raise ValueError(f"--to {to!r}: expected one of {TARGETS}.")
    if files.exists(destination) and (not files.isdir(destination) or files.listdir(destination)):
        raise FileExistsError(f"{destination} exists and is not empty; give a new directory.")
    if files.is_remote(source_path) or files.exists(source_path):
        if files.real(destination).startswith(files.real(source_path).rstrip("/") + "/"):
            raise ValueError(f"{destination} is inside the source {source_path}; write elsewhere.")
    source = open_source(source_path, step)
    if to == source.kind and to in (T2T, HF):
        raise ValueError(f"{source_path} is already a {to} checkpoint.")
    vocabulary = vocabulary_file or source.vocabulary
    if to == T5X:
        return _to_t5x(source, destination, dtype, on_array)
    if to == HF:
        return _to_hf(source, destination, source_path, vocabulary, step)
    return _to_t2t(source, destination, dtype, vocabulary)


def _to_t5x(source: Source, destination: str, dtype: str | None, on_array) -> str:
    params = {path: _Lazy(array) for path, array in source.params.items()}
    slots = {
        path: t5x_slots(source.slots.get(path, {}), array.shape)
        for path, array in source.params.items()
    }
    return t5x.write_legacy(destination, source.step, params, slots, dtype=dtype, on_array=on_array)


class _Lazy:
    """An array read when the writer asks for it (one array in memory at a time)."""

    def __init__(self, array: stored.StoredArray):
        self._array = array

    def __array__(self, dtype=None, copy=None):
        value = self._array.read_all()
        return value if dtype is None else value.astype(dtype)


def t5x_slots(slots: dict[str, stored.StoredArray], shape: tuple[int, ...]) -> dict[str, Any]:
    """The four Adafactor slots T5X keeps for a parameter of `shape`: the source's where it has
    them, `(1,)` zeros for the unused ones, and for a source with none the zeros T5X's
    Adafactor starts from."""
    dummy = np.zeros((1,), np.float32)
    if not slots:
        factored = len(shape) >= 2 and sorted(shape)[-2] >= T5X_MIN_DIM_SIZE_TO_FACTOR
        if factored:
            largest = int(np.argsort(shape, kind="stable")[-1])
            second = int(np.argsort(shape, kind="stable")[-2])
            row = np.zeros(np.delete(shape, largest), np.float32)
            column = np.zeros(np.delete(shape, second), np.float32)
            return {"v_row": row, "v_col": column, "v": dummy, "m": dummy}
        return {"v_row": dummy, "v_col": dummy, "v": np.zeros(shape, np.float32), "m": dummy}
    return {name: _Lazy(slots[name]) if name in slots else dummy for name in t5x.SLOTS}


def _to_hf(source: Source, destination: str, source_path: str, vocabulary, step) -> str:
    from t2t import release

    if source.kind == T2T and vocabulary is not None:  # the release, with its model card
        return release.export(source_path, destination, step=step, vocabulary_file=vocabulary)
    # NOTE: float32, an exact upcast of bfloat16 masters: safetensors' numpy reader (and many
    # HF users' loaders) have no bfloat16.
    pure = jax.tree.map(lambda x: x.astype(np.float32), stored.read_values(source.params))
    release.write_hf_directory(destination, source.config, pure, vocabulary_file=vocabulary)
    return destination


def _to_t2t(source: Source, destination: str, dtype: str | None, vocabulary: str | None) -> str:
    config = source.config if dtype is None else source.config.replace(param_dtype=dtype)
    device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        hf.abstract_state(config),
    )
    named = {"/".join(path): array for path, array in source.params.items()}
    params = stored.place(stored.match(named, abstract, source.path), abstract)
    origin = {"kind": source.kind, "path": files.absolute(source.path), "step": source.step}
    metadata: dict[str, Any] = {"config": config, "converted_from": origin}
    if vocabulary is not None:
        metadata["vocabulary"] = {"sentencepiece_model_file": vocabulary, "extra_ids": 100}
    manager = manager_lib.CheckpointManager(destination, keep=None, async_save=False)
    manager.save(source.step, params=params, metadata=metadata)
    manager.wait_until_finished()
    manager.close()
    files.write_text(
        files.join(destination, model_dir_lib.MODEL_CONFIG_JSON),
        json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True),
    )
    if vocabulary is not None:
        files.copy(vocabulary, files.join(destination, model_dir_lib.VOCABULARY_FILE))
    return destination
