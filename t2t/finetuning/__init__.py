"""How a pretrained network is adapted: parameter groups, the fine-tuning methods of the T5 paper
and its companion studies, and chains of training stages.

    finetuning = FineTuning(trainable=["adapters", "layer_norms"])   # with adapter_size > 0
    tx = finetuning.wrap(optim.adafactor(optim.constant()), depths_of_config(config))

The network-side additions (adapter layers, LoRA, soft prompts) are fields of
`t2t.nn.TransformerConfig`; `t2t.nn.merge_lora` folds LoRA into the kernels.
"""

from t2t.finetuning.groups import GROUPS, check_specs, count, depths_of, select
from t2t.finetuning.methods import FineTuning, depths_of_config, layer_factors

__all__ = [
    "GROUPS",
    "FineTuning",
    "check_specs",
    "count",
    "depths_of",
    "depths_of_config",
    "layer_factors",
    "select",
]
