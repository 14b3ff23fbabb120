"""A study's numbers: per arm and task the spread over seeds, degenerate runs, the suite average,
a significance test against the baseline arm, and the arms' ordering beside the paper's.

Pure functions of plain data, so they can be checked against hand-computed values:

    scores = {("base", "t1", 0): 80.0, ("base", "t1", 1): 82.0, ("new", "t1", 0): 70.0, ...}
    result = aggregate(scores, baselines={"t1": 50.0}, baseline_arm="base")

Conventions: the sample standard deviation (ddof 1, as the paper's Table 1); a run is degenerate
when its task score is at or below the task's constant baseline; an arm's suite average is, per
seed, the mean of its task scores, then the mean (and std) over seeds; the test is Welch's
unequal-variance t-test over seeds (two-sided), reported as a p-value; a missing run (not
finished) is left out and counted.

Units of replication: restarts that fine-tune one pretrained checkpoint are not independent
samples of an arm (they share the checkpoint), so a test over them compares two checkpoints,
not two arms. With `units` (arm -> run -> unit, e.g. its pretraining), each unit's runs are
averaged into one observation and the arms are also tested on those (`suite_by_unit`,
`p_value_units`); a unit of one run is the run.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

Key = tuple[str, str, Any]  # (arm, task, run: its seed, or "pretraining<p>/seed<s>")


def spread(values: Sequence[float]) -> dict[str, Any]:
    """n, mean, sample std (0 for one value), min and max."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "n": int(array.size),
        "mean": float(array.mean()),
        "std": float(array.std(ddof=1)) if array.size > 1 else 0.0,
        "min": float(array.min()),
        "max": float(array.max()),
    }


def welch_p_value(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of Welch's t-test; None with fewer than two values a side (or no
    variance at all)."""
    import scipy.stats

    if len(a) < 2 or len(b) < 2:
        return None
    if np.std(a) == 0 and np.std(b) == 0:
        return None if np.mean(a) == np.mean(b) else 0.0
    return float(scipy.stats.ttest_ind(a, b, equal_var=False).pvalue)


def aggregate(
    scores: Mapping[Key, float | None],
    *,
    baselines: Mapping[str, float],
    baseline_arm: str | None = None,
    arms: Sequence[str] | None = None,
    tasks: Sequence[str] | None = None,
    units: Mapping[str, Mapping[Any, str]] | None = None,
) -> dict[str, Any]:
    """The study's table (see the module docstring).

    Args:
      scores: (arm, task, seed) -> task score, None for a run without a result.
      baselines: task -> its constant baseline's score.
      baseline_arm: the arm the others are tested against (default: the first).
      arms, tasks: their order (default: first appearance).
      units: arm -> run -> its unit of replication (default: each run its own).

    Returns:
      {"arms": {arm: {"tasks": {task: spread + degenerate + by_seed (run -> score)}, "suite":
      spread of per-run averages, "suite_by_seed", "p_value": vs the baseline arm on the
      suite over runs, "p_values": per task, "suite_by_unit": unit -> mean of its runs'
      suite averages, "unit_suite": their spread, "p_value_units": vs the baseline arm over
      units}},
      "missing": [keys without a result], "baselines": ...}.
    """
    arms = list(arms or dict.fromkeys(k[0] for k in scores))
    tasks = list(tasks or dict.fromkeys(k[1] for k in scores))
    baseline_arm = baseline_arm or arms[0]
    missing = sorted([list(k) for k, v in scores.items() if v is None])
    done = {k: float(v) for k, v in scores.items() if v is not None}
    result: dict[str, Any] = {
        "arms": {},
        "missing": missing,
        "baselines": dict(baselines),
        "baseline_arm": baseline_arm,
        "tasks": tasks,
    }
    for arm in arms:
        result["arms"][arm] = _arm_entry(arm, done, tasks, baselines, (units or {}).get(arm))
    reference = result["arms"][baseline_arm]
    for arm in arms:
        if arm != baseline_arm:
            result["arms"][arm].update(_tests(result["arms"][arm], reference, tasks))
        else:
            result["arms"][arm].update(p_value=None, p_value_units=None, p_values={})
    return result


def _arm_entry(arm, done, tasks, baselines, units) -> dict[str, Any]:
    """One arm's spreads by task, of its runs' suite averages and of its units' means."""
    entry: dict[str, Any] = {"tasks": {}}
    for task in tasks:
        by_seed = {s: v for (a, t, s), v in sorted(done.items()) if a == arm and t == task}
        values = list(by_seed.values())
        stats = spread(values)
        stats["degenerate"] = sum(v <= baselines.get(task, -math.inf) for v in values)
        stats["by_seed"] = {str(s): v for s, v in by_seed.items()}
        entry["tasks"][task] = stats
    seeds = sorted({s for (a, _, s) in done if a == arm})
    complete = [s for s in seeds if all((arm, t, s) in done for t in tasks)]
    per_seed = {s: float(np.mean([done[(arm, t, s)] for t in tasks])) for s in complete}
    entry["suite"] = spread(list(per_seed.values()))
    entry["suite_by_seed"] = {str(s): v for s, v in per_seed.items()}
    entry["suite_by_unit"] = unit_means(per_seed, units)
    entry["unit_of_run"] = {str(run): str((units or {}).get(run, run)) for run in per_seed}
    entry["unit_suite"] = spread(list(entry["suite_by_unit"].values()))
    return entry


