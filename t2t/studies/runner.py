"""`t2t study`: a declared grid of ordinary training runs, resumable, then aggregated.

A study is arms x tasks x seeds (x pretrainings). An arm is a chain of stages (`t2t.chain.Stage`
fields as dicts; a one-stage arm is a plain fine-tuning run). The last stage of every arm trains and evaluates
the task: the study binds its MIXTURE_OR_TASK and EVAL_TASKS, and the seed of every stage. A
stage whose bindings mention `{task}` is made per task (with `"share": "seeds"`, once per task
for all its restarts: leave-one-out pretraining); any other (a pretraining stage) is shared by
the arm's tasks for a seed and trained once. Placeholders `{task}` and `{seed}` are
filled in every binding.

Run r of the grid trains in `<study_dir>/<arm>/seed<seed>/<task>/<stage>` (shared stages in
`<study_dir>/<arm>/seed<seed>/<stage>`), as ordinary model directories; when its last stage
ends, its score (the best evaluation's task score: the mean of the task's metrics) goes to
`score.json` beside them. Rerunning the study skips scored runs and resumes the others where they
stopped. A study that outlives its machine continues on another from its `study.json` alone
(copied into the study directory there): the runs it reports are skipped, except those of a
unit of replication (a pretraining) it reports in part, which train again whole, so that every
unit's runs start from one checkpoint. With `reuse`, a run another study trained with the same
commands, code and environment is taken instead of trained (`t2t.studies.reuse`).
`print_commands` lists every stage's `t2t train` command instead (shared ones once), for a
cluster scheduler; `aggregate_only` reads whatever runs have scores. The aggregation
(`t2t.studies.aggregate`) and its report (`t2t.studies.report`) go to `study.json`, `study.md`
and `study.png` in the study directory.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import gin

from t2t import chain, files, stopwatch
from t2t.errors import UserError
from t2t.studies import aggregate, baselines, report
from t2t.studies import claims as claims_lib
from t2t.studies import plan as plan_lib
from t2t.studies import reuse as reuse_lib
from t2t.studies.reuse import SCORE_FILE

BASELINES_FILE = "baselines.json"
# Evaluation keys the trainer's teacher-forced pass adds; the rest are the task's metrics.
_TEACHER_FORCED = ("loss", "z_loss", "token_accuracy", "target_tokens")


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "arm"


class Cell(NamedTuple):
    """One run of a study's grid: an arm's chain for a task and a restart; `pretraining` is
    None unless the study replicates its pretraining (`run(pretrainings=...)`)."""

    arm: Mapping[str, Any]
    task: str
    seed: int
    pretraining: int | None = None


# The seed of restart s of pretraining p: distinct for every run of a replicated study.
PRETRAINING_SEED_STRIDE = 1000


def run_seed(seed: int, pretraining: int | None) -> int:
    """The seed bound to the last stage of restart `seed` of `pretraining`."""
    return seed if pretraining is None else PRETRAINING_SEED_STRIDE * pretraining + seed


def unit(
    arm: Mapping[str, Any], seed: int, pretraining: int | None, common: Sequence[str] = ()
) -> str:
    """The unit of replication a run belongs to: its pretraining when the arm has a stage
    shared across restarts (`"share": "seeds"`, or `"all"`), else the run itself. One
    exception: a `common` stage (every arm of the study has it) trained once for the whole
    study, without replicated pretrainings (`pretraining` None), is one checkpoint that every
    comparison holds fixed, so its restarts are the units (the comparison is of that
    checkpoint's fine-tunings); replicated, its pretrainings are the units, as elsewhere."""
    own = any(
        stage.get("share") == "seeds"
        or (
            stage.get("share") == "all"
            and (stage.get("name") not in common or pretraining is not None)
        )
        for stage in arm["stages"][:-1]
    )
    if own:
        return f"pretraining{pretraining or 0}"
    return f"seed{seed}" if pretraining is None else f"pretraining{pretraining}/seed{seed}"


def common_stages(arms: Sequence[Mapping[str, Any]]) -> list[str]:
    """Names of the `"share": "all"` stages every arm has: one model all arms start from."""
    names = [{s.get("name") for s in arm["stages"][:-1] if s.get("share") == "all"} for arm in arms]
    return sorted(set.intersection(*names)) if names else []


STAGE_KEYS = ("name", "gin_files", "bindings", "select", "share")
SHARES = (None, "study", "seeds", "all")
# The last stage of an arm may instead evaluate the previous stage's model on each task
# (multi-task training without fine-tuning): {"name": "eval", "evaluate": True}.
EVALUATE_KEYS = ("name", "evaluate")


def _flatten(items) -> list[str]:
    """Bindings given as strings or nested lists of them (a profile's list macro plus an
    arm's own)."""
    out = []
    for item in items:
        out += _flatten(item) if isinstance(item, (list, tuple)) else [item]
    return out


def expand(
    arm: Mapping[str, Any],
    task: str,
    seed: int,
    study_dir: str,
    common: Sequence[str],
    lengths: Mapping[str, Any] | None,
    corpus: str = "builtin",
    pretraining: int | None = None,
) -> list[chain.Stage]:
    """The arm's stages for one (task, seed): placeholders filled, directories set, the task
    and seed bound; with `pretraining` p, restart `seed` of the p-th pretraining (module
    docstring).

    A stage is per task when it is the last or mentions `{task}` (then `"share": "seeds"` trains
    it once per task and pretraining, shared by the task's restarts); otherwise it is trained once
    per seed for the arm, or, with `"share": "study"`, once per seed for every arm that has a
    stage of that name (a common pretraining). `"share": "seeds"` trains it once for the arm
    and `"share": "all"` once for the study, both with seed 0, so that restarts vary only what
    follows (the fine-tuning restarts of one pre-trained model, as the paper's tables and
    STILTs' restarts are).
    """
    specs, evaluates = _training_stages(arm)
    replica = "" if pretraining is None else f"pretraining{pretraining}"
    restart = seed  # the directories name the restart; the bound seed is the run's own
    seed = run_seed(restart, pretraining)
    where = _Places(study_dir, _slug(arm["name"]), replica, restart, task)
    stages = []
    for index, spec in enumerate(specs):
        last = index == len(specs) - 1 and not evaluates

        def fill(text: str, seed: int = seed) -> str:
            return (
                text.replace("{task}", task)
                .replace("{seed}", str(seed))
                .replace("{corpus}", corpus)
            )

        own = _flatten(spec.get("bindings", ()))
        per_task = last or any("{task}" in b for b in own)
        share = None if last else spec.get("share")
        if share not in SHARES:
            raise ValueError(
                f"Arm {arm['name']!r}, stage {spec['name']!r}: share {share!r}; "
                f"expected one of {SHARES[1:]} or none."
            )
        if per_task and share not in (None, "seeds"):
            raise ValueError(
                f"Arm {arm['name']!r}, stage {spec['name']!r} is made per task (it mentions "
                f"{{task}}) with share {share!r}: a stage per task can be shared only by its "
                f'restarts ("share": "seeds") or not at all.'
            )
        stage_seed = (pretraining or 0) if share in ("seeds", "all") else seed
        bindings = [fill(b, stage_seed) for b in [*own, *_flatten(common)]]
        bindings.append(f"t2t.runs.train.seed = {stage_seed}")
        if last:
            bindings += _target_bindings(task, lengths)
        stages.append(
            chain.Stage(
                name=spec["name"],
                gin_files=[fill(f) for f in _flatten(spec["gin_files"])],
                bindings=bindings,
                select=spec.get("select", "last"),
                directory=where.stage(spec["name"], share, per_task),
            )
        )
    return stages


def _training_stages(arm: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]], bool]:
    """The arm's training stages (their keys checked), and whether an evaluate stage follows."""
    specs = list(arm["stages"])
    evaluates = bool(specs and specs[-1].get("evaluate"))
    if evaluates:
        unknown = sorted(set(specs[-1]) - set(EVALUATE_KEYS))
        if unknown or len(specs) < 2:
            raise ValueError(
                f"Arm {arm['name']!r}: an evaluate stage has only {EVALUATE_KEYS} "
                "and follows a training stage."
            )
        specs = specs[:-1]
    for spec in specs:
        unknown = sorted(set(spec) - set(STAGE_KEYS))
        if unknown:
            raise ValueError(
                f"Arm {arm['name']!r}, stage {spec.get('name')!r}: unknown keys "
                f"{unknown}; a study stage has {STAGE_KEYS}."
            )
    return specs, evaluates


