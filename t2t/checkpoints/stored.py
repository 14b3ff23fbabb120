"""Arrays of another framework's checkpoint, read on demand and placed straight into shards.

A released checkpoint can be larger than one host's memory (T5-11B is 45 GB in float32), so
an importer never loads it whole: each format's reader describes every stored array as a
`StoredArray` (its shape, dtype and a function that reads an index of it), a rename table maps
their names onto t2t's parameter paths (`match`, strict both ways), and `place` builds each
parameter with `jax.make_array_from_callback`, reading only the slices this process's devices
hold. Formats that can only read whole arrays (TF bundles) read each array once, slice it for
the devices and drop it: at most one array beyond the placed parameters is ever in memory.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx

Index = tuple[slice, ...]
Path = tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class StoredArray:
    """One array of a checkpoint, not yet read.

    Attributes:
      name: its name in the checkpoint (for messages).
      shape: the stored shape.
      dtype: the stored dtype.
      read: index (a tuple of slices, one per dimension) -> that part of the array, numpy.
      sliceable: whether `read` reads only the slice asked for (TensorStore) or the whole array
        every time (a TF bundle); `place` reads the latter once per parameter.
      chunks: the shape of the pieces the store reads whole (zarr chunks), if it has any.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    read: Callable[[Index], np.ndarray]
    sliceable: bool = True
    chunks: tuple[int, ...] | None = None

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def read_all(self) -> np.ndarray:
        return np.asarray(self.read(tuple(slice(None) for _ in self.shape)))


def in_memory(name: str, array: np.ndarray) -> StoredArray:
    """A `StoredArray` of an array already read (inline msgpack arrays, small records)."""
    array = np.asarray(array)
    return StoredArray(name, tuple(array.shape), array.dtype, lambda index: array[index])


def stacked(parts: Sequence[StoredArray]) -> StoredArray:
    """The arrays of L layers as one `[L, ...]` array (t2t's scanned layout), read per slice."""
    first = parts[0]

    def read(index: Index) -> np.ndarray:
        layers, rest = index[0], index[1:]
        return np.stack([parts[i].read(rest) for i in range(len(parts))[layers]])

    return StoredArray(
        f"{first.name} (+{len(parts) - 1} layers)",
        (len(parts), *first.shape),
        first.dtype,
        read,
        first.sliceable,
    )


def layer_of(array: StoredArray, layer: int) -> StoredArray:
    """Layer `layer` of a stacked `[L, ...]` array (t2t's scanned layout), read per slice."""

    def read(index: Index) -> np.ndarray:
        return array.read((slice(layer, layer + 1), *index))[0]

    return StoredArray(
        f"{array.name}[{layer}]", tuple(array.shape[1:]), array.dtype, read, array.sliceable
    )


class CheckpointMismatchError(ValueError):
    """A checkpoint's arrays do not fill the model's parameters one for one."""


@dataclasses.dataclass(frozen=True)
class Rule:
    """One row of a rename table: a regular expression over stored names (matched whole) and
    the name it gives: a template with `\\1`-style groups, a function of the match, or None
    to drop the array on purpose."""

    pattern: str
    target: str | Callable[[re.Match], str] | None

    def apply(self, name: str) -> str | None | bool:
        match = re.fullmatch(self.pattern, name)
        if match is None:
            return False
        if self.target is None:
            return None
        return self.target(match) if callable(self.target) else match.expand(self.target)


def rename(
    stored: Mapping[str, StoredArray], table: Iterable[Rule], what: str
) -> dict[str, StoredArray]:
    """`stored` under the names the first matching rule of `table` gives each.

    Raises:
      CheckpointMismatchError: names no rule maps (all listed), or two arrays mapped to one name.
    """
    table = list(table)
    renamed: dict[str, StoredArray] = {}
    unmapped = []
    for name in sorted(stored):
        for rule in table:
            target = rule.apply(name)
            if target is not False:
                break
        else:
            unmapped.append(name)
            continue
        if target is None:
            continue
        if target in renamed:
            raise CheckpointMismatchError(
                f"{what}: {renamed[target].name} and {name} both map to {target}."
            )
        renamed[target] = stored[name]
    if unmapped:
        raise CheckpointMismatchError(
            f"{what} holds {len(unmapped)} array(s) no rule maps to a t2t parameter: "
            f"{_listing(unmapped)}. Nothing was loaded: importing would leave them out "
            "silently. A variant of the format t2t does not know, or another architecture "
            "(mixture of experts, LongT5, per-layer position biases) that t2t does not build."
        )
    return renamed


