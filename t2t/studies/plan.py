"""What `t2t study NAME --plan` prints before anything trains: the grid's size, the wall time
its stages will take, and the seeds each pair of arms the paper scores needs.

The wall time is measured, not modelled: every stage a chain trains records its task, steps
and seconds in its `chain.json` (`t2t.chain.run`), so a finished study (or the planned one, part
done) gives the seconds per step of each stage on the machine that ran it, startup, compiling,
evaluating and checkpointing included. The estimate is the sum, over the stages still to train
(shared ones once), of their steps times the median rate of the timed stages of the same name
and task; where none was timed, of the same name on any task (a task's lengths change its rate:
this is the weaker estimate, and the plan says which it used); where none of that name either,
of every timed stage. It holds for the machine and load of the measured runs.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from t2t import chain, files
from t2t.studies import paper as paper_lib
from t2t.studies import power

CHAIN_FILE = "chain.json"


def describe(grid, unscored, study_dir, search_paths, **options) -> str:
    """The plan: the grid's size, the wall time of what is left to train, and with
    `options["plan_from"]` (a finished study's study.json) the seeds each paper pair needs.

    Args:
      grid: every run (`runner.Cell`) of the study.
      unscored: ((arm name, task), run directory, stages) of each run without a score.
      study_dir: the study's directory (where its own finished stages are timed).
      search_paths: gin search paths of the stages' files.
      options: name, paper, plan_from, plan_arms, plan_timing as `t2t.studies.run` takes them.
    """
    arms = list(dict.fromkeys(cell.arm["name"] for cell in grid))
    tasks = list(dict.fromkeys(cell.task for cell in grid))
    seeds = list(dict.fromkeys(cell.seed for cell in grid))
    replicas = list(dict.fromkeys(cell.pretraining for cell in grid))
    pretrainings = "" if replicas == [None] else f" x {len(replicas)} pretrainings"
    lines = [
        f"{options['name']}: {len(arms)} arms x {len(tasks)} tasks{pretrainings} x "
        f"{len(seeds)} seeds = {len(grid)} runs (shared stages once)."
    ]
    timing = list(options["plan_timing"]) or [study_dir]
    if not options["plan_timing"] and options["plan_from"]:
        measured = json.loads(files.read_text(options["plan_from"])).get("study_dir")
        if measured and measured not in timing:
            timing.append(measured)
    stages = stages_to_train(unscored, search_paths)
    lines += wall_time_lines(stages, timing, len(unscored))
    if options["plan_from"]:
        pilot = json.loads(files.read_text(options["plan_from"]))
        designs = design_lines(arms, grid, pilot, timing, **options)
        lines += designs or seeds_lines(
            arms, options["paper"], options["plan_from"], options["plan_arms"]
        )
    return "\n".join(lines)


def _stage_seconds(directories: Iterable[str]) -> dict[str, list[float]]:
    """Wall seconds of every timed, fully trained stage under `directories`, by stage name."""
    found: dict[str, list[float]] = {}
    for top in directories:
        if not files.isdir(top):
            continue
        for name in files.files_under(top):
            if name.split("/")[-1] != CHAIN_FILE:
                continue
            for record in json.loads(files.read_text(files.join(top, name))).get("stages", []):
                if record.get("seconds") is not None and not record.get("skipped"):
                    found.setdefault(record["name"], []).append(record["seconds"])
    return found


def design_lines(arms, grid, pilot, timing, **options) -> list[str] | None:
    """With a pilot that replicated its pretraining (`power.nested_spread`), the cheapest
    design (pretrainings x restarts per arm) for each claim of the planned study (each pair the
    paper scores without claims); None when the pilot did not replicate its pretraining."""
    chosen = options.get("plan_arms") or list(pilot["arms"])
    unknown = sorted(set(chosen) - set(pilot["arms"]))
    if unknown:
        raise ValueError(f"The study has no arms {unknown}; it has {sorted(pilot['arms'])}.")
    spreads = {a: power.nested_spread(pilot["arms"][a]) for a in chosen}
    spreads = {a: s for a, s in spreads.items() if s is not None}
    if not spreads:
        return None
    values = _paper_values(arms, options.get("paper") or {})
    claims = options.get("claims")
    if claims:
        pairs = [tuple(c.split(" > ")) for c in claims]
    else:
        pairs = [(a, b) for i, a in enumerate(values) for b in list(values)[i + 1 :]]
    widest = {level: max(s[level] for s in spreads.values()) for level in ("between", "within")}
    costs, timed = _unit_costs(grid, [*timing, pilot.get("study_dir") or ""])
    best = max(float(entry["unit_suite"]["mean"]) for entry in pilot["arms"].values())
    constant = sum(pilot["baselines"].values()) / len(pilot["baselines"])
    lines = [
        f"Spreads from {options['plan_from']} (replicated pretraining): "
        + "; ".join(
            f"{arm}: between pretrainings {s['between']:.2f}, within {s['within']:.2f} "
            f"({s['units']} x {s['restarts']:.0f})"
            for arm, s in spreads.items()
        )
        + f". An arm the pilot lacks takes the widest ({widest['between']:.2f}, "
        f"{widest['within']:.2f}); best unit mean {best:.1f}, constant baseline {constant:.1f}.",
        "Cost of a pretraining and of one restart on every task: "
        + (
            f"{costs[0]:.0f} s and {costs[1]:.0f} s (medians of the timed stages)"
            if timed
            else "not timed, counted equal"
        )
        + ".",
        "",
        f"Per {'claim' if claims else 'pair the paper scores'}: the cheapest design whose "
        f"Welch test over pretrainings reaches power {power.POWER} at p < {power.ALPHA} with "
        "the better arm ahead (simulated), against the paper's gap carried over:",
        "",
        "| arms | paper | gap here | pretrainings x restarts | power | cost per arm |",
        "|---|---|---|---|---|---|",
    ]
    scale = (best, constant)
    return lines + [_pair_row(a, b, values, spreads, widest, scale, costs, timed) for a, b in pairs]


def _pair_row(a, b, values, spreads, widest, scale, costs, timed) -> str:
    """The design table's row for arms `a` vs `b`: the paper's gap carried over to this
    study's `scale` (best unit mean, constant baseline), and the cheapest design for it."""
    if a not in values or b not in values:
        return f"| {a} vs {b} | - | - | the paper scores only one: no gap | - | - |"
    gap = power.expected_gap(values[a], values[b], *scale)
    design = power.plan_design(
        gap,
        spreads.get(a, widest),
        spreads.get(b, widest),
        pretraining_cost=costs[0],
        restart_cost=costs[1],
    )
    return f"| {a} vs {b} | {values[a]:.2f} vs {values[b]:.2f} | {gap:.2f} " + _design_cells(
        design, timed
    )


def _paper_values(arms, paper: Mapping[str, Any]) -> dict[str, float]:
    """The paper's number of each planned arm it has a row for."""
    values = {
        arm: paper_lib.value(paper["table"], row, paper.get("column", "GLUE"))
        for arm, row in paper.get("rows", {}).items()
        if arm in set(arms)
    }
    return {arm: v for arm, v in values.items() if v is not None}


def _unit_costs(grid, timing) -> tuple[tuple[float, float], bool]:
    """(seconds of a pretraining, of one restart on every task) from the timed stages under
    `timing`, and whether both were timed (else each counts 1)."""
    first = grid[0].arm["stages"]
    shared = next((st["name"] for st in first[:-1] if st.get("share") in ("seeds", "all")), None)
    seconds = _stage_seconds(timing)
    tasks = len({cell.task for cell in grid})
    pretraining = statistics.median(seconds[shared]) if shared in seconds else None
    last = first[-1]["name"]
    restart = statistics.median(seconds[last]) if last in seconds else None
    return (pretraining or 1.0, (restart or 1.0) * tasks), bool(pretraining and restart)


def _design_cells(design: Mapping[str, Any] | None, timed: bool) -> str:
    if design is None:
        return "| more than 30 pretrainings | - | - |"
    cost = design["cost"]
    cost_text = f"{cost / 60:.0f} min" if timed else f"{cost:.0f} stages"
    return f"| {design['units']} x {design['restarts']} | {design['power']:.2f} | {cost_text} |"


def stages_to_train(unscored, search_paths) -> list[tuple[str, str | None, int]]:
    """(name, task, steps left) of every stage the unscored runs still train, a shared stage
    once; a stage's steps are its TRAIN_STEPS less the step of its latest checkpoint."""
    return [stage for run in stages_by_run(unscored, search_paths) for stage in run]


def stages_by_run(unscored, search_paths) -> list[list[tuple[str, str | None, int]]]:
    """As `stages_to_train`, one list per unscored run in its order: a shared stage is in the
    list of the first run that trains it."""
    records: dict[Any, dict[str, dict]] = {}
    by_run, seen = [], set()
    for key, run_dir, stages in unscored:
        if key not in records:  # the seeds change no stage's task or steps
            checked = chain.validate(run_dir, stages, search_paths=search_paths)
            records[key] = {record["name"]: record for _, _, record in checked}
        left = []
        for stage in stages:
            if stage.directory in seen:
                continue
            seen.add(stage.directory)
            record = records[key][stage.name]
            remaining = (record["train_steps"] or 0) - chain.step_in(stage.directory)
            if remaining > 0:
                left.append((stage.name, record.get("task"), remaining))
        by_run.append(left)
    return by_run


def stage_rates(directories: Iterable[str]) -> dict[tuple[str, str | None], list[float]]:
    """Seconds per training step of every timed stage recorded under `directories` (the
    `chain.json` files anywhere below them), by (stage name, task); the task is None for
    stages recorded before chain.json named it."""
    rates: dict[tuple[str, str | None], list[float]] = {}
    for top in directories:
        found = files.files_under(top) if files.isdir(top) else []
        for name in found:
            if name.split("/")[-1] == CHAIN_FILE:
                add_rates(rates, files.join(top, name))
    return rates


def add_rates(rates: dict[tuple[str, str | None], list[float]], chain_file: str) -> None:
    """Adds the timed stages of one `chain.json` to `rates` (as `stage_rates` gives them)."""
    for record in json.loads(files.read_text(chain_file)).get("stages", []):
        steps, seconds = record.get("trained_steps"), record.get("seconds")
        if steps and seconds is not None and not record.get("skipped"):
            rates.setdefault((record["name"], record.get("task")), []).append(seconds / steps)


def eta(stages_left: Sequence[tuple[str, str | None, int]], rates) -> str:
    """ ", ETA <duration>" of `stages_left` at `rates` (`wall_time`), or "" with nothing to
    train or nothing timed yet: what a study prints before each run."""
    seconds = wall_time(stages_left, rates)["seconds"] if stages_left else None
    return "" if not seconds else f", ETA {_duration(seconds)}"


def wall_time(
    stages: Sequence[tuple[str, str | None, int]],
    rates: Mapping[tuple[str, str | None], Sequence[float]],
) -> dict:
    """The estimate for `stages` ((name, task, train steps) of each stage to train) from
    `rates` (seconds per step by (name, task), as `stage_rates` gives them).

    Returns:
      {"seconds": total or None when nothing was timed, "groups": {(name, task): {"stages",
      "steps", "rate", "timed" (how many measured stages gave the rate), "source" ("task":
      stages of this name and task; "name": of this name, other tasks; "all": every timed
      stage)}}}.

    Example: [("pretrain", "c4", 500), ("finetune", "glue", 300), ("finetune", "glue", 300)]
    with rates {("pretrain", "c4"): [0.4], ("finetune", "glue"): [0.5, 0.7]}
    -> 500 * 0.4 + 600 * 0.6 = 560 s.
    """
    by_name: dict[str, list[float]] = {}
    for (name, _), values in rates.items():
        by_name.setdefault(name, []).extend(values)
    every = [r for values in rates.values() for r in values]
    groups: dict[tuple[str, str | None], dict[str, Any]] = {}
    for name, task, steps in stages:
        entry = groups.setdefault((name, task), {"stages": 0, "steps": 0})
        entry["stages"] += 1
        entry["steps"] += int(steps)
    total = 0.0
    for (name, task), entry in groups.items():
        for source, timed in (
            ("task", rates.get((name, task), ())),
            ("name", by_name.get(name, ())),
            ("all", every),
        ):
            if timed:
                break
        if not timed:
            return {"seconds": None, "groups": groups}
        entry.update(source=source, timed=len(timed), rate=statistics.median(timed))
        total += entry["rate"] * entry["steps"]
    return {"seconds": total, "groups": groups}


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def wall_time_lines(
    stages: Sequence[tuple[str, str | None, int]], timing_dirs: Sequence[str], runs_left: int
) -> list[str]:
    """The wall-time part of the plan: what is left to train and how long it takes."""
    if not stages:
        return ["Wall time: nothing left to train (every run has its score)."]
    steps = sum(s for _, _, s in stages)
    head = f"Wall time: {runs_left} runs left, {len(stages)} stages to train ({steps:,} steps)"
    rates = stage_rates(d for d in timing_dirs if files.isdir(d))
    estimate = wall_time(stages, rates)
    if estimate["seconds"] is None:
        return [
            f"{head}; no timed stage under {', '.join(timing_dirs) or 'any directory'} to "
            "estimate from: train one run of the study (--arms NAME --seeds 0) or give "
            "--plan_timing=DIR of a finished study run on this machine."
        ]
    sources = {
        "task": "median of {} timed",
        "name": "task not timed: median of {} of this name on other tasks",
        "all": "name not timed: median of all {}",
    }
    lines = [
        f"{head}: about {_duration(estimate['seconds'])} on the machine and load that ran the "
        f"timed stages under {', '.join(timing_dirs)}."
    ]
    for (name, task), entry in estimate["groups"].items():
        lines.append(
            f"  {name}{f' on {task}' if task else ''}: {entry['stages']} x "
            f"{entry['steps'] // entry['stages']:,} steps at {entry['rate']:.2f} s/step "
            f"({sources[entry['source']].format(entry['timed'])})"
        )
    if any(entry["source"] != "task" for entry in estimate["groups"].values()):
        lines.append(
            "  A rate from other tasks or stages ignores the task's sequence lengths: time one "
            "run of this study for a closer estimate."
        )
    return lines


def seeds_lines(name_arms: Sequence[str], paper, plan_from: str, plan_arms) -> list[str]:
    """The seeds part of the plan: the spread of the finished study whose study.json is
    `plan_from`, and per pair of arms the paper scores, the seeds Welch's test needs."""
    spread = power.spread_of(json.loads(files.read_text(plan_from)), plan_arms)
    lines = [
        f"Spread from {plan_from}: per-seed std of the suite average "
        f"{spread['pooled_std']:.2f} pooled ("
        + ", ".join(f"{arm} {std:.2f}" for arm, std in spread["arm_stds"].items())
        + f"); best arm {spread['best']:.1f}, constant baseline {spread['constant']:.1f}.",
    ]
    rows = (paper or {}).get("rows", {})
    values = {
        arm: paper_lib.value(paper["table"], row, paper.get("column", "GLUE"))
        for arm, row in rows.items()
        if arm in set(name_arms)
    }
    values = {arm: v for arm, v in values.items() if v is not None}
    if len(values) < 2:
        lines.append("The paper scores fewer than two of these arms: no gap to plan for.")
        return lines
    lines += [
        f"Seeds per arm for Welch's test at p < {power.ALPHA} with power {power.POWER}, against "
        f"the paper's gap (Table {paper['table']}, {paper.get('column', 'GLUE')}) carried over "
        "as a fraction of the distance from the constant baseline to the best arm:",
        "",
        "| arms | paper | gap here (points) | seeds per arm |",
        "|---|---|---|---|",
    ]
    for row in power.plan_pairs(
        values, std=spread["pooled_std"], best=spread["best"], constant=spread["constant"]
    ):
        seeds_text = str(row["seeds"]) if row["seeds"] else "more than 1000"
        lines.append(
            f"| {row['pair'][0]} vs {row['pair'][1]} | {row['paper'][0]:.2f} vs "
            f"{row['paper'][1]:.2f} | {row['gap']:.2f} | {seeds_text} |"
        )
    return lines
