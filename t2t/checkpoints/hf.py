"""HF transformers interop: import a T5 directory into t2t parameters and export back.

A HF T5 directory is `config.json` plus `model.safetensors` (or sharded safetensors with
`model.safetensors.index.json`). Both T5 v1.0 (ReLU, tied logits) and v1.1 (gated GELU, separate
`lm_head`) layouts are supported. Export writes the same layout with numpy (`safetensors.numpy`),
so no torch is needed; `transformers.T5ForConditionalGeneration.from_pretrained` loads it.

`rename_table(config)` is the single source of truth for both directions: one row per parameter,
pairing the t2t path with the HF key and saying whether the array is transposed (HF linear weights
are `[out, in]`, t2t kernels `[in, out]`; HF's relative bias is `[U, N]`, t2t's `[N, U]`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping

import numpy as np
from flax import nnx

from t2t import files
from t2t import nn as t2t_nn
from t2t.checkpoints.stored import Index, StoredArray
from t2t.nn.config import TransformerConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"

# HF `feed_forward_proj` <-> t2t `mlp_activations`.
_FEED_FORWARD = {
    "relu": ("relu",),
    "gated-gelu": ("gelu", "linear"),
    "gated-relu": ("relu", "linear"),
    "gated-silu": ("silu", "linear"),
}
_SUPPORTED_MODEL_TYPES = ("t5", "mt5")
# Copies of `shared.weight` that some HF files carry; accepted on import when equal to it.
_EMBEDDING_ALIASES = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")
# Left over in old HF checkpoints and never used by HF either.
_IGNORED_KEYS = ("decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight",)


@dataclasses.dataclass(frozen=True)
class Rename:
    """One parameter: its t2t path, its HF key, and whether the array is transposed."""

    path: tuple[str, ...]
    hf_key: str
    transpose: bool


def _attention(path, hf_prefix):
    return [
        Rename((*path, ours, "kernel"), f"{hf_prefix}.{theirs}.weight", True)
        for ours, theirs in (("query", "q"), ("key", "k"), ("value", "v"), ("out", "o"))
    ]


def _mlp(path, hf_prefix, config):
    names = ("wi",) if len(config.mlp_activations) == 1 else ("wi_0", "wi_1")
    return [
        Rename((*path, name, "kernel"), f"{hf_prefix}.DenseReluDense.{name}.weight", True)
        for name in (*names, "wo")
    ]


def _norm(path, hf_key):
    return Rename((*path, "scale"), hf_key, False)


def rename_table(config: TransformerConfig) -> list[Rename]:
    """Every parameter of the encoder-decoder built from `config`, paired with its HF key."""
    _check_exportable(config)
    rows = [Rename(("token_embedder", "embedding"), "shared.weight", False)]
    for i in range(config.num_encoder_layers):
        ours, theirs = ("encoder", f"layers_{i}"), f"encoder.block.{i}.layer"
        rows += _attention((*ours, "attention"), f"{theirs}.0.SelfAttention")
        rows.append(_norm((*ours, "pre_attention_layer_norm"), f"{theirs}.0.layer_norm.weight"))
        rows += _mlp((*ours, "mlp"), f"{theirs}.1", config)
        rows.append(_norm((*ours, "pre_mlp_layer_norm"), f"{theirs}.1.layer_norm.weight"))
    for i in range(config.num_decoder_layers):
        ours, theirs = ("decoder", f"layers_{i}"), f"decoder.block.{i}.layer"
        rows += _attention((*ours, "self_attention"), f"{theirs}.0.SelfAttention")
        rows.append(
            _norm((*ours, "pre_self_attention_layer_norm"), f"{theirs}.0.layer_norm.weight")
        )
        rows += _attention((*ours, "encoder_decoder_attention"), f"{theirs}.1.EncDecAttention")
        rows.append(
            _norm((*ours, "pre_cross_attention_layer_norm"), f"{theirs}.1.layer_norm.weight")
        )
        rows += _mlp((*ours, "mlp"), f"{theirs}.2", config)
        rows.append(_norm((*ours, "pre_mlp_layer_norm"), f"{theirs}.2.layer_norm.weight"))
    for stack in ("encoder", "decoder"):
        rows.append(_norm((stack, f"{stack}_norm"), f"{stack}.final_layer_norm.weight"))
        rows.append(
            Rename(
                (stack, "relpos_bias", "rel_embedding"),
                f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                True,
            )
        )
    if not config.logits_via_embedding:
        rows.append(Rename(("decoder", "logits_dense", "kernel"), "lm_head.weight", True))
    return rows


def _check_exportable(config: TransformerConfig) -> None:
    if config.architecture != "encoder_decoder":
        raise ValueError(
            f"HF T5 has only the plain encoder-decoder layout; architecture "
            f"{config.architecture!r} cannot be converted (supported: 'encoder_decoder')."
        )
    unmergeable = {k: v for k, v in config.additions.items() if k != "lora_rank"}
    if unmergeable:
        raise ValueError(
            f"HF T5 has no adapter layers or soft prompts, and this network has {unmergeable}; "
            "they cannot be folded into T5's weights (LoRA can, and is merged on export). Use "
            "the t2t checkpoint itself (t2t infer / t2t eval)."
        )


def config_from_hf(hf_config: Mapping, **overrides) -> TransformerConfig:
    """The t2t config of a HF T5 `config.json` (a dict).

    Raises:
      ValueError: a model type or feed-forward projection t2t does not support.
    """
    model_type = hf_config.get("model_type", "t5")
    if model_type not in _SUPPORTED_MODEL_TYPES:
        raise ValueError(
            f"config.json model_type={model_type!r} is not supported; supported: "
            f"{_SUPPORTED_MODEL_TYPES}."
        )
    if hf_config.get("is_encoder_decoder", True) is False:
        raise ValueError(
            "config.json is_encoder_decoder=false is not supported (T5 is encoder-decoder)."
        )
    projection = hf_config.get("feed_forward_proj", "relu")
    if projection not in _FEED_FORWARD:
        raise ValueError(
            f"config.json feed_forward_proj={projection!r} is not supported; supported: "
            f"{sorted(_FEED_FORWARD)}."
        )
    num_layers = hf_config.get("num_layers", 6)
    fields = dict(
        vocab_size=hf_config.get("vocab_size", 32128),
        d_model=hf_config.get("d_model", 512),
        d_ff=hf_config.get("d_ff", 2048),
        d_kv=hf_config.get("d_kv", 64),
        num_heads=hf_config.get("num_heads", 8),
        num_encoder_layers=num_layers,
        num_decoder_layers=hf_config.get("num_decoder_layers") or num_layers,
        mlp_activations=_FEED_FORWARD[projection],
        logits_via_embedding=_scales_decoder_output(hf_config),
        dropout_rate=float(hf_config.get("dropout_rate", 0.1)),
        relative_attention_num_buckets=hf_config.get("relative_attention_num_buckets", 32),
        relative_attention_max_distance=hf_config.get("relative_attention_max_distance", 128),
        layer_norm_epsilon=float(hf_config.get("layer_norm_epsilon", 1e-6)),
    )
    fields.update(overrides)
    return TransformerConfig(**fields)


def _scales_decoder_output(hf_config: Mapping) -> bool:
    # NOTE: transformers >= 5 writes `scale_decoder_outputs` (and always tie_word_embeddings=true);
    # older files (and the released v1.1 checkpoints) say tie_word_embeddings=false instead.
    if "scale_decoder_outputs" in hf_config:
        return bool(hf_config["scale_decoder_outputs"])
    return hf_config.get("tie_word_embeddings", True) is not False


def hf_config_from_config(config: TransformerConfig) -> dict:
    """The HF `config.json` dict for a t2t encoder-decoder config."""
    _check_exportable(config)
    projection = {v: k for k, v in _FEED_FORWARD.items()}[config.mlp_activations]
    return {
        "architectures": ["T5ForConditionalGeneration"],
        "model_type": "t5",
        "vocab_size": config.vocab_size,
        "d_model": config.d_model,
        "d_ff": config.d_ff,
        "d_kv": config.d_kv,
        "num_heads": config.num_heads,
        "num_layers": config.num_encoder_layers,
        "num_decoder_layers": config.num_decoder_layers,
        "feed_forward_proj": projection,
        "is_gated_act": len(config.mlp_activations) == 2,
        "dense_act_fn": {"relu": "relu", "gelu": "gelu_new", "silu": "silu"}[
            config.mlp_activations[0]
        ],
        "tie_word_embeddings": config.logits_via_embedding,
        "scale_decoder_outputs": config.logits_via_embedding,
        "dropout_rate": config.dropout_rate,
        "relative_attention_num_buckets": config.relative_attention_num_buckets,
        "relative_attention_max_distance": config.relative_attention_max_distance,
        "layer_norm_epsilon": config.layer_norm_epsilon,
        "initializer_factor": 1.0,
        "is_encoder_decoder": True,
        "use_cache": True,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "decoder_start_token_id": 0,
        "dtype": "float32",
    }


def params_from_hf(tensors: Mapping[str, np.ndarray], config: TransformerConfig) -> nnx.State:
    """HF T5 tensors -> the parameter state of `t2t.nn.build(config)`.

    Args:
      tensors: HF key -> array (as `safetensors.numpy.load_file` returns).
      config: the t2t config (e.g. from `config_from_hf`).

    Returns:
      An `nnx.State` of `nnx.Param`s (with logical axis names) holding numpy arrays in
      `config.param_dtype`, in `config`'s layer layout (scanned or not); `nnx.merge(graphdef,
      state)` gives the model.

    Raises:
      ValueError: missing or unknown keys, or a shape that does not match the config.
    """
    layout, config = config, config.replace(scan_layers=False)  # HF's layers are one by one
    table = rename_table(config)
    tensors = _drop_aliases(dict(tensors), config)
    _check_keys(tensors, table)
    state = abstract_state(config)
    pure = state.to_pure_dict()
    for row in table:
        target = _get(pure, row.path)
        array = np.asarray(tensors[row.hf_key])
        array = array.T if row.transpose else array
        if array.shape != tuple(target.shape):
            theirs = tuple(reversed(target.shape)) if row.transpose else tuple(target.shape)
            raise ValueError(
                f"{row.hf_key}: expected shape {theirs} for this config, got "
                f"{tuple(tensors[row.hf_key].shape)}."
            )
        _set(pure, row.path, array.astype(target.dtype))
    nnx.replace_by_pure_dict(state, pure)
    return t2t_nn.to_layout(state, layout) if layout.scan_layers else state


def params_to_hf(state: nnx.State | Mapping, config: TransformerConfig) -> dict[str, np.ndarray]:
    """The parameter state of a t2t encoder-decoder (either layer layout) -> HF key -> numpy
    array (contiguous)."""
    pure = state.to_pure_dict() if isinstance(state, nnx.State) else state
    _check_exportable(config)
    pure, config = t2t_nn.merge_lora(pure, config)  # W + (alpha / r) A B: a plain T5 kernel
    pure = t2t_nn.unstack_layers(pure)  # scanned layers stacked [L, ...] -> one by one
    table = rename_table(config.replace(scan_layers=False))
    tensors = {}
    for row in table:
        try:
            array = np.asarray(_get(pure, row.path))
        except KeyError:
            raise ValueError(
                f"The state has no parameter {'/'.join(row.path)}, which config needs; is it the "
                "state of t2t.nn.build(config)?"
            ) from None
        tensors[row.hf_key] = np.ascontiguousarray(array.T if row.transpose else array)
    known = {row.path for row in table}
    extra = sorted("/".join(p) for p in _paths(pure) if p not in known)
    if extra:
        raise ValueError(f"The state has parameters the config does not describe: {extra[:8]}.")
    return tensors


def _check_keys(tensors: Mapping, table: list[Rename]) -> None:
    expected = {row.hf_key for row in table}
    missing = sorted(expected - set(tensors))
    unknown = sorted(set(tensors) - expected)
    if missing or unknown:
        raise ValueError(
            "The HF tensors do not match the config: "
            f"missing {missing[:8]}{' ...' if len(missing) > 8 else ''} ({len(missing)}), "
            f"unknown {unknown[:8]}{' ...' if len(unknown) > 8 else ''} ({len(unknown)}). "
            "Check that config.json belongs to these weights (num_layers, num_decoder_layers, "
            "feed_forward_proj, tie_word_embeddings)."
        )


def abstract_state(config: TransformerConfig) -> nnx.State:
    """The parameter state of `t2t.nn.build(config)` as shapes only (no memory)."""
    model = nnx.eval_shape(lambda: t2t_nn.build(config, nnx.Rngs(0)))
    return nnx.state(model, nnx.Param)


def import_hf(directory: str | os.PathLike, **overrides) -> tuple[TransformerConfig, nnx.State]:
    """Reads a HF T5 directory.

    Args:
      directory: holds `config.json` and `model.safetensors` (or an index and its shards).
      **overrides: t2t config fields to change, e.g. `dropout_rate=0.0`, `dtype="bfloat16"`.

    Returns:
      The t2t config and the parameter state for `t2t.nn.build(config)`.
    """
    raw = _read_config(directory)
    config = config_from_hf(raw, **overrides)
    return config, params_from_hf(_load_tensors(directory), config)


def open_hf(directory: str | os.PathLike, **overrides) -> tuple[TransformerConfig, dict]:
    """A HF T5 directory's network and its parameters, not read yet: t2t path ('/'-joined,
    unscanned) -> `StoredArray` reading only the rows of each safetensors array a slice needs
    (local or gs://), transposed to t2t's layout. `import_hf`'s checks, without its memory.

    Raises:
      ValueError: missing or unknown tensors, or a shape that does not match the config.
    """
    config = config_from_hf(_read_config(directory), **overrides)
    plain = config.replace(scan_layers=False)
    tensors = _lazy_tensors(directory)
    tensors = _drop_aliases(
        tensors, plain, equal=lambda a, b: np.array_equal(a.read_all(), b.read_all())
    )
    table = rename_table(plain)
    _check_keys(tensors, table)
    arrays = {}
    for row in table:
        array = tensors[row.hf_key]
        arrays["/".join(row.path)] = _transposed(array) if row.transpose else array
    return config, arrays


def _lazy_tensors(directory) -> dict[str, StoredArray]:
    single = files.join(directory, WEIGHTS_FILE)
    if files.exists(single):
        shards = [single]
    else:
        index = json.loads(files.read_text(_require(directory, WEIGHTS_INDEX_FILE)))
        shards = [files.join(directory, s) for s in sorted(set(index["weight_map"].values()))]
    tensors = {}
    for shard in shards:
        tensors.update(_safetensors_arrays(shard))
    return tensors


# safetensors dtype names -> numpy (bfloat16 through ml_dtypes, as jax's).
_SAFETENSORS_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}


def _safetensors_arrays(path: str) -> dict[str, StoredArray]:
    """The tensors of one safetensors file, each read by rows: an 8-byte header length, a JSON
    header of dtype, shape and byte offsets, then the C-order data."""
    import ml_dtypes  # noqa: F401 (registers bfloat16 with numpy)

    with files.open_file(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{path} is not a safetensors file (it is {len(head)} bytes long).")
        length = int.from_bytes(head, "little")
        try:
            header = json.loads(f.read(length))
        except ValueError:
            raise ValueError(f"{path}: its safetensors header is damaged or truncated.") from None
    size = files.size(path)
    start = 8 + length
    arrays = {}
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if entry["dtype"] not in _SAFETENSORS_DTYPES:
            raise ValueError(f"{path}: {key} is {entry['dtype']}, not a floating-point tensor.")
        dtype = np.dtype(_SAFETENSORS_DTYPES[entry["dtype"]])
        begin, end = entry["data_offsets"]
        if start + end > size:
            raise ValueError(
                f"{path} is truncated: {key} ends at byte {start + end}, the file has {size}."
            )
        arrays[key] = _rows_reader(path, key, tuple(entry["shape"]), dtype, start + begin)
    return arrays


def _rows_reader(path, key, shape, dtype, offset) -> StoredArray:
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize

    def read(index: Index) -> np.ndarray:
        rows = range(shape[0])[index[0]] if shape else range(1)
        first, last = (rows.start, rows.stop) if rows.step == 1 else (0, shape[0])
        with files.open_file(path, "rb") as f:
            f.seek(offset + first * row_bytes)
            data = f.read((last - first) * row_bytes)
        block = np.frombuffer(data, dtype).reshape((last - first, *shape[1:]) if shape else ())
        if not shape:
            return block
        local = slice(rows.start - first, rows.stop - first, rows.step)
        return block[(local, *index[1:])]

    return StoredArray(f"{path}:{key}", shape, dtype, read)


def _transposed(array: StoredArray) -> StoredArray:
    """A 2-D array seen as its transpose, still read slice by slice."""
    return StoredArray(
        array.name,
        tuple(reversed(array.shape)),
        array.dtype,
        lambda index: array.read(tuple(reversed(index))).T,
        array.sliceable,
    )


def _read_config(directory) -> dict:
    path = _require(directory, CONFIG_FILE)
    try:
        raw = json.loads(files.read_bytes(path).decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}); a HF T5 directory's config.json "
            "is written by `save_pretrained` or `t2t export`."
        ) from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} holds {type(raw).__name__}, not the JSON object of a HF config.")
    return raw


def load_hf_model(directory: str | os.PathLike, **overrides) -> nnx.Module:
    """A ready t2t `EncoderDecoder` with the weights of a HF T5 directory."""
    config, state = import_hf(directory, **overrides)
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: t2t_nn.build(config, nnx.Rngs(0))))
    return nnx.merge(graphdef, state)


def export_hf(
    directory: str | os.PathLike, config: TransformerConfig, state: nnx.State | Mapping
) -> None:
    """Writes `config.json` and `model.safetensors` that HF transformers loads.

    Args:
      directory: created if missing.
      config: the t2t config (architecture 'encoder_decoder').
      state: the model's parameters (`nnx.state(model, nnx.Param)` or its pure dict).
    """
    from safetensors.numpy import save

    tensors = params_to_hf(state, config)  # tied: HF ties lm_head to shared.weight itself
    files.makedirs(directory)
    hf_config = hf_config_from_config(config.replace(lora_rank=0))
    files.write_text(
        files.join(directory, CONFIG_FILE), json.dumps(hf_config, indent=2, sort_keys=True)
    )
    files.write_bytes(files.join(directory, WEIGHTS_FILE), save(tensors, metadata={"format": "pt"}))


def _drop_aliases(tensors: dict, config: TransformerConfig, equal=np.array_equal) -> dict:
    shared = tensors.get("shared.weight")
    aliases = list(_EMBEDDING_ALIASES)
    if config.logits_via_embedding:
        aliases.append("lm_head.weight")
    for key in aliases:
        if key in tensors and shared is not None:
            if not equal(tensors[key], shared):
                raise ValueError(
                    f"{key} differs from shared.weight, but this config ties it to the shared "
                    "embedding. For separate output logits set tie_word_embeddings=false in "
                    "config.json."
                )
            del tensors[key]
    if not config.logits_via_embedding and "lm_head.weight" not in tensors and shared is not None:
        # NOTE: transformers >= 5 saves an untied-by-config model whose lm_head still shares
        # storage with the embedding without lm_head.weight; its logits use the embedding
        # unscaled, which is a logits_dense kernel equal to the embedding's transpose.
        tensors["lm_head.weight"] = shared
    for key in _IGNORED_KEYS:
        tensors.pop(key, None)
    return tensors


def _load_tensors(directory) -> dict[str, np.ndarray]:
    from safetensors.numpy import load

    single = files.join(directory, WEIGHTS_FILE)
    if files.exists(single):
        return load(files.read_bytes(single))
    index = json.loads(files.read_text(_require(directory, WEIGHTS_INDEX_FILE)))
    tensors = {}
    for shard in sorted(set(index["weight_map"].values())):
        tensors.update(load(files.read_bytes(files.join(directory, shard))))
    return tensors


def _require(directory, name) -> str:
    path = files.join(directory, name)
    if not files.exists(path):
        found = files.listdir(directory) if files.isdir(directory) else "no such directory"
        raise FileNotFoundError(
            f"{path} not found (directory holds: {found}). A HF T5 directory needs config.json "
            f"and {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}; pytorch_model.bin is not read."
        )
    return path


def _get(tree, path):
    for name in path:
        tree = tree[name]
    return tree


def _set(tree, path, value):
    for name in path[:-1]:
        tree = tree[name]
    tree[path[-1]] = value


def _paths(tree, prefix=()):
    for name, value in tree.items():
        if isinstance(value, Mapping):
            yield from _paths(value, (*prefix, name))
        else:
            yield (*prefix, name)