def match(
    arrays: Mapping[str, StoredArray], abstract: nnx.State | Mapping, what: str
) -> dict[Path, StoredArray]:
    """Pairs every parameter of `abstract` (unscanned layout) with its array, by '/'-joined path.

    Raises:
      CheckpointMismatchError: parameters the checkpoint lacks, arrays no parameter takes, or a
        shape that differs (the first one, with both shapes).
    """
    shapes = {path: tuple(leaf.shape) for path, leaf in leaves(abstract)}
    wanted = {"/".join(path): path for path in shapes}
    missing = sorted(set(wanted) - set(arrays))
    extra = sorted(set(arrays) - set(wanted))
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"the model's parameters {_listing(missing)} are not in it")
        if extra:
            parts.append(f"its arrays {_listing(extra)} are not parameters of the model")
        raise CheckpointMismatchError(
            f"{what} does not fit the model: {'; and '.join(parts)}. Nothing was loaded. The "
            "model config must be the checkpoint's (layers, gated or plain MLP, tied or "
            "separate logits)."
        )
    for name, path in wanted.items():
        stored = arrays[name]
        if tuple(stored.shape) != shapes[path]:
            raise CheckpointMismatchError(
                f"{what}: {stored.name} has shape {tuple(stored.shape)}, but the model's "
                f"{name} is {shapes[path]}. The model config disagrees with the checkpoint; "
                "leave it unset to take the checkpoint's, or fix the field that sets this "
                "dimension."
            )
    return {path: arrays[name] for name, path in wanted.items()}


def place(arrays: Mapping[Path, StoredArray], abstract: nnx.State) -> nnx.State:
    """The parameters of `abstract` (shapes with shardings) read from `arrays`, each array
    straight into the shards of its sharding, cast to its dtype.

    Args:
      arrays: path -> array in `abstract`'s layout (`stacked` for scanned layers).
      abstract: the run's parameters as `jax.ShapeDtypeStruct`s carrying shardings.
    """
    values = {}
    for path, leaf in leaves(abstract):
        values[path] = placed(arrays[path], leaf)
        _return_freed_memory()
    state = jax.tree.map(lambda x: x, abstract)
    nnx.replace_by_pure_dict(state, _nested(values))
    return state


def placed(stored: StoredArray, leaf: Any) -> jax.Array:
    """One array read into the shards of `leaf`'s sharding, in `leaf`'s dtype.

    The part this process's devices hold (the box around their shards) is read once and each
    device's shard cut from it: devices that share rows of a chunk, or hold copies, do not read
    it again, and a process of a multi-host run reads its share only (a whole-array reader:
    the whole array, once).
    """
    shape = tuple(leaf.shape)
    indices = list(leaf.sharding.addressable_devices_indices_map(shape).values())
    box = _bounding_box(shape, indices) if stored.sliceable else _whole(shape)
    held = [_read_box(stored, box, np.dtype(leaf.dtype))]
    served = set()

    def shard(index: Index) -> np.ndarray:
        local = tuple(
            slice(*(_bounds(part, size)[i] - outer.start for i in (0, 1)))
            for part, outer, size in zip(index, box, shape)
        )
        region = tuple((part.start, part.stop) for part in local)
        if region in served:  # a replica: its own buffer, never memory another device writes
            return np.array(held[0][local], copy=True)
        served.add(region)
        # NOTE: a view: a CPU device takes a C-contiguous numpy buffer as its own (no copy),
        # so the box read becomes the parameters' memory; other devices copy it.
        return held[0][local]

    try:
        return jax.make_array_from_callback(shape, leaf.sharding, shard)
    finally:
        held[0] = None


# A box larger than this is read a group of whole chunk rows at a time into one buffer, so
# that the store's own buffers stay small beside the array.
_PIECE_BYTES = 64 * 1024 * 1024


