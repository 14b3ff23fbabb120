"""Logical axis names: the one vocabulary shared by parameters, activations and the mesh rules.

Every parameter of the network is annotated with a tuple of these names (one per dimension), and
key activations are constrained with them. `t2t.partitioning` maps the names to mesh axes
(`data`, `model`) through a single rules table, so changing how a model is sharded never touches
the network code.

Parameter axes and activation axes are deliberately distinct names: a parameter's `embed`
dimension may be sharded over `data` (fully sharded data parallel) while an activation's embed
dimension must not be, because its batch dimension already uses `data`.
"""

# Parameter axes.
VOCAB = "vocab"
EMBED = "embed"
MLP = "mlp"
HEADS = "heads"
KV = "kv"
JOINED_KV = "joined_kv"  # heads * d_kv flattened: attention kernels stay 2-D for Adafactor.
RELPOS_BUCKETS = "relpos_buckets"
LAYERS = "layers"  # the stacking axis of scanned layers (`TransformerConfig.scan_layers`).
# Parameters fine-tuning methods add (`t2t.finetuning`), small and replicated in every mode.
ADAPTER = "adapter"  # hidden units of an adapter layer (`TransformerConfig.adapter_size`).
LORA_RANK = "lora_rank"  # the low-rank dimension of a LoRA update (`lora_rank`).
PROMPT = "prompt"  # positions of a learned soft prompt (`prompt_length`).

# Activation axes.
ACT_BATCH = "activation_batch"
ACT_LENGTH = "activation_length"
ACT_EMBED = "activation_embed"
ACT_MLP = "activation_mlp"
ACT_HEADS = "activation_heads"
ACT_KV = "activation_kv"
ACT_VOCAB = "activation_vocab"

PARAM_AXES = (
    VOCAB,
    EMBED,
    MLP,
    HEADS,
    KV,
    JOINED_KV,
    RELPOS_BUCKETS,
    LAYERS,
    ADAPTER,
    LORA_RANK,
    PROMPT,
)
ACTIVATION_AXES = (ACT_BATCH, ACT_LENGTH, ACT_EMBED, ACT_MLP, ACT_HEADS, ACT_KV, ACT_VOCAB)

# A parameter dimension's layout where the parameter is used: its activation counterpart. A
# weight is constrained to it after the cast to the compute dtype (`t2t.nn.layers.Dense`), so
# under FSDP each weight is gathered along `embed` in the compute dtype just before its matmul,
# while tensor-parallel dimensions stay split.
AT_USE = {
    VOCAB: ACT_VOCAB,
    EMBED: ACT_EMBED,
    MLP: ACT_MLP,
    HEADS: ACT_HEADS,
    KV: ACT_KV,
    JOINED_KV: ACT_HEADS,
    RELPOS_BUCKETS: None,
    LAYERS: None,
    ADAPTER: None,
    LORA_RANK: None,
    PROMPT: None,
}

# The one-letter dimension alphabet of every shape comment and einsum in t2t (docs/architecture.md):
#   B batch            L query (sequence) length    S key length / cache positions
#   T decoded or target length     W prompt length before the decoded tokens
#   D d_model          F d_ff             N heads            H d_kv
#   V vocabulary       U relative position buckets
#   K beams            R rows of a decoding step (B, or B x K)
#   C candidates (rank classification)    P soft-prompt length    G groups (chunks)
#   M, I, O the rows, inputs and outputs of a generic matmul [M, I] x [I, O]
# The layouts of the constrained activations (see `t2t.nn.sharding.constrain`) in that alphabet:
BLD = (ACT_BATCH, ACT_LENGTH, ACT_EMBED)  # embeddings out, each layer's residual stream
BLF = (ACT_BATCH, ACT_LENGTH, ACT_MLP)  # MLP hidden units
BLNH = (ACT_BATCH, ACT_LENGTH, ACT_HEADS, ACT_KV)  # attention queries, attention output
BNLH = (ACT_BATCH, ACT_HEADS, ACT_LENGTH, ACT_KV)  # keys and values, the decoding cache
BLV = (ACT_BATCH, ACT_LENGTH, ACT_VOCAB)  # logits