def _target_bindings(task: str, lengths: Mapping[str, Any] | None) -> list[str]:
    """The last training stage's: the task trained and evaluated, no best-checkpoint copies."""
    bindings = [
        f"MIXTURE_OR_TASK = {task!r}",
        f"EVAL_TASKS = [{task!r}]",
        "t2t.runs.CheckpointOptions.best_metrics = {}",
    ]
    if lengths and task in lengths:
        bindings.append(f"TASK_FEATURE_LENGTHS = {dict(lengths[task])!r}")
    return bindings


class _Places(NamedTuple):
    """Where one run's stages train, by how they are shared (`expand`)."""

    study_dir: str
    arm: str
    replica: str
    restart: int
    task: str

    def stage(self, name: str, share: str | None, per_task: bool = False) -> str:
        """`share`: None (the arm's restart), "seeds", "study", "all"; a stage `per_task`
        is the run's own, or with "seeds" its task's, shared by the task's restarts."""
        restart = f"seed{self.restart}"
        if per_task:
            own = [] if share == "seeds" else [restart]
            return files.join(self.study_dir, self.arm, self.replica, *own, self.task, name)
        if share == "study":
            return files.join(self.study_dir, "shared", self.replica, restart, name)
        if share == "seeds":
            return files.join(self.study_dir, self.arm, self.replica, name)
        if share == "all":
            return files.join(self.study_dir, "shared", self.replica, name)
        return files.join(self.study_dir, self.arm, self.replica, restart, name)


