"""The network: configuration presets, layers, attention with a KV cache, and the architectures.

config = t2t.nn.get_preset("t5_small")
model = t2t.nn.build(config, nnx.Rngs(params=0))
logits = model(encoder_input_tokens, decoder_input_tokens)  # [B, T, V] float32
"""

from flax import nnx

from t2t.nn.additions import merge_lora
from t2t.nn.config import ARCHITECTURES, TransformerConfig
from t2t.nn.decoder_only import DecoderOnly
from t2t.nn.encoder_decoder import EncoderDecoder
from t2t.nn.presets import PRESETS, get_preset
from t2t.nn.stacking import stack_layers, unstack_layers
from t2t.nn.stacks import resize_cache


def build(config: TransformerConfig, rngs: nnx.Rngs) -> EncoderDecoder | DecoderOnly:
    """The module for `config.architecture`: `EncoderDecoder` or `DecoderOnly`.

    Use under `nnx.eval_shape(lambda: build(config, nnx.Rngs(0)))` for shapes without memory.
    """
    if not isinstance(config, TransformerConfig):
        raise TypeError(f"build() needs a TransformerConfig, got {type(config).__name__}.")
    if config.is_decoder_only:
        return DecoderOnly(config, rngs=rngs)
    return EncoderDecoder(config, rngs=rngs)


def to_layout(params: nnx.State, config: TransformerConfig) -> nnx.State:
    """Parameters of either layer layout (scanned or unscanned) in the layout `config` asks for.

    Values are only moved (`stack_layers` / `unstack_layers`), so the model computes exactly the
    same function. Works on concrete and traced arrays; the result's Variables carry the logical
    axes of `config`'s layout.

    Args:
      params: an `nnx.State` of the network's parameters, scanned or not.
      config: the target network; only `scan_layers` may differ from the source's.

    Returns:
      An `nnx.State` laid out as `build(config, ...)` would make it.
    """
    values = nnx.to_pure_dict(params)
    values = stack_layers(values) if config.scan_layers else unstack_layers(values)
    _, target = nnx.split(nnx.eval_shape(lambda: build(config, nnx.Rngs(params=0))))
    nnx.replace_by_pure_dict(target, values)
    return target


__all__ = [
    "ARCHITECTURES",
    "PRESETS",
    "DecoderOnly",
    "EncoderDecoder",
    "TransformerConfig",
    "build",
    "get_preset",
    "merge_lora",
    "resize_cache",
    "stack_layers",
    "to_layout",
    "unstack_layers",
]
