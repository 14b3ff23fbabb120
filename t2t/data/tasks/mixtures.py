"""The paper's mixtures (sections 3.5 and 3.7) over C4 and every supervised benchmark.

Imports the C4, GLUE, SuperGLUE and generation registrations, then registers:
  - `all_equal`: C4 span corruption and every supervised training task, equal rates;
  - `all_proportional_k<K>`: examples-proportional with cap K, K in 2^16 .. 2^21;
  - `all_temperature_t<T>`: temperature-scaled, T in 2, 4, 8 (K = 2^21);
  - `all_multitask_<size>`: the final multi-task pre-training mixture of each model size (C4 at
    its artificial size, WMT En-Fr / En-De capped at 1M, the rest examples-proportional);
  - `leave_one_out_<group>`: C4 and every supervised group but one (K = 2^19);
  - `supervised_equal`, `supervised_proportional_k<K>`: the supervised tasks alone, and
    `large_supervised_{equal,proportional}` (WMT En-De, En-Fr, CNN/DM) for supervised pre-training.
Rates are computed when a mixture is used, from TFDS split info; plan them offline with
`t2t.data.mixing.examples_proportional(..., sizes=...)`.
"""

from __future__ import annotations

from t2t.data import mixing, registry
from t2t.data.tasks import c4, generation, glue, superglue  # noqa: F401 (registers their tasks)

UNLABELED_TASK = "c4_span_corruption"
# Supervised training tasks by group; a group is left out as a whole in leave-one-out mixtures.
SUPERVISED_GROUPS = {
    "glue": glue.TRAIN_TASKS,
    "super_glue": superglue.TRAIN_TASKS,
    "squad": ("squad",),
    "cnn_dailymail": ("cnn_dailymail",),
    "wmt_ende": ("wmt_ende",),
    "wmt_enfr": ("wmt_enfr",),
    "wmt_enro": ("wmt_enro",),
}
SUPERVISED_TASKS = tuple(name for group in SUPERVISED_GROUPS.values() for name in group)
WMT_CAPPED = ("wmt_ende", "wmt_enfr")
LARGE_SUPERVISED_TASKS = ("wmt_ende", "wmt_enfr", "cnn_dailymail")
# NOTE: the paper's multi-task comparisons (Table 14) mix examples-proportionally with K = 2^19.
MULTITASK_K = 2**19


def _add(name: str, tasks, default_rate=None) -> str:
    registry.add_mixture(name, list(tasks), __name__, default_rate=default_rate)
    return name


def register() -> list[str]:
    """Registers every mixture listed in the module docstring; returns their names."""
    everything = (UNLABELED_TASK, *SUPERVISED_TASKS)
    names = [_add("all_equal", everything, 1.0)]
    for k in mixing.PAPER_K_SWEEP:
        names.append(_add(f"all_proportional_k{k}", everything, mixing.examples_proportional(k)))
    for t in mixing.PAPER_TEMPERATURES:
        rate = mixing.examples_proportional(mixing.PAPER_K_SWEEP[-1], temperature=t)
        names.append(_add(f"all_temperature_t{t}", everything, rate))
    for size in mixing.ARTIFICIAL_UNLABELED_SIZES:
        pairs = mixing.paper_multitask_rates(
            list(SUPERVISED_TASKS), UNLABELED_TASK, size, wmt_tasks=WMT_CAPPED
        )
        names.append(_add(f"all_multitask_{size}", pairs))
    for group, left_out in SUPERVISED_GROUPS.items():
        kept = [t for t in everything if t not in left_out]
        names.append(
            _add(f"leave_one_out_{group}", kept, mixing.examples_proportional(MULTITASK_K))
        )
    names.append(_add("supervised_equal", SUPERVISED_TASKS, 1.0))
    names.append(
        _add(
            f"supervised_proportional_k{MULTITASK_K}",
            SUPERVISED_TASKS,
            mixing.examples_proportional(MULTITASK_K),
        )
    )
    names.append(_add("large_supervised_equal", LARGE_SUPERVISED_TASKS, 1.0))
    names.append(
        _add(
            "large_supervised_proportional", LARGE_SUPERVISED_TASKS, mixing.examples_proportional()
        )
    )
    return names


MIXTURES = register()