def run_score(model_dir: str, task: str) -> float | None:
    """The best evaluation of a finished stage: max over evaluations of the mean of the task's
    metrics (NaN counts as 0); None when it has none."""
    from t2t.trainer import reporting

    path = files.join(model_dir, "eval")
    if not files.isdir(path):
        return None
    scalars = reporting.read_scalars(path)
    names = [
        tag
        for tag in scalars
        if tag.startswith(f"{task}/") and tag.split("/", 1)[1] not in _TEACHER_FORCED
    ]
    if not names:
        return None
    by_step: dict[int, list[float]] = {}
    for tag in names:
        for step, value in scalars[tag]:
            by_step.setdefault(int(step), []).append(0.0 if math.isnan(value) else float(value))
    complete = [sum(v) / len(v) for v in by_step.values() if len(v) == len(names)]
    return max(complete) if complete else None


def _check_arms(arms: Any) -> None:
    """Raises UserError unless `arms` is a non-empty list of {"name": str, "stages": [...]}
    mappings with distinct names, naming the arm and what is wrong."""
    if not isinstance(arms, Sequence) or isinstance(arms, str) or not arms:
        raise UserError(
            f"t2t.studies.run.arms must be a non-empty list of arms, got {arms!r}: e.g. "
            '[{"name": "baseline", "stages": [...]}].'
        )
    seen = set()
    for index, arm in enumerate(arms):
        where = f"Arm {index} of t2t.studies.run.arms"
        if not isinstance(arm, Mapping):
            raise UserError(f'{where} must be a dict with "name" and "stages", got {arm!r}.')
        missing = [key for key in ("name", "stages") if key not in arm]
        if missing:
            raise UserError(
                f'{where} lacks {missing} (it has {sorted(arm)}): every arm needs a "name" '
                'and its "stages", e.g. {"name": "baseline", "stages": [{"name": "pretrain", '
                '"gin_files": [...]}]}.'
            )
        if not isinstance(arm["name"], str) or not arm["name"]:
            raise UserError(f"{where}: its name must be a non-empty string, got {arm['name']!r}.")
        if arm["name"] in seen:
            raise UserError(f"{where}: the name {arm['name']!r} is already another arm's.")
        seen.add(arm["name"])
        stages = arm["stages"]
        if isinstance(stages, str) or not isinstance(stages, Sequence) or not stages:
            raise UserError(
                f"Arm {arm['name']!r}: its stages must be a non-empty list of stage dicts, got "
                f"{stages!r}."
            )
        for stage in stages:
            if not isinstance(stage, Mapping) or "name" not in stage:
                raise UserError(
                    f'Arm {arm["name"]!r}: every stage is a dict with a "name" (and '
                    f'"gin_files"), got {stage!r}.'
                )


def _check_tasks_and_seeds(tasks: Any, seeds: Any) -> None:
    """Raises UserError unless the study has tasks (names) and seeds (integers) to run: a grid
    with none of either runs nothing and could only write an empty report (over a study's)."""
    if isinstance(tasks, str) or not isinstance(tasks, Sequence) or not tasks:
        raise UserError(
            f"t2t.studies.run.tasks must be a non-empty list of task names, got {tasks!r}: e.g. "
            '["builtin_order", "builtin_package"].'
        )
    if not all(isinstance(t, str) and t for t in tasks):
        raise UserError(f"t2t.studies.run.tasks must hold task names (strings), got {tasks!r}.")
    if isinstance(seeds, str) or not isinstance(seeds, Sequence) or not seeds:
        raise UserError(
            f"t2t.studies.run.seeds must be a non-empty list of integers, got {seeds!r}."
        )
    if not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise UserError(f"t2t.studies.run.seeds must hold integers, got {seeds!r}.")


