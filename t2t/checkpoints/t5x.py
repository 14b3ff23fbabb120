"""T5X checkpoints: the legacy format read and written, T5X's Orbax format read.

A T5X checkpoint is one step folder, `checkpoint_<step>/`, of a train state `{'target':
params, 'state': {'step', 'param_states'}}` whose parameter names and shapes are t2t's own
(unscanned layout): the rename is the identity. Two layouts exist:

- legacy (T5X's `Checkpointer`): a msgpack file `checkpoint` (`{'version': 3, 'optimizer':
  state}`) whose leaves are either inline arrays or TensorStore specs of zarr arrays stored
  beside it under a path relative to the step folder (`target.encoder.layers_0.mlp.wo.kernel/`);
- Orbax (T5X's `OrbaxCheckpointManagerInterface`): `checkpoint_<step>/state/`, a PyTree item
  whose arrays live in one OCDBT database (`_METADATA` names them).

Every array is read through TensorStore slice by slice (`t2t.checkpoints.stored`), local or on
gs://. The writer produces the legacy layout T5X's own fine-tuning restores: every parameter
and every full-shape slot in zarr, the factored slots, the unused `(1,)` slots and the step
inline, and all four Adafactor slots of every parameter (T5X's reader needs each one).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from t2t import files
from t2t.checkpoints.stored import Index, StoredArray, in_memory

MSGPACK_FILE = "checkpoint"
ORBAX_ITEM = "state"
ORBAX_METADATA = "_METADATA"
VERSION = 3
SLOTS = ("m", "v", "v_col", "v_row")
_STEP_FOLDER = re.compile(r"checkpoint_(\d+)")
# Chunks of at most 64 MiB (T5X's own limit) and 1024 a side, each dimension a divisor.
_CHUNK_BYTES = 64 * 1024 * 1024
_CHUNK_SIDE = 1024


class T5xFormatError(ValueError):
    """A T5X checkpoint that cannot be read as one (the message says why)."""


# -- where a step's files are ------------------------------------------------------------------


def step_folders(path: str) -> dict[int, str]:
    """The `checkpoint_<step>` folders of a T5X model directory, by step."""
    if not files.isdir(path):
        return {}
    found = {}
    for name in files.listdir(path):
        match = _STEP_FOLDER.fullmatch(name)
        if match and files.isdir(files.join(path, name)):
            found[int(match.group(1))] = files.join(path, name)
    return found


def is_legacy(path: str) -> bool:
    """Whether `path` is a legacy step folder (or its msgpack file)."""
    target = path if not files.isdir(path) else files.join(path, MSGPACK_FILE)
    if not files.exists(target) or files.isdir(target):
        return False
    with files.open_file(target, "rb") as f:
        head = f.read(1)
    # A msgpack map starts with 0x80-0x8f (fixmap) or 0xde/0xdf; a TF `checkpoint` is text.
    return bool(head) and (0x80 <= head[0] <= 0x8F or head[0] in (0xDE, 0xDF))


def is_orbax(path: str) -> bool:
    """Whether `path` is a T5X Orbax step folder (or its `state/` item)."""
    return files.exists(files.join(path, ORBAX_ITEM, ORBAX_METADATA)) or (
        files.basename(path) == ORBAX_ITEM and files.exists(files.join(path, ORBAX_METADATA))
    )


def step_of(path: str) -> int | None:
    """The step a step folder's name gives (`checkpoint_1000000` -> 1000000)."""
    name = files.basename(path)
    if name in (MSGPACK_FILE, ORBAX_ITEM):
        name = files.basename(files.parent(path))
    match = _STEP_FOLDER.fullmatch(name)
    return int(match.group(1)) if match else None


# -- reading -----------------------------------------------------------------------------------


def read_legacy(path: str) -> tuple[dict[str, StoredArray], int]:
    """The arrays of a legacy step folder: '/'-joined names of the train state ('target/...',
    'state/param_states/.../v_row', 'state/step') -> array, and the step.

    Raises:
      T5xFormatError: not msgpack, a version other than 3, or a leaf that is neither an array
        nor a TensorStore spec.
    """
    folder = path if files.isdir(path) else files.parent(path)
    msgpack_path = files.join(folder, MSGPACK_FILE)
    contents = _unpack(msgpack_path)
    version = contents.get("version") if isinstance(contents, dict) else None
    if version != VERSION:
        raise T5xFormatError(
            f"{msgpack_path} is a T5X checkpoint of version {version!r}; t2t reads version "
            f"{VERSION} (T5X since 2021-06), which stores bfloat16 natively. Versions before it "
            "stored bfloat16 as uint16 and cannot be told from real integers: restore it with "
            "a current T5X and save it again."
        )
    arrays = {}
    for name, leaf in _flatten(contents["optimizer"]):
        if isinstance(leaf, Mapping) and "kvstore" in leaf:
            arrays[name] = _zarr_array(name, dict(leaf), folder)
        elif isinstance(leaf, (np.ndarray, np.generic, int, float)):
            arrays[name] = in_memory(name, np.asarray(leaf))
        else:
            raise T5xFormatError(
                f"{msgpack_path}: the leaf {name} is a {type(leaf).__name__}, neither an array "
                "nor a TensorStore spec."
            )
    return arrays, _step(arrays, path)


