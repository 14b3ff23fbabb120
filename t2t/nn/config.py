"""The one configuration object of the network, validated when it is made.

Every module of `t2t.nn` receives the whole `TransformerConfig`; nothing else configures the
network. A bad value fails here, at construction, with the field name, the value received and what
would be accepted, instead of as a shape error deep inside a jitted function.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

ARCHITECTURES = ("encoder_decoder", "encoder_decoder_shared", "decoder_only", "prefix_lm")
DECODER_ONLY_ARCHITECTURES = ("decoder_only", "prefix_lm")

# Supported MLP activation tuples. One name: `wo(act(wi(x)))`. Two names: a gated unit
# `wo(act0(wi_0(x)) * act1(wi_1(x)))` (T5 v1.1 uses ("gelu", "linear"), UL2 ("silu",
# "linear")). "gelu" is the tanh approximation, as in T5X and HF's "gelu_new".
MLP_ACTIVATIONS = (("relu",), ("gelu", "linear"), ("relu", "linear"), ("silu", "linear"))

COMPUTE_DTYPES = ("float32", "bfloat16")
# What the backward pass keeps of each layer's forward pass (`t2t.nn.stacking.REMAT_POLICIES`).
REMAT_POLICIES = ("none", "full", "dots", "dots_with_no_batch_dims")
PARAM_DTYPES = ("float32", "bfloat16")
# How attention is computed (`t2t.nn.attention_ops`): "auto" picks per platform and call site.
ATTENTION_IMPLS = ("auto", "xla", "cudnn", "flash")
# How the norms of the layers' residual branches are computed (`TransformerConfig.norm_impl`).
NORM_IMPLS = ("xla", "pallas")
# The dense layers LoRA may adapt (`TransformerConfig.lora_targets`), by module name: attention
# projections (self- and cross-attention alike), MLP kernels, and the untied output projection.
LORA_TARGETS = ("query", "key", "value", "out", "wi", "wi_0", "wi_1", "wo", "logits_dense")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyperparameters of a T5-family network (paper Table 2 architectures, v1.0 and v1.1).

    Attributes:
      vocab_size: V, rows of the token embedding (a multiple of 128 for T5 checkpoints).
      d_model: D, width of the residual stream.
      d_ff: F, hidden width of the feed-forward block.
      d_kv: H, width of one attention head (`num_heads * d_kv` need not equal `d_model`).
      num_heads: N, attention heads.
      num_encoder_layers: encoder depth; 0 for the decoder-only architectures.
      num_decoder_layers: decoder depth (for decoder-only models, the whole depth).
      mlp_activations: ("relu",) for T5 v1.0, ("gelu", "linear") for v1.1's gated GELU,
        ("relu", "linear") for a gated ReLU, ("silu", "linear") for UL2's gated SiLU.
      logits_via_embedding: True: logits are the decoder output scaled by d_model**-0.5 times the
        transposed token embedding (v1.0). False: a separate `logits_dense` kernel (v1.1).
      dropout_rate: dropout probability at every place T5 applies it (0.1 for v1.0 fine-tuning,
        0.0 for v1.1 pretraining).
      relative_attention_num_buckets: R, buckets of the relative position bias.
      relative_attention_max_distance: distance beyond which relative positions share a bucket.
      layer_norm_epsilon: epsilon of the RMS norm.
      dtype: compute dtype of matmuls ("float32" or "bfloat16"). Softmax, norms, logits and the
        loss stay in float32.
      param_dtype: storage dtype of parameters ("float32" by default).
      architecture: one of `encoder_decoder`, `encoder_decoder_shared`, `decoder_only`,
        `prefix_lm`.
      scan_layers: stack each stack's layer parameters along a leading `layers` axis and run
        them with `jax.lax.scan` (compile time independent of depth). Changes the parameter
        layout (`encoder/layers/...` instead of `encoder/layers_{i}/...`), not the function;
        `t2t.nn.stacking` converts checkpoints between the layouts.
      unroll_layers: with `scan_layers`, keep the stacked parameters but run the layers as
        an unrolled loop, layer i on slice i (`t2t.nn.stacking`): the unscanned program's
        speed with the scanned layout's optimizer update (one per stacked parameter, not one
        per layer's). Compile time grows with depth again. Same function, same layout.
        Without `scan_layers` the layers run unrolled anyway.
      remat_policy: what the backward pass keeps of each layer's forward pass: "none",
        "full" (only the layer's input; recompute the rest), "dots" (every matmul output) or
        "dots_with_no_batch_dims" (projection outputs; recompute attention). Changes memory and
        FLOPs, not values.
      adapter_size: d, the hidden units of an adapter layer (paper section 3.5.1): a
        dense-ReLU-dense block with a residual connection after every feed-forward block,
        its output kernel zero-initialized so the adapted network starts as the original.
        0: no adapters.
      lora_rank: r of LoRA updates `W + (alpha / r) A B` (A [in, r] random, B [r, out] zero)
        on the dense layers named in `lora_targets`. 0: no LoRA.
      lora_alpha: the LoRA scale's numerator; None: equal to `lora_rank` (scale 1).
      lora_targets: module names of the dense layers LoRA adapts, from `LORA_TARGETS`.
      prompt_length: P, learned vectors prepended to the embedded encoder inputs (prompt
        tuning). 0: no prompt. Encoder-decoder architectures, unpacked inputs only.
      attention_impl: how attention is computed, `t2t.nn.attention_ops`: "xla" (everywhere),
        "cudnn" (cuDNN flash attention on NVIDIA GPUs, bfloat16, no attention dropout),
        "flash" (Pallas flash attention on TPUs, lengths multiples of 128) or "auto" (the
        fastest measured where it can run, XLA elsewhere). Speed only: every implementation
        computes the same function.
      norm_impl: how a layer's norms and the residual adds before them are computed: "xla"
        (XLA's fusions) or "pallas" (one Pallas kernel per direction for the add and the norm
        on an NVIDIA GPU, `t2t.nn.norm_kernels`; XLA's under a mesh of several devices, and in
        decoding steps; Pallas's interpreter on other platforms, for tests). Speed only.
      float32_attention_logits: keep the attention logits [B, N, L, S] in float32 when the
        network computes in bfloat16 (T5X's option of the same name). False (T5X's default)
        stores them in the compute dtype; the softmax computes in float32 either way. XLA
        path only (the fused kernels never store logits).
    """

    vocab_size: int
    d_model: int
    d_ff: int
    d_kv: int
    num_heads: int
    num_encoder_layers: int
    num_decoder_layers: int
    mlp_activations: tuple[str, ...] = ("relu",)
    logits_via_embedding: bool = True
    dropout_rate: float = 0.1
    relative_attention_num_buckets: int = 32
    relative_attention_max_distance: int = 128
    layer_norm_epsilon: float = 1e-6
    dtype: str = "float32"
    param_dtype: str = "float32"
    architecture: str = "encoder_decoder"
    scan_layers: bool = False
    unroll_layers: bool = False
    remat_policy: str = "none"
    adapter_size: int = 0
    lora_rank: int = 0
    lora_alpha: float | None = None
    lora_targets: tuple[str, ...] = ("query", "value")
    prompt_length: int = 0
    attention_impl: str = "auto"
    float32_attention_logits: bool = False
    norm_impl: str = "xla"

    def __post_init__(self):
        # Normalize inputs that arrive as lists (JSON, gin) or dtype objects to canonical forms,
        # so equal configs compare and hash equal.
        object.__setattr__(self, "mlp_activations", tuple(self.mlp_activations))
        object.__setattr__(self, "lora_targets", tuple(self.lora_targets))
        object.__setattr__(self, "dtype", _dtype_name("dtype", self.dtype, COMPUTE_DTYPES))
        object.__setattr__(
            self, "param_dtype", _dtype_name("param_dtype", self.param_dtype, PARAM_DTYPES)
        )
        self._validate_sizes()
        self._validate_choices()
        self._validate_relative_attention()
        self._validate_additions()

    def _validate_sizes(self):
        for name in ("vocab_size", "d_model", "d_ff", "d_kv", "num_heads", "num_decoder_layers"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"TransformerConfig.{name} must be a positive int, got {value!r}.")
        enc = self.num_encoder_layers
        if not isinstance(enc, int) or isinstance(enc, bool) or enc < 0:
            raise ValueError(
                f"TransformerConfig.num_encoder_layers must be an int >= 0, got {enc!r}."
            )
        if not isinstance(self.dropout_rate, (int, float)) or not 0.0 <= self.dropout_rate < 1.0:
            raise ValueError(
                f"TransformerConfig.dropout_rate must be in [0, 1), got {self.dropout_rate!r}."
            )
        if not self.layer_norm_epsilon > 0:
            raise ValueError(
                "TransformerConfig.layer_norm_epsilon must be > 0, got "
                f"{self.layer_norm_epsilon!r}."
            )

    def _validate_choices(self):
        choices = (
            ("architecture", ARCHITECTURES),
            ("mlp_activations", MLP_ACTIVATIONS),
            ("attention_impl", ATTENTION_IMPLS),
            ("norm_impl", NORM_IMPLS),
            ("remat_policy", REMAT_POLICIES),
        )
        for name, allowed in choices:
            if getattr(self, name) not in allowed:
                raise ValueError(
                    f"TransformerConfig.{name} must be one of {allowed}, got "
                    f"{getattr(self, name)!r}."
                )
        switches = (
            "logits_via_embedding",
            "float32_attention_logits",
            "scan_layers",
            "unroll_layers",
        )
        for name in switches:
            if not isinstance(getattr(self, name), bool):
                raise TypeError(
                    f"TransformerConfig.{name} must be a bool, got {getattr(self, name)!r}."
                )
        if self.is_decoder_only and self.num_encoder_layers != 0:
            raise ValueError(
                f"architecture={self.architecture!r} has no encoder, but num_encoder_layers="
                f"{self.num_encoder_layers}. Set num_encoder_layers=0 and put the whole depth in "
                "num_decoder_layers (the paper's LM uses encoder + decoder layers, e.g. 12 for "
                "a T5-small-sized LM)."
            )
        if not self.is_decoder_only and self.num_encoder_layers < 1:
            raise ValueError(
                f"architecture={self.architecture!r} needs num_encoder_layers >= 1, got "
                f"{self.num_encoder_layers}."
            )
        if (
            self.architecture == "encoder_decoder_shared"
            and self.num_encoder_layers != self.num_decoder_layers
        ):
            raise ValueError(
                "architecture='encoder_decoder_shared' shares decoder layer i with encoder layer "
                f"i, so the depths must match; got num_encoder_layers={self.num_encoder_layers}, "
                f"num_decoder_layers={self.num_decoder_layers}."
            )

    def _validate_relative_attention(self):
        buckets = self.relative_attention_num_buckets
        distance = self.relative_attention_max_distance
        if not isinstance(buckets, int) or buckets < 4 or buckets % 2:
            raise ValueError(
                "TransformerConfig.relative_attention_num_buckets must be an even int >= 4 "
                f"(bidirectional attention splits it in two halves), got {buckets!r}."
            )
        # NOTE: the logarithmic part of the bucket function divides by log(max_distance / exact)
        # with exact = num_buckets // 2 (causal); it must be positive.
        if not isinstance(distance, int) or distance <= buckets // 2:
            raise ValueError(
                "TransformerConfig.relative_attention_max_distance must be an int > "
                f"relative_attention_num_buckets // 2 = {buckets // 2}, got {distance!r}."
            )

    def _validate_additions(self):
        for name in ("adapter_size", "lora_rank", "prompt_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(
                    f"TransformerConfig.{name} must be an int >= 0 (0: none), got {value!r}."
                )
        unknown = sorted(set(self.lora_targets) - set(LORA_TARGETS))
        if unknown or (self.lora_rank and not self.lora_targets):
            raise ValueError(
                f"TransformerConfig.lora_targets must name dense layers from {LORA_TARGETS}; "
                f"got {self.lora_targets!r}."
            )
        if self.lora_alpha is not None and not self.lora_alpha > 0:
            raise ValueError(
                f"TransformerConfig.lora_alpha must be > 0 or None, got {self.lora_alpha!r}."
            )
        if self.prompt_length and self.is_decoder_only:
            raise ValueError(
                f"prompt_length={self.prompt_length} prepends a soft prompt to the encoder "
                f"inputs, and architecture={self.architecture!r} has no encoder. Use an "
                "encoder-decoder architecture, or adapters / LoRA for a decoder-only model."
            )

    @property
    def lora_scale(self) -> float:
        """alpha / r, the factor of a LoRA update (1 when `lora_alpha` is None)."""
        if not self.lora_rank:
            return 0.0
        alpha = self.lora_rank if self.lora_alpha is None else self.lora_alpha
        return float(alpha) / self.lora_rank

    def lora_rank_for(self, name: str) -> int:
        """The LoRA rank of the dense layer called `name` (0: not adapted)."""
        return self.lora_rank if name in self.lora_targets else 0

    @property
    def additions(self) -> dict[str, int]:
        """The fine-tuning additions this network has beyond the pretrained one (non-zero)."""
        sizes = {
            "adapter_size": self.adapter_size,
            "lora_rank": self.lora_rank,
            "prompt_length": self.prompt_length,
        }
        return {k: v for k, v in sizes.items() if v}

    @property
    def is_decoder_only(self) -> bool:
        """Whether the architecture is a decoder-only language model (plain or prefix)."""
        return self.architecture in DECODER_ONLY_ARCHITECTURES

    @property
    def inner_dim(self) -> int:
        """N * H, the width of the joined attention heads."""
        return self.num_heads * self.d_kv

    @property
    def compute_dtype(self) -> jnp.dtype:
        """The dtype of matmul inputs."""
        return jnp.dtype(self.dtype)

    @property
    def params_dtype(self) -> jnp.dtype:
        """The storage dtype of parameters."""
        return jnp.dtype(self.param_dtype)

    def replace(self, **changes) -> TransformerConfig:
        """Returns a copy with `changes` applied (validated again)."""
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise TypeError(
                f"TransformerConfig has no field(s) {unknown}; fields are "
                f"{[f.name for f in dataclasses.fields(self)]}."
            )
        return dataclasses.replace(self, **changes)


def _dtype_name(field: str, value, allowed: tuple[str, ...]) -> str:
    try:
        name = jnp.dtype(value).name
    except TypeError:
        name = None
    if name not in allowed:
        raise ValueError(f"TransformerConfig.{field} must be one of {allowed}, got {value!r}.")
    return name
