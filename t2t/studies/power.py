"""How many seeds a study needs: the power of Welch's t-test, planned before the runs.

A study compares arms with Welch's two-sided t-test over seeds (`aggregate`). Whether a gap the
paper reports can show up at p < 0.05 depends on how large that gap is on our benchmark and how
much the scores vary from seed to seed. The plan:

1. The gap to expect. The paper's gap between two arms, as a fraction of the better arm's score
   (its distance from 0), is carried over to our benchmark as the same fraction of the distance
   from the constant baseline (predicting the most frequent answer) to our best arm: what a
   model earns above guessing. Example: the paper's 83.28 vs 66.22 (Table 1) is a fraction
   0.205; with our best arm at 62.9 and the constant baseline at 24.2, the gap to expect is
   0.205 x 38.7 = 7.9 points.
2. The spread. The per-seed standard deviations of the arms, taken from a finished study with
   the same profile (or given).
3. The seeds. The smallest n per arm at which Welch's test at level alpha (two-sided) has the
   asked power (0.8) against that gap, from the noncentral t distribution with the
   Welch-Satterthwaite degrees of freedom. Check value: equal spreads and a gap of one standard
   deviation need 17 seeds per arm, half a deviation 64 (Cohen's tables).

That approximation is good for tens of seeds and generous for a few: Welch's degrees of
freedom are themselves estimated, so at 3 per arm the test's true power is lower (0.81 computed
against 0.71 simulated for equal spreads). Replicated designs are therefore planned by
simulation (`simulated_power`), which draws the scores and runs the test itself.

Replicated pretraining (`plan_design`): an arm's restarts that fine-tune one pretrained model
share its luck, so its score varies on two levels, between pretrainings (std `between`) and
between restarts of one (std `within`), both read from a pilot that replicated its pretraining
(`nested_spread`). An arm of k pretrainings with m restarts each is tested on the k means, each
varying by sqrt(between^2 + within^2 / m): more restarts shrink only the second term, so when
pretrainings vary most, power comes from k. The design chosen is the cheapest (k, m) whose
simulated power reaches the target, a pretraining costing what the pilot's took.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

ALPHA = 0.05
POWER = 0.8


def welch_power(gap: float, std_a: float, std_b: float, n: int, alpha: float = ALPHA) -> float:
    """Power of Welch's two-sided test at level `alpha` with `n` seeds per arm against a true
    difference `gap` between arms whose scores vary by `std_a` and `std_b` over seeds."""
    import scipy.stats

    if n < 2:
        return 0.0
    var_a, var_b = std_a**2 / n, std_b**2 / n
    if var_a + var_b == 0:
        return 1.0 if gap else 0.0
    df = (var_a + var_b) ** 2 / ((var_a**2 + var_b**2) / (n - 1))
    noncentrality = abs(gap) / math.sqrt(var_a + var_b)
    critical = scipy.stats.t.ppf(1 - alpha / 2, df)
    t = scipy.stats.nct(df, noncentrality)
    return float(t.sf(critical) + t.cdf(-critical))


def simulated_power(
    gap: float,
    std_a: float,
    std_b: float,
    n: int,
    *,
    alpha: float = ALPHA,
    simulations: int = 20000,
    seed: int = 0,
) -> float:
    """The chance that Welch's two-sided test over `n` values per arm finds p < `alpha` with the
    better arm ahead, for values drawn normal with these spreads `gap` apart (a fixed seed: the
    same question gets the same answer)."""
    import numpy as np
    import scipy.stats

    if n < 2:
        return 0.0
    rng = np.random.default_rng(seed)
    a = rng.normal(abs(gap), std_a, size=(simulations, n))
    b = rng.normal(0.0, std_b, size=(simulations, n))
    var_a, var_b = a.var(axis=1, ddof=1) / n, b.var(axis=1, ddof=1) / n
    total = np.maximum(var_a + var_b, 1e-300)
    t = (a.mean(axis=1) - b.mean(axis=1)) / np.sqrt(total)
    df = total**2 / np.maximum((var_a**2 + var_b**2) / (n - 1), 1e-300)
    p = 2 * scipy.stats.t.sf(np.abs(t), df)
    return float(np.mean((p < alpha) & (t > 0)))


def nested_spread(arm: Mapping[str, Any]) -> dict[str, Any] | None:
    """An arm's spreads on both levels, from its entry in a study.json (`aggregate`): `within`,
    the pooled std of restarts around their pretraining's mean; `between`, the std of the
    pretrainings' true means (the units' variance less what their restarts add, at least 0);
    `unit` the std of a unit's mean as measured. None unless the arm has two or more units and
    some unit has two or more restarts."""
    import numpy as np

    by_run, unit_of = arm.get("suite_by_seed", {}), arm.get("unit_of_run", {})
    groups: dict[str, list[float]] = {}
    for run, value in by_run.items():
        groups.setdefault(unit_of.get(run, run), []).append(value)
    sizes = [len(v) for v in groups.values()]
    if len(groups) < 2 or max(sizes) < 2:
        return None
    squares = sum(float(np.sum((np.asarray(v) - np.mean(v)) ** 2)) for v in groups.values())
    within_var = squares / sum(n - 1 for n in sizes)
    means = [float(np.mean(v)) for v in groups.values()]
    unit_var = float(np.var(means, ddof=1))
    restarts = len(sizes) / sum(1 / n for n in sizes)  # harmonic mean
    between_var = max(0.0, unit_var - within_var / restarts)
    return {
        "between": math.sqrt(between_var),
        "within": math.sqrt(within_var),
        "unit": math.sqrt(unit_var),
        "units": len(groups),
        "restarts": restarts,
    }


def plan_design(
    gap: float,
    spread_a: Mapping[str, float],
    spread_b: Mapping[str, float],
    *,
    pretraining_cost: float,
    restart_cost: float,
    alpha: float = ALPHA,
    power: float = POWER,
    max_units: int = 30,
    restarts: Sequence[int] = (1, 2, 3, 4, 6, 8),
    simulations: int = 4000,
) -> dict[str, Any] | None:
    """The cheapest design (k pretrainings, m restarts of each, per arm) whose simulated power
    reaches `power` against `gap`, from each arm's `between` and `within` spreads; its cost is
    k * (pretraining_cost + m * restart_cost) per arm. None when no design up to `max_units`
    pretrainings does."""
    best = None
    for m in restarts:
        std_a = math.sqrt(spread_a["between"] ** 2 + spread_a["within"] ** 2 / m)
        std_b = math.sqrt(spread_b["between"] ** 2 + spread_b["within"] ** 2 / m)
        for k in range(2, max_units + 1):
            cost = k * (pretraining_cost + m * restart_cost)
            if best is not None and cost >= best["cost"]:
                break
            reached = simulated_power(gap, std_a, std_b, k, alpha=alpha, simulations=simulations)
            if reached >= power:
                best = {"units": k, "restarts": m, "power": reached, "cost": cost}
                break
    return best


def seeds_needed(
    gap: float,
    std_a: float,
    std_b: float,
    *,
    alpha: float = ALPHA,
    power: float = POWER,
    max_seeds: int = 1000,
    simulate_below: int = 30,
) -> int | None:
    """The fewest seeds per arm giving Welch's test `power` against `gap`; None when even
    `max_seeds` do not (a gap of 0, or one lost in the spread). Below `simulate_below` seeds
    the count from the noncentral t is raised until the simulated power reaches `power` too."""
    if gap == 0:
        return None
    for n in range(2, max_seeds + 1):
        if welch_power(gap, std_a, std_b, n, alpha) >= power:
            break
    else:
        return None
    while n < simulate_below and simulated_power(gap, std_a, std_b, n, alpha=alpha) < power:
        n += 1
    return n


def expected_gap(paper_a: float, paper_b: float, best: float, constant: float) -> float:
    """The paper's gap between two arms carried to our benchmark: |a - b| / max(a, b) of the
    distance from our constant baseline to our best arm."""
    top = max(paper_a, paper_b)
    if top <= 0:
        raise ValueError(f"Expected positive paper scores, got {paper_a} and {paper_b}.")
    return abs(paper_a - paper_b) / top * (best - constant)


def spread_of(result: Mapping[str, Any], arms: Sequence[str] = ()) -> dict[str, float]:
    """From a finished study's study.json: each arm's per-seed std of the suite average, the
    pooled std (root mean square over arms), the best arm's suite mean and the constant
    baseline's suite score (the mean of the task baselines); `arms` (names) limits all of it
    to those arms, e.g. the one trained as the planned study's arms are.

    Raises:
      ValueError: an arm the study does not have, or no arm with two or more seeds.
    """
    unknown = sorted(set(arms) - set(result["arms"]))
    if unknown:
        raise ValueError(f"The study has no arms {unknown}; it has {sorted(result['arms'])}.")
    chosen = {a: d for a, d in result["arms"].items() if not arms or a in arms}
    stds = {a: float(d["suite"]["std"]) for a, d in chosen.items() if d["suite"].get("n", 0) >= 2}
    if not stds:
        raise ValueError("No arm with two or more seeds in the study: no spread to plan from.")
    baselines = result["baselines"]
    return {
        "pooled_std": math.sqrt(sum(s**2 for s in stds.values()) / len(stds)),
        "arm_stds": stds,
        "best": max(float(d["suite"]["mean"]) for d in chosen.values()),
        "constant": sum(baselines.values()) / len(baselines),
    }


def plan_pairs(
    paper_values: Mapping[str, float],
    *,
    std: float,
    best: float,
    constant: float,
    alpha: float = ALPHA,
    power: float = POWER,
) -> list[dict[str, Any]]:
    """For every pair of arms the paper scores: the paper's values, the gap to expect here and
    the seeds per arm it needs (the same `std` for both arms)."""
    arms: Sequence[str] = list(paper_values)
    rows = []
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            gap = expected_gap(paper_values[a], paper_values[b], best, constant)
            rows.append(
                {
                    "pair": [a, b],
                    "paper": [paper_values[a], paper_values[b]],
                    "gap": gap,
                    "seeds": seeds_needed(gap, std, std, alpha=alpha, power=power),
                }
            )
    return rows