@gin.configurable(module="t2t.studies")
def run(
    study_dir: str = gin.REQUIRED,
    arms: Sequence[Mapping[str, Any]] = gin.REQUIRED,
    tasks: Sequence[str] = gin.REQUIRED,
    seeds: Sequence[int] = (0, 1, 2),
    *,
    pretrainings: Sequence[int] | None = None,
    claims: Sequence[str] | None = None,
    name: str = "study",
    corpus: str = "builtin",
    baseline_arm: str | None = None,
    bindings: Sequence[str] = (),
    task_feature_lengths: Mapping[str, Mapping[str, int]] | None = None,
    paper: Mapping[str, Any] | None = None,
    print_commands: bool = False,
    aggregate_only: bool = False,
    plan: bool = False,
    plan_from: str | None = None,
    plan_arms: Sequence[str] = (),
    plan_timing: Sequence[str] = (),
    search_paths: Sequence[str] = (),
    only_arms: Sequence[str] = (),
    reuse: Sequence[str] = (),
) -> dict[str, Any] | None:
    """Runs the grid (or prints it), then aggregates; see the module docstring.

    Args:
      study_dir: where every run and the results go.
      arms: [{"name": ..., "stages": [stage dicts]}, ...]; the first is the baseline unless
        `baseline_arm` names another.
      tasks: the tasks each arm is trained and evaluated on.
      seeds: the restarts (of each pretraining, with `pretrainings`).
      pretrainings: the seeds of an arm's shared stages, each trained once and fine-tuned
        with every seed (module docstring); None: one, with seed 0.
      claims: what the paper claims of these arms, "A > B" each (`t2t.studies.claims`):
        the report counts them reproduced, contradicted or undecided.
      name: the study's title in its report.
      corpus: fills `{corpus}` in bindings ("builtin" or "c4": `{corpus}_span_corruption`).
      bindings: gin bindings for every stage of every run (placeholders allowed).
      task_feature_lengths: per task, the last stage's TASK_FEATURE_LENGTHS.
      paper: {"table": "10", "column": "GLUE", "rows": {arm: paper row}}: the paper's numbers
        to order the arms against (`t2t.studies.paper`).
      print_commands: print the runs' commands, train nothing, return None.
      aggregate_only: train nothing; aggregate the runs that have scores.
      plan: train nothing; print how many runs the grid has and the wall time of what is left
        to train, from the measured stages under `plan_timing` (`t2t.studies.plan`); return
        None.
      plan_from: as `plan`, and from the per-seed spread of the finished study whose
        study.json this is, the seeds each pair of arms the paper scores needs
        (`t2t.studies.power`).
      plan_arms: the arms of that finished study whose spread counts (default: all).
      plan_timing: directories of finished runs whose timed stages give the seconds per step
        (default: `study_dir`, and the study_dir of `plan_from`'s study).
      search_paths: extra gin search paths.
      only_arms: run and aggregate only these arms (names), in the file's order; the baseline
        arm is the first of them unless `baseline_arm` names another.
      reuse: study directories whose finished runs are taken where they repeat one of this
        study's, instead of training it (`t2t.studies.reuse`: same commands, code and
        environment).

    Returns:
      The aggregation written to study.json.
    """
    _check_arms(arms)
    _check_tasks_and_seeds(tasks, seeds)
    claimed = None if claims is None else claims_lib.parse(claims, [a["name"] for a in arms])
    arms = _chosen_arms(arms, only_arms)
    arm_names = [a["name"] for a in arms]
    replicas = _check_pretrainings(pretrainings)
    order = itertools.product(arms, replicas, map(int, seeds), tasks)
    grid = [Cell(arm, task, seed, replica) for arm, replica, seed, task in order]
    if print_commands:
        _print_commands(grid, study_dir, bindings, task_feature_lengths, corpus, search_paths)
        return None
    if plan or plan_from:
        print(
            _plan(
                grid,
                study_dir,
                bindings,
                task_feature_lengths,
                corpus,
                search_paths,
                name=name,
                paper=paper,
                plan_from=plan_from,
                plan_arms=plan_arms,
                plan_timing=plan_timing,
                claims=[c["claim"] for c in claimed or []],
                reuse=reuse,
            )
        )
        return None
    if not aggregate_only:
        _train(grid, study_dir, bindings, task_feature_lengths, corpus, search_paths, reuse)
    scores, units = _scores_and_units(
        grid, study_dir, aggregate_only, bindings, task_feature_lengths, corpus
    )
    result = aggregate.aggregate(
        scores,
        baselines=_baselines(study_dir, tasks),
        baseline_arm=baseline_arm or arm_names[0],
        arms=arm_names,
        tasks=list(tasks),
        units=units,
    )
    result["name"] = name
    result["study_dir"] = study_dir
    result["seeds"] = [int(s) for s in seeds]
    result["pretrainings"] = None if pretrainings is None else [int(p) for p in replicas]
    result["ordering"] = aggregate.ordering(result)
    if paper:
        result["paper"] = report.paper_comparison(result, paper)
    if claimed is not None:
        result["claims"] = _claims_of(claimed, arm_names, result)
    report.write(study_dir, result)
    return result


