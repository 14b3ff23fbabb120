"""Checksums of a checkpoint's contents, so a damaged checkpoint is found instead of trained on.

Orbax writes arrays without checksums: a flipped bit in an array file comes back as a wrong value
and random bytes as NaN, silently. t2t records, with every checkpoint,

- a fingerprint of every array's values (parameters and optimizer state), computed on the
  devices from the arrays being saved and kept in the step's metadata item. The fingerprint is
  the position-weighted sum of the array's bit patterns modulo 2^32, with an odd weight for each
  position, so it does not depend on the layout of shards (a checkpoint written on one mesh is
  verified on another), any single flipped bit changes it, and random damage escapes it with
  probability 2^-32. It is one fused reduction per array: no copy, no host transfer.
- the SHA-256 of every file of each host's data-iterator state, written after those files.

Orbax renames a step into place only when every item is complete, so a checkpoint's data and
its checksums become visible together. A restore recomputes the fingerprints of what it read and
raises `CorruptCheckpointError` naming the step, the item and the arrays that differ.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from t2t import files

ALGORITHM = "t2t-fingerprint-v1"  # position-weighted uint32 sum of bit patterns
_GOLDEN = np.uint32(0x9E3779B1)  # odd multipliers: every position gets an odd weight
_OFFSET = np.uint32(0x7F4A7C15)
_UNSIGNED = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}


class CorruptCheckpointError(ValueError):
    """A checkpoint that cannot be read, or whose contents differ from its checksums.

    Attributes:
      step: the checkpoint's step.
      item: what was damaged ("params", "opt_state", "data_iterator", "metadata").
      detail: what was found (the arrays or files that differ, or the reader's error).
    """

    def __init__(self, directory: str, step: int, item: str, detail: str):
        self.directory, self.step, self.item, self.detail = directory, step, item, detail
        super().__init__(
            f"The checkpoint of step {step} in {directory} is damaged ({item}): {detail}"
        )


def leaf_name(path: tuple) -> str:
    """A key path as "a/b/0/c", the same for dicts, attributes (named tuples) and sequences."""
    parts = []
    for key in path:
        for attribute in ("key", "name", "idx"):
            if hasattr(key, attribute):
                parts.append(str(getattr(key, attribute)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _fingerprint(x: jax.Array) -> jax.Array:
    """The position-weighted sum (mod 2^32) of the bit patterns of `x`'s elements."""
    if x.dtype == jnp.bool_:
        bits = x.astype(jnp.uint32)
    else:
        size = x.dtype.itemsize
        if size == 8:  # two 32-bit halves per element, a trailing axis of 2
            bits = jax.lax.bitcast_convert_type(x, jnp.uint32)
        else:
            bits = jax.lax.bitcast_convert_type(x, _UNSIGNED[size]).astype(jnp.uint32)
    position = jnp.zeros(bits.shape, jnp.uint32)
    stride = np.uint32(1)
    for axis in reversed(range(bits.ndim)):
        position = position + jax.lax.broadcasted_iota(jnp.uint32, bits.shape, axis) * stride
        stride = np.uint32((int(stride) * bits.shape[axis]) % 2**32)
    weight = (position * _GOLDEN + _OFFSET) | np.uint32(1)
    return jnp.sum(bits * weight, dtype=jnp.uint32)


@functools.partial(jax.jit)
def _fingerprints(leaves: list[jax.Array]) -> list[jax.Array]:
    return [_fingerprint(x) for x in leaves]


def fingerprints(tree: Any) -> dict[str, str]:
    """{leaf name: 8 hex digits} for every array of `tree` (jax or numpy arrays, any sharding)."""
    flat = [
        (leaf_name(path), leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]
        if hasattr(leaf, "shape") and hasattr(leaf, "dtype")
    ]
    if not flat:
        return {}
    leaves = [jnp.asarray(leaf) if isinstance(leaf, np.ndarray) else leaf for _, leaf in flat]
    values = []
    for group in _groups(leaves):
        values += jax.device_get(_fingerprints(group))

    return {name: f"{int(value):08x}" for (name, _), value in zip(flat, values)}


# NOTE: one program over every array of a large checkpoint holds buffers for all of their
# intermediates at once (on a 2.3 GB checkpoint, about its size again): arrays go in groups.
_GROUP_BYTES = 64 * 1024 * 1024


def _groups(leaves: list) -> list[list]:
    """`leaves` in consecutive groups of at most `_GROUP_BYTES` (a larger leaf alone)."""
    groups, current, size = [], [], 0
    for leaf in leaves:
        nbytes = int(np.prod(leaf.shape, dtype=np.int64)) * leaf.dtype.itemsize
        if current and size + nbytes > _GROUP_BYTES:
            groups.append(current)
            current, size = [], 0
        current.append(leaf)
        size += nbytes
    return [*groups, current] if current else groups


def mismatches(expected: Mapping[str, str], tree: Any) -> list[str]:
    """The leaves of `tree` whose fingerprint differs from `expected` (or that are missing)."""
    actual = fingerprints(tree)
    wrong = [name for name, digest in expected.items() if actual.get(name) != digest]
    return sorted(wrong)


def describe(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    verb = "arrays differ from their" if len(names) != 1 else "array differs from its"
    return f"{len(names)} {verb} checksums: {shown}{more}"


# -- files (the data-iterator state) --------------------------------------------------------------

_DIGESTS_SUFFIX = ".sha256.json"


def digests_path(directory: str) -> str:
    return files.absolute(directory) + _DIGESTS_SUFFIX


def write_file_digests(directory: str) -> None:
    """Writes the SHA-256 of every file under `directory` beside it (`<directory>.sha256.json`)."""
    record = {"algorithm": "sha256", "files": _digests(directory)}
    files.write_text(digests_path(directory), json.dumps(record, indent=1, sort_keys=True))


def verify_file_digests(directory: str) -> list[str]:
    """The files under `directory` that differ from, or are missing beside, their recorded
    digests (empty when they all match, or when no digests were recorded)."""
    path = digests_path(directory)
    if not files.exists(path):
        return []
    try:
        expected = json.loads(files.read_text(path))["files"]
    except (OSError, ValueError, KeyError) as error:
        return [f"{files.basename(path)} ({error})"]
    actual = _digests(directory)
    return sorted(name for name, digest in expected.items() if actual.get(name) != digest)


def _digests(directory: str) -> dict[str, str]:
    return {
        name: hashlib.sha256(files.read_bytes(files.join(directory, *name.split("/")))).hexdigest()
        for name in files.files_under(directory)
    }
