"""Mesh TensorFlow checkpoints (the T5 paper's releases): TF bundles renamed onto T5X's names.

A Mesh TensorFlow checkpoint is a TF bundle (`checkpoint`, `model.ckpt-<step>.index`,
`.data-<i>-of-<n>` shards) of `mtf.transformer.Bitransformer` variables, often with the run's
`operative_config.gin` beside it. Its variables map onto t2t's (T5X's) tree by renaming alone:
q/k/v/o are `[d_model, heads * d_kv]` with 1/sqrt(d_kv) folded into q, as T5X's. The table
below covers the variants real releases use (`layer_norm` or `rms_norm`, `final_layer_norm`,
CamelCase or snake_case sublayers, `_slot_vr/_slot_vc/_slot_v/_slot_m`), and a position bias in
block 0 only (`bias_shared`, T5's). Anything else is named and refused.

TensorFlow's reader reads whole arrays, so each is read once and sliced for the devices
(`t2t.checkpoints.stored`).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from t2t import files
from t2t.checkpoints.stored import CheckpointMismatchError, Rule, StoredArray, rename

OPERATIVE_CONFIG = "operative_config.gin"
INDEX_SUFFIX = ".index"
_PREFIX = re.compile(r"(?P<stem>.+)-(?P<step>\d+)")
_DATA_SHARD = re.compile(r"\.data-(\d+)-of-(\d+)$")
_SLOT = re.compile(r"(?P<base>.+?)(?P<slot>_slot_(?:vr|vc|v|m))?")
_STACKS = "(encoder|decoder)"
_BLOCK = r"block_(\d+)/layer_(\d+)"
_SELF = "(?:SelfAttention|self_attention)"
_CROSS = "(?:EncDecAttention|enc_dec_attention|encdec_attention)"
_MLP = "(?:DenseReluDense|dense_relu_dense)"
_NORM = "(?:layer_norm|rms_norm)"
_MATRIX = {"q": "query", "k": "key", "v": "value", "o": "out"}
# The norm before each sublayer of a block, by the sublayer's index in the block.
_NORMS = {
    "encoder": ("pre_attention_layer_norm", "pre_mlp_layer_norm"),
    "decoder": (
        "pre_self_attention_layer_norm",
        "pre_cross_attention_layer_norm",
        "pre_mlp_layer_norm",
    ),
}


class MtfFormatError(ValueError):
    """A Mesh TensorFlow checkpoint that cannot be read (the message says why)."""


def _layer(match: re.Match, group: int) -> str:
    return f"layers_{int(match.group(group))}"


def _self_attention(m: re.Match) -> str:
    kind = "attention" if m.group(1) == "encoder" else "self_attention"
    return f"{m.group(1)}/{_layer(m, 2)}/{kind}/{_MATRIX[m.group(4)]}/kernel"


def _norm(m: re.Match) -> str:
    names = _NORMS[m.group(1)]
    index = int(m.group(3))
    if index >= len(names):
        return f"{m.group(1)}/{_layer(m, 2)}/unknown_norm_{index}/scale"  # fails the match
    return f"{m.group(1)}/{_layer(m, 2)}/{names[index]}/scale"


def _bias(m: re.Match) -> str:
    if int(m.group(2)) != 0:  # bias per layer ('bias', umT5's layout): not a t2t network
        return f"{m.group(1)}/{_layer(m, 2)}/relpos_bias/rel_embedding"
    return f"{m.group(1)}/relpos_bias/rel_embedding"


# Mesh TensorFlow variable (without its slot suffix) -> t2t parameter path.
RENAMES = (
    Rule(r"shared/embedding", "token_embedder/embedding"),
    Rule(rf"{_STACKS}/{_BLOCK}/{_SELF}/relative_attention_bias", _bias),
    Rule(rf"{_STACKS}/{_BLOCK}/{_SELF}/(q|k|v|o)", _self_attention),
    Rule(
        rf"decoder/{_BLOCK}/{_CROSS}/(q|k|v|o)",
        lambda m: f"decoder/{_layer(m, 1)}/encoder_decoder_attention/{_MATRIX[m.group(3)]}/kernel",
    ),
    Rule(
        rf"{_STACKS}/{_BLOCK}/{_MLP}/(wi|wi_0|wi_1|wo)/kernel",
        lambda m: f"{m.group(1)}/{_layer(m, 2)}/mlp/{m.group(4)}/kernel",
    ),
    Rule(rf"{_STACKS}/{_BLOCK}/{_NORM}/scale", _norm),
    Rule(rf"{_STACKS}/(?:final_layer_norm|{_NORM})/scale", r"\1/\1_norm/scale"),
    Rule(r"decoder/logits/kernel", "decoder/logits_dense/kernel"),
)


def resolve_prefix(path: str, step: int | None = None) -> str:
    """The bundle prefix (`.../model.ckpt-1000000`) of a checkpoint directory (its newest, or
    `step`) or of a prefix given as is.

    Raises:
      MtfFormatError: no such bundle (the message lists what the directory holds).
    """
    path = path.rstrip("/")
    if files.exists(path + INDEX_SUFFIX):
        return path
    if not files.isdir(path):
        raise MtfFormatError(
            f"{path} is neither a Mesh TensorFlow checkpoint directory nor a prefix."
        )
    prefixes = {}
    for name in files.listdir(path):
        if name.endswith(INDEX_SUFFIX):
            match = _PREFIX.fullmatch(name[: -len(INDEX_SUFFIX)])
            if match:
                prefixes[int(match.group("step"))] = files.join(path, name[: -len(INDEX_SUFFIX)])
    if not prefixes:
        raise MtfFormatError(
            f"{path} holds no TF bundle (`model.ckpt-<step>.index`); it holds {files.listdir(path)}."
        )
    if step is None:
        return prefixes[max(prefixes)]
    if step not in prefixes:
        raise MtfFormatError(f"{path} has no checkpoint of step {step}; it has {sorted(prefixes)}.")
    return prefixes[step]


def is_mtf(path: str) -> bool:
    """Whether `path` is a TF-bundle checkpoint directory or prefix."""
    try:
        resolve_prefix(path)
    except MtfFormatError:
        return False
    return True


def read(prefix: str, *, data: bool = True) -> tuple[dict[str, StoredArray], int]:
    """Every variable of the bundle at `prefix`, renamed to T5X's train-state names
    ('target/...', 'state/param_states/<path>/<slot>', 'state/step'), and the step.

    Args:
      prefix: the bundle prefix (`resolve_prefix`).
      data: require every data shard (False: names and shapes from the index alone, e.g.
        to check a checkpoint's names before copying its data; the step is then the name's).

    Raises:
      MtfFormatError: a missing data shard, or an index TensorFlow cannot read.
      CheckpointMismatchError: variables the rename table does not know.
    """
    if data:
        _check_shards(prefix)
    reader = _reader(prefix)
    shapes = reader.get_variable_to_shape_map()
    dtypes = reader.get_variable_to_dtype_map()
    stored = {name: _variable(reader, name, shapes[name], dtypes[name], prefix) for name in shapes}
    step = _step(prefix)
    if "global_step" in stored:
        global_step = stored.pop("global_step")
        step = int(global_step.read_all()) if data else step
    params, slots = {}, {}
    for name, array in stored.items():
        parts = _SLOT.fullmatch(name)
        (slots if parts.group("slot") else params)[name] = (
            parts.group("base"),
            parts.group("slot"),
        )
    renamed = rename({name: stored[name] for name in params}, RENAMES, prefix)
    arrays = {f"target/{path}": array for path, array in renamed.items()}
    base_to_path = {array.name: path for path, array in renamed.items()}
    for name, (base, slot) in slots.items():
        if base not in base_to_path:
            raise CheckpointMismatchError(
                f"{prefix}: the optimizer slot {name} belongs to no variable of the checkpoint."
            )
        shape = tuple(stored[base].shape)
        kind = slot_name(slot, shape)
        arrays[f"state/param_states/{base_to_path[base]}/{kind}"] = stored[name]
    return arrays, step


def slot_name(slot: str, shape: tuple[int, ...]) -> str:
    """The T5X/optax Adafactor slot that a Mesh TensorFlow slot of a `shape` variable is.

    Both keep, for a factored matrix, the mean of the squared gradient over one dimension
    (the vector indexed by the other): MTF's `_slot_vr` drops the largest dimension, T5X's
    and optax's `v_row` too, but when two dimensions tie MTF drops the first and optax the
    last. So for a square kernel MTF's `_slot_vr` is optax's `v_col`; otherwise names agree.
    """
    if slot == "_slot_v":
        return "v"
    if slot == "_slot_m":
        return "m"
    if len(shape) < 2:
        raise MtfFormatError(f"A factored slot {slot} of a {len(shape)}-d variable {shape}.")
    mtf_dropped = max(range(len(shape)), key=lambda i: (shape[i], -i))  # first of the largest
    optax_dropped = int(np.argsort(shape, kind="stable")[-1])  # last of the largest
    dropped = mtf_dropped if slot == "_slot_vr" else _second_largest(shape, mtf_dropped)
    if dropped == optax_dropped:
        return "v_row"
    return "v_col"


def _second_largest(shape: tuple[int, ...], largest: int) -> int:
    rest = [i for i in range(len(shape)) if i != largest]
    return max(rest, key=lambda i: (shape[i], -i))


def _check_shards(prefix: str) -> None:
    if not files.exists(prefix + INDEX_SUFFIX):
        raise MtfFormatError(f"{prefix}{INDEX_SUFFIX} does not exist.")
    found = {}
    for path in files.glob(prefix + ".data-*"):
        match = _DATA_SHARD.search(path)
        if match:
            found[int(match.group(1))] = int(match.group(2))
    total = set(found.values())
    if not found or len(total) != 1:
        raise MtfFormatError(
            f"{prefix}: its data shards ({prefix}.data-<i>-of-<n>) are missing or of different "
            f"counts ({sorted(files.basename(p) for p in files.glob(prefix + '.data-*'))}); copy "
            "every file of the checkpoint."
        )
    (count,) = total
    absent = [i for i in range(count) if i not in found]
    if absent:
        names = ", ".join(f"{files.basename(prefix)}.data-{i:05d}-of-{count:05d}" for i in absent)
        raise MtfFormatError(
            f"{prefix}: the index names {count} data shards and {names} is missing; copy every "
            "file of the checkpoint (the index alone holds only names and shapes)."
        )


def _reader(prefix: str):
    import tensorflow as tf

    try:
        return tf.train.load_checkpoint(prefix)
    except Exception as error:  # noqa: BLE001 (tf.errors.* and ValueError)
        raise MtfFormatError(
            f"{prefix}: TensorFlow cannot read this checkpoint's index "
            f"({str(error).strip().splitlines()[0][:200]})."
        ) from None


def _variable(reader, name: str, shape: list[int], dtype: Any, prefix: str) -> StoredArray:
    def read(index) -> np.ndarray:
        try:
            value = reader.get_tensor(name)
        except Exception as error:  # noqa: BLE001 (tf.errors.DataLossError, NotFoundError)
            raise MtfFormatError(
                f"{prefix}: reading {name} failed ({str(error).strip().splitlines()[0][:200]}); "
                "a data shard is damaged or truncated."
            ) from None
        return np.asarray(value)[index]

    return StoredArray(name, tuple(shape), np.dtype(dtype.as_numpy_dtype), read, sliceable=False)


def _step(prefix: str) -> int:
    match = _PREFIX.fullmatch(files.basename(prefix))
    return int(match.group("step")) if match else 0


# -- the run's record: operative_config.gin ---------------------------------------------------


def read_operative_config(prefix: str) -> dict[str, Any] | None:
    """The network fields the `operative_config.gin` beside a checkpoint binds (None: no file).

    Returns the `TransformerConfig` fields it determines: d_model, num_heads, d_kv, d_ff,
    layer counts, mlp_activations, logits_via_embedding, relative_attention_num_buckets and
    layer_norm_epsilon; a field the file does not bind is left out (the shapes decide it).

    Raises:
      MtfFormatError: a binding t2t's network cannot express (per-layer position biases,
        another attention type), or a file gin cannot parse.
    """
    path = files.join(files.parent(prefix), OPERATIVE_CONFIG)
    if not files.exists(path):
        return None
    bindings = _parse_gin(files.read_text(path), path)
    fields: dict[str, Any] = {}

    def value(selector: str, arg: str, scope: str = "encoder"):
        for key in ((scope, selector, arg), ("", selector, arg)):
            if key in bindings:
                return bindings[key]
        return None

    for field, selector, arg in (
        ("d_model", "Unitransformer", "d_model"),
        ("num_heads", "SelfAttention", "num_heads"),
        ("d_kv", "SelfAttention", "key_value_size"),
        ("d_ff", "DenseReluDense", "hidden_size"),
        ("num_encoder_layers", "make_layer_stack", "num_layers"),
        ("relative_attention_num_buckets", "SelfAttention", "relative_attention_num_buckets"),
        ("layer_norm_epsilon", "sublayer_rms_norm", "epsilon"),
    ):
        found = value(selector, arg)
        if found is not None:
            fields[field] = found
    decoder_layers = value("make_layer_stack", "num_layers", "decoder")
    if decoder_layers is not None:
        fields["num_decoder_layers"] = decoder_layers
    activation = value("DenseReluDense", "activation")
    if activation is not None:
        fields["mlp_activations"] = _activations(activation, path)
    tied = value("Unitransformer", "shared_embedding_and_softmax_weights", "decoder")
    if tied is not None:
        fields["logits_via_embedding"] = bool(tied)
    for scope in ("encoder", "decoder"):
        kind = value("SelfAttention", "relative_attention_type", scope)
        if kind not in (None, "bias_shared"):
            raise MtfFormatError(
                f"{path}: {scope}/SelfAttention.relative_attention_type = {kind!r}; t2t's network "
                "has one relative position bias per stack ('bias_shared', T5's), not "
                f"{kind!r} (per-layer biases are umT5's layout)."
            )
    return fields


def _activations(value: Any, path: str) -> tuple[str, ...]:
    names = tuple([value] if isinstance(value, str) else value)
    known = {
        ("relu",): ("relu",),
        ("gelu", "linear"): ("gelu", "linear"),
        ("relu", "linear"): ("relu", "linear"),
        ("silu", "linear"): ("silu", "linear"),
        ("swish", "linear"): ("silu", "linear"),
    }
    if names not in known:
        raise MtfFormatError(
            f"{path}: DenseReluDense.activation = {value!r} is not an activation t2t has."
        )
    return known[names]


def _parse_gin(text: str, path: str) -> dict[tuple[str, str, str], Any]:
    """(scope, selector's last name, argument) -> value of every binding, macros resolved."""
    from gin import config_parser

    class Delegate(config_parser.ParserDelegate):
        def configurable_reference(self, scoped_name, evaluate):
            return ("@", scoped_name)

        def macro(self, name):
            return ("%", name)

    raw = {}
    macros = {}
    try:
        for statement in config_parser.ConfigParser(text, Delegate()):
            if not isinstance(statement, config_parser.BindingStatement):
                continue
            if not statement.arg_name:
                macros[statement.selector] = statement.value
                continue
            raw[(statement.scope or "", statement.selector.split(".")[-1], statement.arg_name)] = (
                statement.value
            )
    except SyntaxError as error:
        raise MtfFormatError(f"{path} is not a gin file gin can parse ({error}).") from None

    def resolve(value):
        while isinstance(value, tuple) and len(value) == 2 and value[0] == "%":
            value = macros.get(value[1])
        return value

    return {key: resolve(value) for key, value in raw.items()}