def _claims_of(claimed: list[dict], arm_names: list[str], result: dict) -> list[dict]:
    """The claims between arms that were run (`only_arms`), each tested on `result`."""
    chosen = [c for c in claimed if {c["better"], c["worse"]} <= set(arm_names)]
    return claims_lib.evaluate(chosen, result)


def split_arm_names(text: str, names: Sequence[str]) -> list[str]:
    """`--arms`' comma-separated names, a name that holds commas kept whole: at each place the
    longest run of pieces that is an arm's name, else the piece alone (then named unknown).

    Example: split_arm_names("full, 32 examples (1,000 repeats)", ["full", "32 examples (1,000
    repeats)"]) == ["full", "32 examples (1,000 repeats)"]
    """
    pieces, chosen, start = text.split(","), [], 0
    while start < len(pieces):
        for end in range(len(pieces), start, -1):
            candidate = ",".join(pieces[start:end]).strip()
            if candidate in names:
                break
        else:
            end, candidate = start + 1, pieces[start].strip()
        if candidate:
            chosen.append(candidate)
        start = end
    return chosen


def _chosen_arms(
    arms: Sequence[Mapping[str, Any]], only_arms: Sequence[str]
) -> list[Mapping[str, Any]]:
    """The arms `only_arms` names (all when empty), in the file's order, checked distinct."""
    if only_arms:
        unknown = sorted(set(only_arms) - {a["name"] for a in arms})
        if unknown:
            raise ValueError(f"No arms {unknown} in the study; it has {[a['name'] for a in arms]}.")
        arms = [a for a in arms if a["name"] in set(only_arms)]
    names = [a["name"] for a in arms]
    if len(set(names)) != len(names) or not names:
        raise ValueError(f"A study needs arms with distinct names, got {names}.")
    return list(arms)


def _scores_and_units(grid, study_dir, aggregate_only, bindings, lengths, corpus):
    """(arm, task, run) -> score of every cell (None where it has none), and arm -> run ->
    its unit of replication (`unit`)."""
    scores, units, common = {}, {}, common_stages([cell.arm for cell in grid])
    reported = _reported_scores(study_dir)
    for cell in grid:
        run_id = restart_id(cell.seed, cell.pretraining)
        score = _read_score(study_dir, cell)
        if score is None and aggregate_only:  # runs launched one by one (print_commands)
            score = _score_of_commands(study_dir, cell, bindings, lengths, corpus)
        if score is None:  # a report's (a committed study, or one begun on another machine)
            score = reported.get(_report_key(cell))
        scores[(cell.arm["name"], cell.task, run_id)] = score
        units.setdefault(cell.arm["name"], {})[run_id] = unit(
            cell.arm, cell.seed, cell.pretraining, common
        )
    return scores, units


def _reported_scores(study_dir: str) -> dict[tuple[str, str, str], float]:
    """(arm, task, run) -> score of the study.json already in `study_dir`: a study committed
    with its report but not its runs is aggregated again (new analyses, claims) from it. Only
    runs without a score of their own (no run directory) take these."""
    path = files.join(study_dir, "study.json")
    if not files.exists(path):
        return {}
    reported = json.loads(files.read_text(path))
    scores = {}
    for arm, entry in reported.get("arms", {}).items():
        for task, stats in entry.get("tasks", {}).items():
            by_run = stats.get("by_seed")
            if by_run is None and len(entry["tasks"]) == 1:  # reports before by_seed: the
                by_run = entry.get("suite_by_seed", {})  # suite of one task is its score
            for run, score in (by_run or {}).items():
                scores[(arm, task, run)] = score
    return scores