def read_orbax(path: str) -> tuple[dict[str, StoredArray], int]:
    """The arrays of a T5X Orbax step folder (or its `state/` item), as `read_legacy`."""
    item = path if files.basename(path) == ORBAX_ITEM else files.join(path, ORBAX_ITEM)
    arrays = read_orbax_item(item, strict=_is_param)
    return arrays, _step(arrays, path)


def read_orbax_item(item: str, *, strict: Callable[[str], bool] = lambda name: True):
    """Every array of an Orbax PyTree item directory (`_METADATA` names them), by '/'-joined
    tree path; `strict(name)` says which must have every chunk stored."""
    metadata_path = files.join(item, ORBAX_METADATA)
    try:
        metadata = json.loads(files.read_text(metadata_path))
        tree = metadata["tree_metadata"]
    except (ValueError, KeyError, TypeError) as error:
        raise T5xFormatError(
            f"{metadata_path} is not Orbax's PyTree metadata ({error}); the step folder may be "
            "incomplete (a save that did not finish)."
        ) from None
    driver = "zarr3" if metadata.get("use_zarr3") else "zarr"
    ocdbt = bool(metadata.get("use_ocdbt", True))
    every_chunk = bool(metadata.get("store_array_data_equal_to_fill_value", False))
    arrays = {}
    for entry in tree.values():
        keys = [str(k["key"]) for k in entry["key_metadata"]]
        kind = (entry.get("value_metadata") or {}).get("value_type")
        if kind is None or entry["value_metadata"].get("skip_deserialize"):
            continue  # an empty node (optax's EmptyState), no array
        name = "/".join(keys)
        if kind not in ("jax.Array", "np.ndarray", "scalar"):
            raise T5xFormatError(f"{metadata_path}: {name} holds a {kind!r}, not an array.")
        stored_name = ".".join(keys)
        if ocdbt:
            kvstore = {"driver": "ocdbt", "base": _kvstore(item), "path": stored_name}
        else:
            kvstore = _kvstore(files.join(item, stored_name))
        spec = {"driver": driver, "kvstore": kvstore}
        arrays[name] = _tensorstore_array(name, spec, strict=every_chunk or strict(name))
    return arrays


def _unpack(msgpack_path: str) -> Any:
    from flax import serialization

    try:
        return serialization.msgpack_restore(files.read_bytes(msgpack_path))
    except Exception as error:  # noqa: BLE001 (msgpack's ExtraData, ValueError, UnpackException)
        raise T5xFormatError(
            f"{msgpack_path} is not a complete T5X msgpack file ({type(error).__name__}: "
            f"{str(error)[:120]}); it may be truncated (a copy that did not finish)."
        ) from None


def _step(arrays: Mapping[str, StoredArray], path: str) -> int:
    if "state/step" in arrays:
        return int(arrays["state/step"].read_all())
    named = step_of(path)
    return 0 if named is None else named


def _zarr_array(name: str, spec: dict, folder: str) -> StoredArray:
    """A legacy leaf's zarr array, its relative path resolved against the step folder (T5X
    writes 'file' or a dummy gcs bucket; where the folder is now decides)."""
    kvstore = spec.get("kvstore", {})
    relative = kvstore.get("path", spec.get("path"))
    if not isinstance(relative, str):
        raise T5xFormatError(f"{name}: its TensorStore spec names no path ({spec}).")
    if spec.get("dtype") == "uint16" or spec.get("metadata", {}).get("dtype") == "<u2":
        raise T5xFormatError(
            f"{name} is stored as uint16, the bfloat16 of T5X checkpoints before version 3; "
            "restore and save it again with a current T5X."
        )
    shape = spec.get("metadata", {}).get("shape")
    opened = {
        "driver": spec.get("driver", "zarr"),
        "kvstore": _kvstore(files.join(folder, relative)),
    }
    shape = None if shape is None else tuple(shape)
    if _is_param(name) or shape is None or "dtype" not in spec:
        return _tensorstore_array(name, opened, shape, strict=_is_param(name))
    return _later(name, opened, shape, spec["dtype"])