def _read_box(stored: StoredArray, box: Index, dtype: np.dtype) -> np.ndarray:
    """The `box` of `stored` in `dtype`, as a buffer of its own."""
    extent = tuple(part.stop - part.start for part in box)
    row_bytes = int(np.prod(extent[1:], dtype=np.int64)) * np.dtype(stored.dtype).itemsize
    chunk_rows = (stored.chunks or (1,))[0] if extent else 0
    rows = max(1, _PIECE_BYTES // max(row_bytes * chunk_rows, 1)) * chunk_rows
    if not stored.sliceable or not extent or rows >= extent[0]:
        return _owned(stored.read(box), dtype)
    out = np.empty(extent, dtype)
    first = box[0].start - box[0].start % chunk_rows  # pieces on the chunks' row boundaries
    for start in range(first, box[0].stop, rows):
        low, high = max(start, box[0].start), min(start + rows, box[0].stop)
        out[low - box[0].start : high - box[0].start] = stored.read((slice(low, high), *box[1:]))
    return out


def _owned(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array` in `dtype`, as a writable buffer of its own (devices may take it over)."""
    if array.dtype != dtype:
        return array.astype(dtype)
    if array.flags.writeable and array.flags.c_contiguous and array.base is None:
        return array
    return np.array(array, copy=True)


def _whole(shape: tuple[int, ...]) -> Index:
    return tuple(slice(0, size) for size in shape)


def _bounds(part: slice, size: int) -> tuple[int, int]:
    start, stop, step = part.indices(size)
    assert step == 1, "shards are contiguous"
    return start, stop


def _return_freed_memory() -> None:
    """Hands the memory of the arrays just freed back to the system (glibc keeps it in its
    arenas otherwise, scattered between live blocks: on a 2.3 GB import, 0.1-0.2x of it)."""
    if _LIBC:
        _LIBC[0].malloc_trim(0)


def _glibc() -> list:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return [libc] if hasattr(libc, "malloc_trim") else []
    except OSError:  # not glibc (macOS, musl): nothing to return
        return []


_LIBC = _glibc()


def _bounding_box(shape: tuple[int, ...], indices: list[Index]) -> Index:
    """The smallest box holding every index of `indices` (the shards of this process)."""
    if not indices:
        return _whole(shape)
    box = []
    for axis, size in enumerate(shape):
        bounds = [_bounds(index[axis], size) for index in indices]
        box.append(slice(min(b[0] for b in bounds), max(b[1] for b in bounds)))
    return tuple(box)


def leaves(tree: nnx.State | Mapping) -> list[tuple[Path, Any]]:
    """(path, leaf) of every leaf of a (pure or nnx) state, in a stable order."""
    pure = nnx.to_pure_dict(tree) if isinstance(tree, nnx.State) else tree
    found = []

    def walk(node, prefix):
        for key in sorted(node, key=str):
            value = node[key]
            if isinstance(value, Mapping):
                walk(value, (*prefix, str(key)))
            else:
                found.append(((*prefix, str(key)), value))

    walk(pure, ())
    return found


def _nested(flat: Mapping[Path, Any]) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        for name in path[:-1]:
            node = node.setdefault(name, {})
        node[path[-1]] = value
    return tree


def _listing(names: Sequence[str], limit: int = 8) -> str:
    shown = ", ".join(names[:limit])
    return f"[{shown}{f', ... ({len(names)} in all)' if len(names) > limit else ''}]"


def stack_layers(arrays: Mapping[Path, StoredArray]) -> dict[Path, StoredArray]:
    """`arrays` of the unscanned layout (`encoder/layers_{i}/...`) in the scanned one
    (`encoder/layers/...`, `[L, ...]`), without reading anything."""
    out: dict[Path, StoredArray] = {}
    groups: dict[Path, dict[int, StoredArray]] = {}
    for path, array in arrays.items():
        layer = re.fullmatch(r"layers_(\d+)", path[1]) if len(path) > 2 else None
        if layer and path[0] in ("encoder", "decoder"):
            groups.setdefault((path[0], "layers", *path[2:]), {})[int(layer.group(1))] = array
        else:
            out[path] = array
    for path, layers in groups.items():
        out[path] = stacked([layers[i] for i in range(len(layers))])
    return out


def read_values(arrays: Mapping[Path, StoredArray]) -> dict:
    """Every array read whole, as a nested dict (for the paths that merge values on the host:
    adapters, re-initialized groups)."""
    return _nested({path: array.read_all() for path, array in arrays.items()})