def _report_key(cell: Cell) -> tuple[str, str, str]:
    return (cell.arm["name"], cell.task, str(restart_id(cell.seed, cell.pretraining)))


def _unscored(grid: Sequence[Cell], study_dir: str) -> tuple[list[Cell], list[tuple[Cell, float]]]:
    """The cells left to train, and the scores the study directory's study.json reports of the
    others that have no score.json: those are not trained again, unless their unit (`unit`) has
    a cell with neither (a pretraining reported in part, its machine stopped half-way), which
    trains again for all its runs."""
    reported = _reported_scores(study_dir)
    common = common_stages([cell.arm for cell in grid])
    local = [_read_score(study_dir, cell) is not None for cell in grid]
    theirs = [reported.get(_report_key(cell)) for cell in grid]
    units = [
        (cell.arm["name"], unit(cell.arm, cell.seed, cell.pretraining, common)) for cell in grid
    ]
    broken = {u for u, mine, score in zip(units, local, theirs) if not mine and score is None}
    todo, carried = [], []
    for cell, u, mine, score in zip(grid, units, local, theirs, strict=True):
        if mine:
            continue
        if score is None or u in broken:
            todo.append(cell)
        else:
            carried.append((cell, score))
    return todo, carried


def _carry(carried: Sequence[tuple[Cell, float]], study_dir: str) -> None:
    """Writes each reported score as its run's score.json (marked as carried): a later
    report of part of the grid (`only_arms`, some pretrainings) may replace study.json."""
    for cell, score in carried:
        record = _score_record(cell, score, model_dir=None)
        record["carried_from"] = files.join(study_dir, "study.json")
        files.makedirs(_run_dir(study_dir, cell))
        files.write_text(files.join(_run_dir(study_dir, cell), SCORE_FILE), json.dumps(record))


def _score_record(cell: Cell, score: float | None, model_dir: str | None) -> dict[str, Any]:
    return {
        "arm": cell.arm["name"],
        "task": cell.task,
        "seed": cell.seed,
        "pretraining": cell.pretraining,
        "run_seed": run_seed(cell.seed, cell.pretraining),
        "score": score,
        "model_dir": model_dir,
    }


def restart_id(seed: int, pretraining: int | None) -> int | str:
    """A run's name in the aggregation: its seed, or "pretraining<p>/seed<s>"."""
    return seed if pretraining is None else f"pretraining{pretraining}/seed{seed}"


def _check_pretrainings(pretrainings: Any) -> list[int | None]:
    """The pretraining replicas of the grid ([None]: not replicated); raises UserError unless
    `pretrainings` is None or a non-empty list of distinct integers."""
    if pretrainings is None:
        return [None]
    if (
        isinstance(pretrainings, str)
        or not isinstance(pretrainings, Sequence)
        or not pretrainings
        or not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in pretrainings)
        or len(set(pretrainings)) != len(pretrainings)
    ):
        raise UserError(
            "t2t.studies.run.pretrainings must be a non-empty list of distinct integers >= 0 "
            f"(the pretraining seeds), got {pretrainings!r}."
        )
    return [int(p) for p in pretrainings]


def _expand(cell: Cell, study_dir, common, lengths, corpus) -> list[chain.Stage]:
    return expand(
        cell.arm, cell.task, cell.seed, study_dir, common, lengths, corpus, cell.pretraining
    )


def _score_of_commands(study_dir, cell, bindings, lengths, corpus) -> float | None:
    """The score of a run whose printed commands were run by hand (no score.json)."""
    if _evaluates(cell.arm):
        return _eval_file_score(files.join(_run_dir(study_dir, cell), "eval.json"), cell.task)
    last = _expand(cell, study_dir, bindings, lengths, corpus)[-1]
    return run_score(last.directory, cell.task)


def _eval_file_score(path: str, task: str) -> float | None:
    """The task score of an `evaluate` stage's eval.json (None without one)."""
    if not files.exists(path):
        return None
    (metrics,) = json.loads(files.read_text(path))["steps"].values()
    values = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{task}/")}
    return baselines.task_score(values) if values else None


