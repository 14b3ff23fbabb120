"""Named model sizes: the T5 paper's v1.0 family, the T5 v1.1 family, and a tiny CPU model.

Sizes live in Python, not in gin files: gin (at the edge) picks a preset by name and overrides
fields. Parameter counts of the T5 presets equal the exact counts in docs/spec.md section 1 (tested).
"""

from __future__ import annotations

import difflib

from t2t.nn.config import TransformerConfig

# vocab 32100 (32000 pieces + 100 sentinels) padded up to a multiple of 128.
T5_VOCAB_SIZE = 32128

_V1_0 = dict(
    vocab_size=T5_VOCAB_SIZE,
    mlp_activations=("relu",),
    logits_via_embedding=True,
    dropout_rate=0.1,
)
_V1_1 = dict(
    vocab_size=T5_VOCAB_SIZE,
    mlp_activations=("gelu", "linear"),
    logits_via_embedding=False,
    # NOTE: T5 v1.1 was pretrained without dropout; fine-tuning usually sets 0.1.
    dropout_rate=0.0,
)


def _size(d_model, d_ff, d_kv, num_heads, num_layers):
    return dict(
        d_model=d_model,
        d_ff=d_ff,
        d_kv=d_kv,
        num_heads=num_heads,
        num_encoder_layers=num_layers,
        num_decoder_layers=num_layers,
    )


_PRESET_FIELDS = {
    "t5_small": {**_V1_0, **_size(512, 2048, 64, 8, 6)},
    "t5_base": {**_V1_0, **_size(768, 3072, 64, 12, 12)},
    "t5_large": {**_V1_0, **_size(1024, 4096, 64, 16, 24)},
    "t5_3b": {**_V1_0, **_size(1024, 16384, 128, 32, 24)},
    "t5_11b": {**_V1_0, **_size(1024, 65536, 128, 128, 24)},
    "t5_1_1_small": {**_V1_1, **_size(512, 1024, 64, 6, 8)},
    "t5_1_1_base": {**_V1_1, **_size(768, 2048, 64, 12, 12)},
    "t5_1_1_large": {**_V1_1, **_size(1024, 2816, 64, 16, 24)},
    "t5_1_1_xl": {**_V1_1, **_size(2048, 5120, 64, 32, 24)},
    "t5_1_1_xxl": {**_V1_1, **_size(4096, 10240, 64, 64, 24)},
    # A v1.1-style model that trains in minutes on a laptop CPU. Its vocabulary holds a
    # SentencePiece model of up to 3996 pieces plus the 100 sentinels; override vocab_size to
    # match yours (rounded up to a multiple of 128).
    "tiny": {
        **_V1_1,
        **_size(128, 512, 32, 4, 2),
        "vocab_size": 4096,
    },
}

PRESETS: tuple[str, ...] = tuple(_PRESET_FIELDS)


def get_preset(name: str, **overrides) -> TransformerConfig:
    """Returns the named preset's config with `overrides` applied.

    Args:
      name: one of `PRESETS`.
      **overrides: `TransformerConfig` fields to change, e.g. `vocab_size=2048`,
        `dtype="bfloat16"`, `architecture="encoder_decoder_shared"`.

    Raises:
      ValueError: unknown preset name (the message lists the closest names) or an invalid
        override value.
      TypeError: an override that is not a `TransformerConfig` field.
    """
    if name not in _PRESET_FIELDS:
        close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.4)
        hint = f" Did you mean {close}?" if close else ""
        raise ValueError(f"Unknown preset {name!r}; presets are {list(PRESETS)}.{hint}")
    fields = dict(_PRESET_FIELDS[name])
    unknown = sorted(set(overrides) - set(TransformerConfig.__dataclass_fields__))
    if unknown:
        raise TypeError(
            f"get_preset({name!r}): {unknown} are not TransformerConfig fields; fields are "
            f"{sorted(TransformerConfig.__dataclass_fields__)}."
        )
    fields.update(overrides)
    return TransformerConfig(**fields)
