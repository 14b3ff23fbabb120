"""The logical-axis rules: one table per sharding mode, mapping logical names to mesh axes.

The network names every parameter dimension and key activation with a logical axis
(`t2t.nn.axes`); a table here says which mesh axis each name is split over (`data`, `model`), or
None for replicated. Sharding a model differently means choosing another table, never editing the
network.
"""

from __future__ import annotations

import difflib

from t2t.nn import axes

# Mesh axis names. Batches are split over `data`; tensor-parallel dimensions over `model`.
DATA = "data"
MODEL = "model"
MESH_AXES = (DATA, MODEL)

# A rules table: (logical axis name, mesh axis or None for replicated), one pair per name.
LogicalRules = tuple[tuple[str, str | None], ...]

# NOTE: Every logical name appears in every table, mapped to None when it stays replicated, so a
# name missing from the network's vocabulary or a typo fails loudly instead of being taken for a
# mesh axis (flax passes unknown names through unchanged).
RULES: dict[str, LogicalRules] = {
    # Pure data parallelism: every parameter replicated, batches split over `data`.
    "data_parallel": (
        (axes.VOCAB, None),
        (axes.EMBED, None),
        (axes.MLP, None),
        (axes.HEADS, None),
        (axes.KV, None),
        (axes.JOINED_KV, None),
        (axes.RELPOS_BUCKETS, None),
        (axes.LAYERS, None),
        (axes.ADAPTER, None),
        (axes.LORA_RANK, None),
        (axes.PROMPT, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, None),
        (axes.ACT_HEADS, None),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, None),
    ),
    # Data parallel over `data` plus Megatron-style tensor parallelism over `model`: attention
    # heads, the feed-forward hidden units and the vocabulary are split (T5X's 1-D partitioning).
    # With a `model` axis of size 1 this is plain data parallelism.
    "tensor_parallel": (
        (axes.VOCAB, MODEL),
        (axes.EMBED, None),
        (axes.MLP, MODEL),
        (axes.HEADS, MODEL),
        (axes.KV, None),
        (axes.JOINED_KV, MODEL),
        (axes.RELPOS_BUCKETS, None),
        (axes.LAYERS, None),
        (axes.ADAPTER, None),
        (axes.LORA_RANK, None),
        (axes.PROMPT, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, MODEL),
        (axes.ACT_HEADS, MODEL),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, MODEL),
    ),
    # tensor_parallel plus parameters (and so optimizer statistics) sharded over `data` along
    # `embed` (fully sharded data parallel, T5X's 2-D partitioning): memory per device falls with
    # the number of data replicas; XLA gathers each weight where it is used. Activations keep
    # `activation_embed` replicated because their batch dimension already uses `data`.
    "fsdp": (
        (axes.VOCAB, MODEL),
        (axes.EMBED, DATA),
        (axes.MLP, MODEL),
        (axes.HEADS, MODEL),
        (axes.KV, None),
        (axes.JOINED_KV, MODEL),
        (axes.RELPOS_BUCKETS, None),
        (axes.LAYERS, None),
        (axes.ADAPTER, None),
        (axes.LORA_RANK, None),
        (axes.PROMPT, None),
        (axes.ACT_BATCH, DATA),
        (axes.ACT_LENGTH, None),
        (axes.ACT_EMBED, None),
        (axes.ACT_MLP, MODEL),
        (axes.ACT_HEADS, MODEL),
        (axes.ACT_KV, None),
        (axes.ACT_VOCAB, MODEL),
    ),
}


def logical_axis_rules(mode: str = "tensor_parallel") -> LogicalRules:
    """The rules table of a sharding mode: `data_parallel`, `tensor_parallel` or `fsdp`.

    Raises:
        ValueError: for an unknown mode (the message lists the modes).
    """
    if mode not in RULES:
        near = difflib.get_close_matches(mode, list(RULES), n=1)
        hint = f" Did you mean {near[0]!r}?" if near else ""
        raise ValueError(f"Unknown sharding mode {mode!r}; expected one of {sorted(RULES)}.{hint}")
    return RULES[mode]