def _tests(entry, reference, tasks) -> dict[str, Any]:
    """Welch's p-values of an arm against the baseline arm: on the suite over runs and over
    units, and per task over runs."""
    return {
        "p_value": welch_p_value(
            list(entry["suite_by_seed"].values()), list(reference["suite_by_seed"].values())
        ),
        "p_value_units": welch_p_value(
            list(entry["suite_by_unit"].values()), list(reference["suite_by_unit"].values())
        ),
        "p_values": {
            task: welch_p_value(
                list(entry["tasks"][task]["by_seed"].values()),
                list(reference["tasks"][task]["by_seed"].values()),
            )
            for task in tasks
        },
    }


def unit_means(by_run: Mapping[Any, float], units: Mapping[Any, str] | None) -> dict[str, float]:
    """unit -> the mean of its runs' values (each run its own unit without `units`)."""
    grouped: dict[str, list[float]] = {}
    for run, value in by_run.items():
        name = str(run) if units is None else str(units.get(run, run))
        grouped.setdefault(name, []).append(value)
    return {name: float(np.mean(values)) for name, values in grouped.items()}


def ordering(result: Mapping[str, Any]) -> list[str]:
    """The arms by suite average, best first (arms without one last)."""
    arms = result["arms"]
    return sorted(
        arms,
        key=lambda a: (
            -(arms[a]["suite"]["mean"] if arms[a]["suite"]["mean"] is not None else -math.inf)
        ),
    )


def compare_orderings(
    ours: Mapping[str, float], paper: Mapping[str, float]
) -> list[dict[str, Any]]:
    """Every pair of arms both sides score: which is better in the paper and here.

    Args:
      ours: arm -> our suite average.
      paper: arm -> the paper's number for the same row (higher is better).

    Returns:
      [{"pair": [a, b], "paper": winner, "ours": winner, "reproduced": bool}], where a tie on
      either side names no winner and does not count as reproduced.
    """
    pairs = []
    for a, b in itertools.combinations([arm for arm in paper if arm in ours], 2):

        def winner(values):
            return a if values[a] > values[b] else b if values[b] > values[a] else None

        paper_winner, our_winner = winner(paper), winner(ours)
        pairs.append(
            {
                "pair": [a, b],
                "paper": paper_winner,
                "ours": our_winner,
                "reproduced": paper_winner is not None and paper_winner == our_winner,
            }
        )
    return pairs
