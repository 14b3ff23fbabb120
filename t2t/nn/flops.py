"""Exact matmul FLOPs of one example, for model FLOPs utilization (MFU).

Counts every matmul of the network per stack, as docs/spec.md section 12 does: encoder weights see the
input tokens, decoder and logits weights see the target tokens, attention score and mixing terms
included; a matmul [m, k] x [k, n] is 2mkn and a training step is 3x the forward pass. Element-wise
work (norms, softmax, dropout, the loss) is not counted.

NOTE: the popular 6 * params * tokens rule doubles the count for an encoder-decoder: every token
is charged for every weight, while input tokens never pass through the decoder and target tokens
never pass through the encoder.

Worked example (tested against the spec's check values): T5-small with 512 input and 114 target
tokens costs 35.42 GFLOP forward, 106.3 GFLOP per training example; T5-base 425.9, T5-large
1,444.2.
"""

from __future__ import annotations

from t2t.nn.config import TransformerConfig

# A training step is the forward pass plus a backward pass of twice its cost.
TRAINING_MULTIPLIER = 3


def _ff_matrices(config: TransformerConfig) -> int:
    """2 for `wo(act(wi(x)))`, 3 for a gated unit with `wi_0` and `wi_1`."""
    return 1 + len(config.mlp_activations)


def _mlp(config: TransformerConfig, tokens: int) -> int:
    return 2 * _ff_matrices(config) * tokens * config.d_model * config.d_ff


def _self_attention(config: TransformerConfig, length: int) -> int:
    """q, k, v, o projections, and the [L, L] scores and mixing."""
    inner = config.inner_dim
    return 8 * length * config.d_model * inner + 4 * length * length * inner


def _cross_attention(config: TransformerConfig, target_length: int, input_length: int) -> int:
    """q and o on the targets, k and v on the encoder output, and the [T, L] scores and mixing."""
    inner, d = config.inner_dim, config.d_model
    return (
        4 * target_length * d * inner
        + 4 * input_length * d * inner
        + 4 * target_length * input_length * inner
    )


def forward_flops(config: TransformerConfig, input_length: int, target_length: int) -> int:
    """FLOPs of the forward pass over one unpacked example.

    Args:
      config: the network.
      input_length: L, encoder tokens. For the decoder-only architectures the input is the
        prefix (prompt) of the one decoder sequence of L + T tokens.
      target_length: T, decoder tokens.

    Returns:
      The matmul FLOPs (an exact integer).
    """
    if input_length < 0 or target_length < 1:
        raise ValueError(
            f"Need input_length >= 0 and target_length >= 1, got {input_length} and "
            f"{target_length}."
        )
    d, vocab = config.d_model, config.vocab_size
    if config.is_decoder_only:
        length = input_length + target_length
        layer = _self_attention(config, length) + _mlp(config, length)
        return config.num_decoder_layers * layer + 2 * length * d * vocab
    encoder_layer = _self_attention(config, input_length) + _mlp(config, input_length)
    decoder_layer = (
        _self_attention(config, target_length)
        + _cross_attention(config, target_length, input_length)
        + _mlp(config, target_length)
    )
    logits = 2 * target_length * d * vocab
    return (
        config.num_encoder_layers * encoder_layer
        + config.num_decoder_layers * decoder_layer
        + logits
    )


def training_flops(config: TransformerConfig, input_length: int, target_length: int) -> int:
    """FLOPs of one training step's forward and backward pass over one example (3x forward)."""
    return TRAINING_MULTIPLIER * forward_flops(config, input_length, target_length)
