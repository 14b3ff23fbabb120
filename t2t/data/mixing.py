"""Mixing rates of the T5 paper (section 3.5.2) as seqio rate functions.

A seqio `Mixture` samples each task with probability proportional to its rate. The paper compares:
  - examples-proportional mixing with a cap K: r_m = min(e_m, K) / sum_n min(e_n, K);
  - temperature-scaled mixing: each capped rate raised to 1/T, then renormalized;
  - equal mixing: every task at the same rate;
and its final multi-task runs treat the unlabeled task as having an artificial size per model
size and cap WMT En-Fr and En-De at 1M examples. The formulas match
`seqio.mixing_rate_num_examples(task, maximum=K, temperature=T, scale=s)`.

Worked example, e = (100, 1000, 10000) examples, K = 2000, T = 2:
  capped (100, 1000, 2000); rates (10, 31.62, 44.72); proportions (0.116, 0.366, 0.518).

Example counts come from each task's `num_input_examples(split)` (TFDS split info, or the counts a
text task was registered with); pass `sizes={task_name: count}` to decide them explicitly
(offline, in tests, or to plan a mixture before downloading its data).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import seqio

from t2t.data import registry

RateFn = Callable[[seqio.Task], float]

# Paper section 3.7: the artificial size given to the unlabeled (C4) task in the multi-task
# pre-training mixture of each model size.
ARTIFICIAL_UNLABELED_SIZES = {
    "small": 710_000,
    "base": 2_620_000,
    "large": 8_660_000,
    "3b": 33_500_000,
    "11b": 133_000_000,
}
WMT_CAP = 1_000_000  # paper: WMT English-French and English-German are capped at 1M examples
PAPER_K_SWEEP = tuple(2**p for p in range(16, 22))  # 2^16 .. 2^21
PAPER_TEMPERATURES = (2, 4, 8)  # with K = 2^21


def num_examples(
    task: seqio.Task, split: str = "train", sizes: Mapping[str, int] | None = None
) -> int:
    """The number of examples of `task`'s `split`: from `sizes` if named there, else the task's.

    Raises:
      ValueError: when neither `sizes` nor the task's data source knows the number.
    """
    if sizes is not None and task.name in sizes:
        return sizes[task.name]
    try:
        count = task.num_input_examples(split)
    except Exception as error:  # noqa: BLE001 - TFDS raises many kinds when metadata is absent
        count, cause = None, error
    else:
        cause = None
    if count is None:
        raise ValueError(
            f"The size of {task.name!r} ({split}) is unknown: its data source has no split info "
            f"({cause or 'none recorded'}). Prepare the TFDS dataset, or pass "
            f"sizes={{'{task.name}': N}} to the rate function."
        ) from cause
    return int(count)


def examples_proportional(
    maximum: float | None = None,
    temperature: float = 1.0,
    scale: float = 1.0,
    *,
    sizes: Mapping[str, int] | None = None,
    split: str = "train",
) -> RateFn:
    """The rate function of examples-proportional (and temperature-scaled) mixing.

    Args:
      maximum: the cap K, applied after `scale` (None: no cap).
      temperature: T; the capped rate is raised to 1/T.
      scale: multiplies the example count before capping.
      sizes: explicit example counts by task name (see the module docstring).
      split: whose size counts.

    Returns:
      `rate(task) -> float`, the unnormalized rate (seqio normalizes).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}.")
    if maximum is not None and maximum <= 0:
        raise ValueError(f"The cap K must be > 0 (or None for no cap), got {maximum}.")

    def rate(task: seqio.Task) -> float:
        count = num_examples(task, split, sizes) * scale
        if maximum:
            count = min(count, maximum)
        return float(count) ** (1.0 / temperature)

    return rate


def fixed_size(size: float, temperature: float = 1.0) -> RateFn:
    """A rate treating a task as `size` examples (the artificial size of an unlabeled task)."""
    return lambda task: float(size) ** (1.0 / temperature)


def paper_multitask_rates(
    task_names: list[str],
    unlabeled_task: str,
    model_size: str,
    *,
    wmt_tasks: tuple[str, ...] = (),
    sizes: Mapping[str, int] | None = None,
) -> list[tuple[str, RateFn]]:
    """(task, rate) pairs of the paper's multi-task pre-training mixture for `model_size`.

    The unlabeled task counts as ARTIFICIAL_UNLABELED_SIZES[model_size] examples, the tasks in
    `wmt_tasks` are capped at WMT_CAP, every other task is examples-proportional without a cap.
    """
    if model_size not in ARTIFICIAL_UNLABELED_SIZES:
        raise ValueError(
            f"Unknown model size {model_size!r}; expected one of {sorted(ARTIFICIAL_UNLABELED_SIZES)}."
        )
    pairs = [(unlabeled_task, fixed_size(ARTIFICIAL_UNLABELED_SIZES[model_size]))]
    for name in task_names:
        cap = WMT_CAP if name in wmt_tasks else None
        pairs.append((name, examples_proportional(cap, sizes=sizes)))
    return pairs


def proportions(mixture: seqio.Mixture | str) -> dict[str, float]:
    """Each task's sampling probability in `mixture` (a mixture or its registered name; rates
    normalized to sum to 1)."""
    if isinstance(mixture, str):
        mixture = registry.get_task_or_mixture(mixture)
        if not isinstance(mixture, seqio.Mixture):
            raise ValueError(f"{mixture.name!r} is a task, not a mixture: it is sampled alone.")
    rates = {task.name: float(mixture.get_rate(task)) for task in mixture.tasks}
    total = sum(rates.values())
    if total <= 0:
        raise ValueError(f"Mixture {mixture.name!r} has no task with a positive rate.")
    return {name: rate / total for name, rate in rates.items()}