def _later(name: str, spec: dict, shape: tuple[int, ...], dtype: str) -> StoredArray:
    """An optimizer slot opened on its first read: a weights-only import of a large release
    does not open its hundreds of slot arrays (a request or more each on a bucket)."""
    opened: list[StoredArray] = []

    def read(index: Index) -> np.ndarray:
        if not opened:
            opened.append(_tensorstore_array(name, spec, shape, strict=False))
        return opened[0].read(index)

    return StoredArray(name, shape, np.dtype(dtype), read)


def _is_param(name: str) -> bool:
    return name.startswith("target/")


def _tensorstore_array(
    name: str, spec: dict, shape: tuple[int, ...] | None = None, *, strict: bool = True
) -> StoredArray:
    """A `StoredArray` read through TensorStore (its metadata read now).

    With `strict`, a chunk that is not stored is an error: zarr reads an absent chunk as zeros,
    which is how a lost file of a parameter would pass unseen. (TensorStore leaves out chunks
    equal to the fill value unless told otherwise, so an all-zero optimizer slot of a T5X
    checkpoint may legitimately have none: slots are read leniently.)
    """
    import tensorstore as ts

    spec = {**spec, "fill_missing_data_reads": not strict}
    try:
        store = ts.open(spec, open=True, read=True, context=_context()).result()
    except Exception as error:  # noqa: BLE001 (TensorStore raises ValueError with its status)
        raise T5xFormatError(
            f"{name}: cannot open its array ({_status(error)}); a file of the checkpoint is "
            "missing or damaged."
        ) from None
    if str(store.dtype.name) == "uint16":
        raise T5xFormatError(
            f"{name} is stored as uint16, the bfloat16 of T5X checkpoints before version 3; "
            "restore and save it again with a current T5X."
        )
    if shape is not None and tuple(store.shape) != shape:
        raise T5xFormatError(
            f"{name}: the msgpack file says shape {shape}, its zarr array is {tuple(store.shape)}."
        )

    def read(index: Index) -> np.ndarray:
        try:
            return np.asarray(store[index].read().result())
        except Exception as error:  # noqa: BLE001
            raise T5xFormatError(
                f"{name}: reading it failed ({_status(error)}); a chunk of the checkpoint is "
                "missing or damaged."
            ) from None

    chunks = tuple(store.chunk_layout.read_chunk.shape or ()) or None
    return StoredArray(
        name, tuple(store.shape), np.dtype(store.dtype.numpy_dtype), read, chunks=chunks
    )


_CONTEXT = []


def _context():
    """One TensorStore context for every array of the process (its thread pools are shared);
    no cache: each slice is read once and goes straight to a device."""
    import tensorstore as ts

    if not _CONTEXT:
        _CONTEXT.append(ts.Context({"cache_pool": {"total_bytes_limit": 0}}))
    return _CONTEXT[0]


def _kvstore(path: str) -> dict:
    if files.is_remote(path):
        bucket, name = files.split_bucket(path)
        return {"driver": "gcs", "bucket": bucket, "path": name + "/"}
    return {"driver": "file", "path": files.absolute(path) + "/"}


def _status(error: Exception) -> str:
    return str(error).strip().splitlines()[0][:200] if str(error).strip() else type(error).__name__


def _flatten(tree: Any, prefix: str = ""):
    if isinstance(tree, Mapping) and not ("kvstore" in tree and "driver" in tree):
        for key, value in tree.items():
            yield from _flatten(value, f"{prefix}{key}/")
    else:
        yield prefix.rstrip("/"), tree


# -- writing -----------------------------------------------------------------------------------