def _run_dir(study_dir: str, cell: Cell) -> str:
    replica = "" if cell.pretraining is None else f"pretraining{cell.pretraining}"
    return files.join(study_dir, _slug(cell.arm["name"]), replica, f"seed{cell.seed}", cell.task)


def _read_score(study_dir, cell: Cell) -> float | None:
    path = files.join(_run_dir(study_dir, cell), SCORE_FILE)
    if not files.exists(path):
        return None
    return json.loads(files.read_text(path))["score"]


def _train(grid, study_dir, common, lengths, corpus, search_paths, reuse=()) -> None:
    todo, carried = _unscored(grid, study_dir)
    _carry(carried, study_dir)
    todo, found = _reusable(todo, study_dir, common, lengths, corpus, search_paths, reuse)
    for cell, hit in found:
        record = _score_record(cell, hit.score, hit.model_dir)
        record.update(reused_from=hit.run_dir, reused_commit=hit.commit)
        files.makedirs(_run_dir(study_dir, cell))
        files.write_text(files.join(_run_dir(study_dir, cell), SCORE_FILE), json.dumps(record))
    done_before = len(grid) - len(todo)
    _validate(todo, study_dir, common, lengths, corpus, search_paths)
    expanded = [_expand(cell, study_dir, common, lengths, corpus) for cell in todo]
    runs = [_run_dir(study_dir, cell) for cell in todo]
    left, rates = _timing(grid, todo, expanded, study_dir, search_paths)
    with stopwatch.Stopwatch() as watch:
        for index, (cell, stages, directory) in enumerate(zip(todo, expanded, runs, strict=True)):
            arm, task, seed = cell.arm, cell.task, cell.seed
            replica = "" if cell.pretraining is None else f"pretraining {cell.pretraining} / "
            eta = plan_lib.eta([stage for run in left[index:] for stage in run], rates)
            print(
                f"study: run {done_before + index + 1}/{len(grid)}: {arm['name']} / {task} / "
                f"{replica}seed {seed} ({done_before} done before{eta})",
                flush=True,
            )
            chain.run(directory, stages, search_paths=search_paths)
            plan_lib.add_rates(rates, files.join(directory, plan_lib.CHAIN_FILE))
            if _evaluates(arm):
                score = _evaluate(stages[-1].directory, task, directory, lengths)
            else:
                score = run_score(stages[-1].directory, task)
            record = _score_record(cell, score, stages[-1].directory)
            files.write_text(files.join(directory, SCORE_FILE), json.dumps(record, indent=1))
    stopped = watch.stopped()
    print(
        f"study: {len(todo)} runs trained in {(watch.elapsed() - stopped) / 60:.1f} min"
        + (f" (and {stopped / 60:.1f} min stopped)" if stopped else "")
        + f", {done_before} found done",
        flush=True,
    )


def _timing(grid, todo, expanded, study_dir, search_paths):
    """What the ETA before each run comes from (`t2t.studies.plan.eta`): the stages each run
    of `todo` still trains, and the seconds per step of the stages timed in the study's runs so
    far, read from each run's chain.json (not a walk of every checkpoint in a bucket)."""
    keys = [(cell.arm["name"], cell.task) for cell in todo]
    runs = [_run_dir(study_dir, cell) for cell in todo]
    left = plan_lib.stages_by_run(list(zip(keys, runs, expanded, strict=True)), search_paths)
    rates: dict = {}
    for run_dir in dict.fromkeys(_run_dir(study_dir, cell) for cell in grid):
        if files.exists(files.join(run_dir, plan_lib.CHAIN_FILE)):
            plan_lib.add_rates(rates, files.join(run_dir, plan_lib.CHAIN_FILE))
    return left, rates


def _validate(todo, study_dir, common, lengths, corpus, search_paths) -> None:
    """Every (arm, task) chain to run checked before the first run trains (`chain.validate`:
    gin files, bindings, tasks, sources), once per pair: the seeds only change bindings the
    checks accept for one if they accept them for another."""
    seen = set()
    for cell in todo:
        arm, task = cell.arm, cell.task
        if (arm["name"], task) in seen:
            continue
        seen.add((arm["name"], task))
        stages = _expand(cell, study_dir, common, lengths, corpus)
        try:
            chain.validate(_run_dir(study_dir, cell), stages, search_paths=search_paths)
        except UserError as error:
            raise UserError(f"Study arm {arm['name']!r}, task {task!r}: {error}") from None


