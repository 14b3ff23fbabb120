"""Checkpoints other frameworks wrote (T5X, T5X on Orbax, Mesh TensorFlow): found, their network
worked out, their arrays paired with t2t's parameters.

`open_checkpoint(path)` detects the format from the files, reads the names, shapes and dtypes of
every array (no values yet), renames them onto t2t's tree (T5X's names are t2t's; Mesh
TensorFlow's go through `mtf.RENAMES`) and works out the network:

- from the checkpoint's own record where it has one (`operative_config.gin` beside a Mesh
  TensorFlow checkpoint), checked against the shapes;
- else from the shapes: layers, d_model, heads (the relative bias is [heads, buckets]), d_kv,
  d_ff, gated or plain MLP, separate or tied logits, vocabulary size;
- what neither tells (the gated MLP's activation, the bias's max distance, the norm's epsilon)
  from the T5 families' defaults (`FAMILY_DEFAULTS`), said in `Released.assumed` and
  overridable like any field.

The values are read later, straight into the run's shards (`stored.place`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from t2t import files
from t2t.checkpoints import mtf, t5x
from t2t.checkpoints.stored import CheckpointMismatchError, StoredArray
from t2t.nn.config import TransformerConfig

T5X = "t5x"
T5X_ORBAX = "t5x_orbax"
MTF = "mtf"
FORMATS = (T5X, T5X_ORBAX, MTF)
_TARGET = "target/"
_SLOTS = "state/param_states/"
_LAYER = re.compile(r"(encoder|decoder)/layers_(\d+)/")
# What the shapes of a T5 checkpoint cannot tell, by family (docs/model.md lists the releases).
FAMILY_DEFAULTS = {
    "gated": dict(mlp_activations=("gelu", "linear")),  # T5.1.1, LM-adapted, Flan-T5, mT5, ByT5
    "plain": dict(mlp_activations=("relu",)),  # T5 1.0
    "all": dict(relative_attention_max_distance=128, layer_norm_epsilon=1e-6, dropout_rate=0.1),
}
# Fields the shapes (or the names) of a checkpoint decide; a run may not change them.
SHAPE_FIELDS = (
    "vocab_size",
    "d_model",
    "d_ff",
    "d_kv",
    "num_heads",
    "num_encoder_layers",
    "num_decoder_layers",
    "logits_via_embedding",
    "relative_attention_num_buckets",
    "architecture",
)


@dataclasses.dataclass
class Released:
    """A checkpoint of another framework, opened: its network and its arrays, not yet read.

    Attributes:
      path: the step folder (T5X) or bundle prefix (Mesh TensorFlow) read.
      format: one of `FORMATS`.
      step: the training step it was saved at.
      config: its network (with `overrides` applied).
      assumed: the fields neither the files nor the shapes decide, with the value taken.
      params: t2t parameter path ('/'-joined, unscanned) -> array.
      slots: parameter path -> Adafactor slot ('v_row', 'v_col', 'v', 'm') -> array.
    """

    path: str
    format: str
    step: int
    config: TransformerConfig
    assumed: dict[str, Any]
    params: dict[str, StoredArray]
    slots: dict[str, dict[str, StoredArray]]

    def describe(self) -> str:
        """One paragraph for the log: what was read and what was assumed."""
        c = self.config
        mlp = "gated " + "-".join(c.mlp_activations) if len(c.mlp_activations) == 2 else "ReLU"
        logits = "tied, scaled logits" if c.logits_via_embedding else "separate logits"
        text = (
            f"{self.format} checkpoint {self.path} (step {self.step}): {c.num_encoder_layers} + "
            f"{c.num_decoder_layers} layers, d_model {c.d_model}, {c.num_heads} heads of "
            f"{c.d_kv}, d_ff {c.d_ff} ({mlp}), vocabulary {c.vocab_size}, {logits}."
        )
        if self.assumed:
            said = ", ".join(f"{k}={v!r}" for k, v in self.assumed.items())
            text += (
                f" Not recorded in the checkpoint, so taken from the T5 defaults: {said} "
                "(bind t2t.runs.checkpoint_model_config.<field>, e.g. mlp_activations = "
                "('silu', 'linear') for UL2, to change them)."
            )
        return text


def detect(path: str) -> str | None:
    """The format of `path` (a step folder, a T5X model directory, a bundle directory or
    prefix), or None when it is none of `FORMATS`."""
    folder = _t5x_step_folder(path, None, strict=False)
    if folder is not None:
        return T5X_ORBAX if t5x.is_orbax(folder) else T5X
    if mtf.is_mtf(path):
        return MTF
    return None


def open_checkpoint(path: str, step: int | None = None, **overrides) -> Released:
    """Opens a T5X, T5X Orbax or Mesh TensorFlow checkpoint (see the module docstring).

    Args:
      path: a step folder (`.../checkpoint_1000000`), a T5X model directory (its newest step,
        or `step`), a Mesh TensorFlow directory or bundle prefix; local or gs://.
      step: which step of a model directory.
      **overrides: `TransformerConfig` fields to change (dtypes, dropout, the assumed ones).

    Raises:
      ValueError: not a checkpoint of these formats, or one whose arrays t2t's network cannot
        take (the message names them).
    """
    kind = detect(path)
    if kind is None:
        raise FileNotFoundError(f"{path} is not a T5X or Mesh TensorFlow checkpoint.")
    if kind == MTF:
        prefix = mtf.resolve_prefix(path, step)
        arrays, saved_step = mtf.read(prefix)
        record = mtf.read_operative_config(prefix)
        where = prefix
    else:
        folder = _t5x_step_folder(path, step, strict=True)
        reader = t5x.read_orbax if kind == T5X_ORBAX else t5x.read_legacy
        arrays, saved_step = reader(folder)
        record = None
        where = folder
    params, slots = _split(arrays, where)
    config, assumed = infer_config(params, record, where, overrides)
    return Released(where, kind, saved_step, config, assumed, params, slots)


def _t5x_step_folder(path: str, step: int | None, *, strict: bool) -> str | None:
    """The step folder `path` names, or its newest (or `step`'s) `checkpoint_<step>`."""
    if t5x.is_legacy(path) or t5x.is_orbax(path):
        if files.isdir(path):
            return files.parent(path) if files.basename(path) == t5x.ORBAX_ITEM else path
        return files.parent(path)
    folders = t5x.step_folders(path)
    folders = {s: f for s, f in folders.items() if t5x.is_legacy(f) or t5x.is_orbax(f)}
    if not folders:
        return None
    if step is None:
        return folders[max(folders)]
    if step not in folders:
        if not strict:
            return folders[max(folders)]
        raise FileNotFoundError(f"{path} has no checkpoint_{step}; it has steps {sorted(folders)}.")
    return folders[step]


def _split(arrays: dict[str, StoredArray], where: str):
    params, slots = {}, {}
    for name, array in arrays.items():
        if name.startswith(_TARGET):
            params[name[len(_TARGET) :]] = array
        elif name.startswith(_SLOTS):
            path, _, slot = name[len(_SLOTS) :].rpartition("/")
            slots.setdefault(path, {})[slot] = array
    if not params:
        raise CheckpointMismatchError(
            f"{where} holds no parameters (no 'target' arrays); it has {sorted(arrays)[:6]}."
        )
    scanned = sorted(p for p in params if re.match(r"(encoder|decoder)/layers/", p))
    if scanned:
        raise CheckpointMismatchError(
            f"{where} stores scanned layers ({scanned[0]} ...), which T5X stacks along axis 1; "
            "t2t reads T5X's unscanned layout (layers_0, layers_1, ...). Convert it with T5X's "
            "own scan_layers=False restore, or ask for this layout to be added."
        )
    per_layer = sorted(p for p in params if re.search(r"layers_\d+/relpos_bias", p))
    if per_layer:
        raise CheckpointMismatchError(
            f"{where} has a relative position bias in every layer ({per_layer[0]} ...: "
            "umT5's layout); t2t's network has one per stack, in its first layer (T5's "
            "'bias_shared'), so this checkpoint cannot be imported."
        )
    return params, slots


def infer_config(
    params: dict[str, StoredArray],
    record: dict[str, Any] | None,
    where: str,
    overrides: dict[str, Any],
) -> tuple[TransformerConfig, dict[str, Any]]:
    """The network of a checkpoint's parameters (see the module docstring), and what was
    assumed.

    Raises:
      CheckpointMismatchError: a parameter the shapes need is absent, or the record disagrees
        with the shapes.
    """
    shaped = _from_shapes(params, where)
    gated = shaped.pop("mlp_activations") == ("gated",)
    fields = dict(shaped)
    for name, value in (record or {}).items():
        if name in shaped and shaped[name] != value:
            raise CheckpointMismatchError(
                f"{where}: its operative_config.gin says {name} = {value!r}, its arrays' shapes "
                f"say {shaped[name]!r}."
            )
        fields[name] = value
    defaults = {**FAMILY_DEFAULTS["gated" if gated else "plain"], **FAMILY_DEFAULTS["all"]}
    assumed = {}
    for name, value in defaults.items():
        if name in fields or name in overrides:
            continue
        fields[name] = value
        if name == "mlp_activations" and not gated or name == "dropout_rate":
            continue  # a plain T5 MLP is ReLU; dropout is the run's choice
        assumed[name] = value
    fields.update(overrides)
    if (len(tuple(fields["mlp_activations"])) == 2) != gated:
        raise CheckpointMismatchError(
            f"mlp_activations={tuple(fields['mlp_activations'])!r} does not fit {where}, whose "
            f"MLP is {'gated (wi_0, wi_1)' if gated else 'plain (wi)'}."
        )
    return TransformerConfig(**fields), assumed


def _from_shapes(params: dict[str, StoredArray], where: str) -> dict[str, Any]:
    def shape(name: str) -> tuple[int, ...]:
        if name not in params:
            raise CheckpointMismatchError(
                f"{where} has no {name}, which every T5 encoder-decoder has; it holds "
                f"{sorted(params)[:6]} ... (decoder-only models and other architectures are not "
                "read from T5X or Mesh TensorFlow checkpoints)."
            )
        return tuple(params[name].shape)

    vocab_size, d_model = shape("token_embedder/embedding")
    heads, buckets = shape("encoder/relpos_bias/rel_embedding")
    inner = shape("encoder/layers_0/attention/query/kernel")[1]
    layers = {"encoder": set(), "decoder": set()}
    for name in params:
        match = _LAYER.match(name)
        if match:
            layers[match.group(1)].add(int(match.group(2)))
    for stack, found in layers.items():
        if found != set(range(len(found))):
            raise CheckpointMismatchError(
                f"{where}: the {stack}'s layers are not numbered 0..N-1: {sorted(found)}."
            )
    gated = "encoder/layers_0/mlp/wi_0/kernel" in params
    if inner % heads:
        raise CheckpointMismatchError(
            f"{where}: the attention width {inner} is not a multiple of the {heads} heads the "
            "relative bias has."
        )
    return dict(
        vocab_size=vocab_size,
        d_model=d_model,
        d_ff=shape("encoder/layers_0/mlp/wo/kernel")[0],
        d_kv=inner // heads,
        num_heads=heads,
        num_encoder_layers=len(layers["encoder"]),
        num_decoder_layers=len(layers["decoder"]),
        mlp_activations=("gated",) if gated else ("plain",),
        logits_via_embedding="decoder/logits_dense/kernel" not in params,
        relative_attention_num_buckets=buckets,
    )