def write_legacy(
    directory: str,
    step: int,
    params: Mapping[tuple[str, ...], Any],
    slots: Mapping[tuple[str, ...], Mapping[str, Any]],
    *,
    dtype: str | None = None,
    on_array: Callable[[str], None] | None = None,
) -> str:
    """Writes `directory/checkpoint_<step>/` in T5X's legacy layout (version 3).

    Args:
      directory: the T5X model directory (local or gs://); created if missing.
      step: the step of the checkpoint (its folder name and `state/step`).
      params: path -> array (unscanned layout), numpy or jax, one at a time to host.
      slots: path -> {'v_row', 'v_col', 'v', 'm'} -> array, for every path of `params`.
      dtype: "bfloat16" or "float32" for the parameters; None keeps each array's own. Slots
        are float32, as T5X keeps them.
      on_array: called with each parameter's name as it is written (progress).

    Returns:
      The step folder written. It appears whole: written under a temporary name, then moved.
    """
    import tensorstore as ts

    missing = sorted("/".join(p) for p in params if set(slots.get(p, {})) != set(SLOTS))
    if missing:
        raise ValueError(
            f"Every parameter needs the four Adafactor slots {SLOTS} (T5X's reader requires "
            f"them); these lack some: {missing[:6]}."
        )
    final = files.join(directory, f"checkpoint_{step}")
    if files.exists(final):
        raise FileExistsError(f"{final} exists; give an empty T5X model directory to write to.")
    staging = final + ".tmp"
    if files.exists(staging):
        files.rmtree(staging)
    files.makedirs(staging)
    try:
        target, param_states = _write_arrays(ts, staging, params, slots, dtype, on_array)
        state = {"step": np.asarray(step, np.int32), "param_states": param_states}
        contents = {"version": VERSION, "optimizer": {"target": target, "state": state}}
        from flax import serialization

        msgpack = serialization.msgpack_serialize(contents)
        files.write_bytes(files.join(staging, MSGPACK_FILE), msgpack)
    except BaseException:
        files.rmtree(staging)  # nothing half-written stays behind
        raise
    files.move(staging, final)
    return final


def _write_arrays(ts, staging, params, slots, dtype, on_array) -> tuple[dict, dict]:
    """Every parameter and slot into `staging`: (target tree, param_states tree) of specs
    (zarr arrays) and inline arrays, as the msgpack file holds them."""
    target: dict = {}
    param_states: dict = {}
    for path in sorted(params):
        array = np.asarray(params[path])
        if dtype is not None:
            array = array.astype(dtype)
        _put(target, path, _write_zarr(ts, staging, "target." + ".".join(path), array))
        states = {}
        for slot in SLOTS:
            value = np.asarray(slots[path][slot], dtype=np.float32)
            full = slot in ("v", "m") and value.shape == array.shape and value.ndim > 0
            name = "state.param_states." + ".".join(path) + "." + slot
            states[slot] = _write_zarr(ts, staging, name, value) if full else value
        _put(param_states, path, states)
        if on_array is not None:
            on_array("/".join(path))
    return target, param_states


def _write_zarr(ts, folder: str, name: str, array: np.ndarray) -> dict:
    """Writes `array` as `folder/name/` (zarr, gzip) and returns the spec T5X records: the path
    relative to the step folder, so the checkpoint can be moved."""
    chunks = chunk_shape(array.shape, array.dtype.itemsize)
    metadata = {
        "chunks": chunks,
        "compressor": {"id": "gzip", "level": 1},
        "shape": list(array.shape),
    }
    spec = {
        "driver": "zarr",
        "dtype": array.dtype.name,
        "kvstore": _kvstore(files.join(folder, name)),
        "metadata": metadata,
        "store_data_equal_to_fill_value": True,  # every chunk on disk: a missing one is damage
    }
    store = ts.open(spec, create=True, context=_context()).result()  # a fresh staging folder
    store.write(array).result()
    return {
        "driver": "zarr",
        "dtype": array.dtype.name,
        "kvstore": {"driver": "file", "path": name + "/"},
        "metadata": metadata,
    }


def chunk_shape(
    shape: tuple[int, ...], itemsize: int, limit: int = _CHUNK_BYTES, side: int = _CHUNK_SIDE
) -> list[int]:
    """Chunks whose every dimension divides the array's and is at most `side` long, cut further
    (the largest dimension to its next smaller divisor) until a chunk holds at most `limit`
    bytes. Short sides let a process of a multi-host run read only the chunks of its own shards
    whichever dimensions its mesh splits (TensorStore reads a chunk whole).

    Example: shape (32128, 2048), float32 -> [1004, 1024] (1004 divides 32128, 4 MB a chunk).
    """
    divisors = [[d for d in range(1, size + 1) if size % d == 0] or [1] for size in shape]
    chunk = []
    for options in divisors:
        while len(options) > 1 and options[-1] > side:
            options.pop()
        chunk.append(options[-1])
    while int(np.prod(chunk, dtype=np.int64)) * itemsize > limit and max(chunk, default=1) > 1:
        widest = max(range(len(chunk)), key=lambda i: chunk[i])
        divisors[widest].pop()
        chunk[widest] = divisors[widest][-1]
    return chunk


def _put(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for name in path[:-1]:
        tree = tree.setdefault(name, {})
    tree[path[-1]] = value