def _evaluates(arm: Mapping[str, Any]) -> bool:
    return bool(arm["stages"][-1].get("evaluate"))


def _evaluate(model_dir: str, task: str, run_dir: str, lengths) -> float | None:
    """Evaluates the latest checkpoint of `model_dir` on `task` into `<run_dir>/eval.json`."""
    from t2t import evaluation

    results = evaluation.evaluate_model_dir(
        model_dir,
        [task],
        output_file=files.join(run_dir, "eval.json"),
        task_feature_lengths=dict(lengths[task]) if lengths and task in lengths else None,
        console=None,
    )
    (metrics,) = results["steps"].values()
    values = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith(f"{task}/")}
    return baselines.task_score(values) if values else None


def _eval_command(model_dir: str, task: str, run_dir: str) -> str:
    return (
        f"t2t eval --model_dir={model_dir} --tasks={task} "
        f"--output_file={files.join(run_dir, 'eval.json')}"
    )


def _reusable(todo, study_dir, common, lengths, corpus, search_paths, sources):
    """The cells of `todo` left to train, and those a run under `sources` repeats, with it
    (`t2t.studies.reuse`) and its score computed again from its evaluations; prints how many
    were found, and why others that matched by their commands were not taken."""
    if not sources or not todo:
        return list(todo), []
    wanted = [
        [
            record
            for _, _, record in chain.validate(
                _run_dir(study_dir, cell),
                _expand(cell, study_dir, common, lengths, corpus),
                search_paths=search_paths,
            )
        ]
        for cell in todo
    ]
    hits, refused = reuse_lib.find(wanted, sources)
    left, found = [], []
    for cell, hit in zip(todo, hits, strict=True):
        score = None if hit is None else _reused_score(cell, hit)
        if score is None:  # nothing repeats it, or its evaluations are gone
            left.append(cell)
        else:
            found.append((cell, hit._replace(score=score)))
    print(
        f"study: {len(found)} of {len(todo)} runs left found trained in {', '.join(sources)}"
        " (the same commands, code and environment); reused",
        flush=True,
    )
    for reason, count in sorted(refused.items()):
        print(f"study: {count} with the same commands not reused: {reason}", flush=True)
    return left, found


def _reused_score(cell: Cell, hit: reuse_lib.Found) -> float | None:
    """A reused run's score as this checkout's code computes it, from its evaluations."""
    if _evaluates(cell.arm):
        return _eval_file_score(files.join(hit.run_dir, "eval.json"), cell.task)
    return run_score(hit.model_dir, cell.task)


def _plan(grid, study_dir, common, lengths, corpus, search_paths, reuse=(), **options) -> str:
    """What `t2t study --plan` prints (`t2t.studies.plan`)."""
    left, _ = _reusable(
        _unscored(grid, study_dir)[0], study_dir, common, lengths, corpus, search_paths, reuse
    )
    unscored = [
        (
            (cell.arm["name"], cell.task),
            _run_dir(study_dir, cell),
            _expand(cell, study_dir, common, lengths, corpus),
        )
        for cell in left
    ]
    return plan_lib.describe(grid, unscored, study_dir, search_paths, **options)


def _print_commands(grid, study_dir, common, lengths, corpus, search_paths) -> None:
    seen = set()
    for cell in grid:
        arm, task = cell.arm, cell.task
        stages = _expand(cell, study_dir, common, lengths, corpus)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            chain.run(
                _run_dir(study_dir, cell),
                stages,
                dry_run=True,
                search_paths=search_paths,
            )
        lines = [line for line in buffer.getvalue().splitlines() if line.startswith("t2t train")]
        if _evaluates(arm):
            lines.append(_eval_command(stages[-1].directory, task, _run_dir(study_dir, cell)))
        for line in lines:
            if line not in seen:
                seen.add(line)
                print(line, flush=True)


def _baselines(study_dir: str, tasks: Sequence[str]) -> dict[str, float]:
    """Each task's constant-baseline score, computed once per study directory."""
    path = files.join(study_dir, BASELINES_FILE)
    cached: dict[str, Any] = {}
    if files.exists(path):
        cached = json.loads(files.read_text(path))
    for task in tasks:
        if task not in cached:
            metrics = baselines.constant_baseline(task)
            cached[task] = {"metrics": metrics, "score": baselines.task_score(metrics)}
    files.makedirs(study_dir)
    files.write_text(path, json.dumps(cached, indent=1, sort_keys=True))
    return {task: cached[task]["score"] for task in tasks}
