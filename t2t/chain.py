"""Chains of training stages: pretrain -> intermediate task(s) -> target task, in one command.

A chain (`t2t chain --gin_file=gin/chains/...`) is a list of `Stage`s, each an ordinary
training run with its own gin files, steps, learning rate and evaluation, in its own model
directory `<MODEL_DIR>/<stage name>`. Stage k+1 starts from stage k's selected checkpoint,
`<stage k dir>@best:METRIC` (the checkpoint with the best saved evaluation of METRIC) or
`@last`, with a fresh optimizer. Every stage is exactly the `t2t train` command `--dry_run`
prints, so a chain can also be launched stage by stage by hand or by a cluster scheduler.

Rerunning the command resumes: finished stages are skipped (their selection is read again
from their checkpoints) and an interrupted stage resumes from its latest checkpoint, so a
killed chain ends exactly as an uninterrupted one. `<MODEL_DIR>/chain.json` records each
stage's directory, start, selection and command, and for a stage this invocation trained, its
steps and wall time, less any time its process was stopped (what `t2t study --plan` estimates a
study's time from).

A chain file binds `t2t.chain.run.stages` to a list of dicts (gin literals):

    t2t.chain.run.stages = [
        {"name": "intermediate", "gin_files": ["experiments/tiny_builtin_finetune.gin"],
         "bindings": ["MIXTURE_OR_TASK = 'builtin_summarize'"],
         "select": "builtin_summarize/rougeLsum"},
        {"name": "target", "gin_files": ["experiments/tiny_builtin_finetune.gin"]},
    ]
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

import gin

from t2t import files, stopwatch

CHAIN_FILE = "chain.json"
_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclasses.dataclass(frozen=True)
class Stage:
    """One training run of a chain.

    Attributes:
      name: the stage's directory name under the chain's model directory.
      gin_files: the run's gin files (as for `t2t train --gin_file`). Every stage after the
        first (and the first, when the chain has an `init_checkpoint`) starts from a
        checkpoint, so its files must use the INIT_CHECKPOINT macro (include
        `runs/finetune.gin`).
      bindings: gin bindings after the files (as `--gin.NAME=VALUE` without the prefix).
      select: which checkpoint the next stage starts from: "last", or a metric name whose best
        saved evaluation wins (the stage then keeps that checkpoint: the metric is added to its
        `t2t.runs.CheckpointOptions.best_metrics`).
      directory: where the stage trains (default `<chain model_dir>/<name>`); chains sharing a
        stage (a study's pretraining, used by every task) give it one directory, and all but
        the first find it finished.
    """

    name: str
    gin_files: Sequence[str]
    bindings: Sequence[str] = ()
    select: str = "last"
    directory: str | None = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(
                f"A stage name is a directory name (letters, digits, _.-), got {self.name!r}."
            )
        for field in ("gin_files", "bindings"):
            value = getattr(self, field)
            if isinstance(value, str):
                raise TypeError(
                    f"Stage {self.name!r}: {field} must be a list, got the string "
                    f"{value!r}; write [{value!r}]."
                )
            object.__setattr__(self, field, tuple(value))
        if not self.gin_files:
            raise ValueError(f"Stage {self.name!r} names no gin file.")

    def selection(self, directory: str) -> str:
        """The checkpoint spec the next stage starts from (`t2t.trainer.sources.resolve`)."""
        return f"{directory}@{'last' if self.select == 'last' else 'best:' + self.select}"


def stages_from(specs: Sequence[Stage | Mapping[str, Any]]) -> list[Stage]:
    """Stages from gin's dict literals (or Stage objects), checked for unique names."""
    stages = []
    for spec in specs:
        if isinstance(spec, Stage):
            stages.append(spec)
            continue
        unknown = sorted(set(spec) - {f.name for f in dataclasses.fields(Stage)})
        if unknown:
            raise ValueError(
                f"Stage {spec.get('name', spec)!r} has unknown keys {unknown}; a "
                "stage has name, gin_files, bindings, select, directory."
            )
        stages.append(Stage(**spec))
    names = [s.name for s in stages]
    if not stages or len(set(names)) != len(names):
        raise ValueError(f"A chain needs one or more stages with distinct names, got {names}.")
    return stages


@gin.configurable(module="t2t.chain")
def run(
    model_dir: str = gin.REQUIRED,
    stages: Sequence[Stage | Mapping[str, Any]] = gin.REQUIRED,
    *,
    init_checkpoint: str | None = None,
    bindings: Sequence[str] = (),
    dry_run: bool = False,
    search_paths: Sequence[str] = (),
) -> dict[str, Any]:
    """Runs (or, with `dry_run`, prints) the stages in order; see the module docstring.

    Args:
      model_dir: the chain's directory; stage s trains in `<model_dir>/<s.name>`.
      stages: the stages (dicts with the `Stage` fields, or `Stage`s).
      init_checkpoint: what the first stage starts from (a HF directory or a `resolve` spec);
        None: the first stage's own configuration decides (random init for pretraining).
      bindings: gin bindings added to every stage after its own; one written `STAGE: BINDING`
        goes to that stage only.
      dry_run: print each stage's `t2t train` command and train nothing.
      search_paths: extra directories for the stages' gin files.

    Returns:
      {"stages": [per-stage record: name, model_dir, init_checkpoint, selection,
      selected_step, command, task, train_steps, skipped, and for a stage trained here its
      trained_steps, seconds (wall seconds less the time the process was stopped:
      `t2t.stopwatch`) and stopped_seconds]}, also written to `<model_dir>/chain.json`.
    """
    from t2t import runs

    plan = validate(
        model_dir,
        stages,
        init_checkpoint=init_checkpoint,
        bindings=bindings,
        search_paths=search_paths,
    )
    records: list[dict[str, Any]] = []
    for stage, stage_bindings, record in plan:
        if dry_run:
            print(record["command"], flush=True)
            records.append(record)
            continue
        runs.configure(stage.gin_files, stage_bindings, search_paths)
        _run_stage(stage, record)
        records.append(record)
        _write_record(model_dir, records)
    return {"stages": records}


def _run_stage(stage: Stage, record: dict[str, Any]) -> None:
    """Trains one configured stage unless its directory is finished; fills in `record`."""
    from t2t import runs
    from t2t.trainer import sources

    directory = record["model_dir"]
    record["skipped"] = _finished(directory)
    if record["skipped"]:
        print(f"chain: stage {stage.name!r} is finished in {directory}; skipped", flush=True)
    else:
        previous = record["init_checkpoint"]
        print(
            f"chain: stage {stage.name!r} -> {directory}"
            + (f" (from {previous})" if previous else ""),
            flush=True,
        )
        start_step = step_in(directory)
        with stopwatch.Stopwatch() as watch:
            runs.train()
        # What a plan reads: the time the stage ran, not the time its process was stopped.
        record["seconds"] = round(watch.elapsed() - watch.stopped(), 1)
        record["stopped_seconds"] = round(watch.stopped(), 1)
        record["trained_steps"] = step_in(directory) - start_step
    record["selected_step"] = sources.resolve(record["selection"])[1] or _latest(directory)


def validate(
    model_dir: str,
    stages: Sequence[Stage | Mapping[str, Any]],
    *,
    init_checkpoint: str | None = None,
    bindings: Sequence[str] = (),
    search_paths: Sequence[str] = (),
) -> list[tuple[Stage, list[str], dict[str, Any]]]:
    """Every stage of a chain checked before any of them trains: its gin files parse with its
    bindings (unknown parameters and unused macros refused with suggestions), the task and eval
    tasks it names are registered, and the chain's first checkpoint exists; later stages start
    from checkpoints the earlier stages make.

    Returns:
      Per stage: the `Stage`, its gin bindings, and its record (name, model_dir,
      init_checkpoint, selection, command, task, train_steps).

    Raises:
      UserError: naming the stage and its files, with what is wrong and how to fix it.
    """
    from t2t import runs, terminal
    from t2t.errors import UserError

    chain = stages_from(stages)
    per_stage = _split_bindings(bindings, [s.name for s in chain])
    _check_source(init_checkpoint)
    plan = []
    previous = init_checkpoint
    for stage in chain:
        directory = stage.directory or files.join(model_dir, stage.name)
        try:
            stage_bindings = _stage_bindings(
                stage, directory, previous, per_stage[stage.name], search_paths
            )
            runs.configure(stage.gin_files, stage_bindings, search_paths)
            task = _check_tasks()
        except Exception as error:  # noqa: BLE001 (the user's mistakes get the stage named)
            if not terminal.is_user_error(error):
                raise
            raise UserError(
                f"Chain stage {stage.name!r} ({', '.join(stage.gin_files)}), checked before "
                f"any stage trains: {terminal.error_message(error)}"
            ) from None
        record = {
            "name": stage.name,
            "model_dir": directory,
            "init_checkpoint": previous,
            "selection": stage.selection(directory),
            "command": command_line(stage.gin_files, stage_bindings),
            "task": task,
            "train_steps": _macro_value(
                gin.get_bindings("t2t.runs.train", resolve_references=False).get("train_steps")
            ),
        }
        plan.append((stage, stage_bindings, record))
        previous = record["selection"]
    return plan


def _macro_value(value: Any) -> Any:
    """A gin macro reference's value (macros of macros followed); anything else as it is."""
    while (
        isinstance(value, gin.config.ConfigurableReference) and value.configurable.name == "macro"
    ):
        value = value.scoped_configurable_fn()
    return value


def _check_source(spec: str | None) -> None:
    """The chain's first checkpoint (a directory, maybe with "@STEP" or "@best:METRIC") exists."""
    from t2t.errors import UserError

    if spec is None:
        return
    path = str(spec).split("@")[0]
    if not files.exists(path):
        raise UserError(
            f"The chain's INIT_CHECKPOINT {spec!r} does not exist: give a HF T5 directory or a "
            "t2t model directory (optionally DIR@STEP, DIR@best:METRIC or DIR@last)."
        )


def _check_tasks() -> str:
    """The task and eval tasks the configured run names are registered; returns the task."""
    from t2t import runs
    from t2t.data import registry
    from t2t.errors import UserError

    # References unresolved: a stage's MODEL_CONFIG may read a checkpoint an earlier stage
    # has yet to write; only the macros naming tasks are resolved.
    data = gin.get_bindings("t2t.runs.DataOptions", resolve_references=False)
    evaluation = gin.get_bindings("t2t.runs.EvalOptions", resolve_references=False)
    task = _macro_value(data.get("mixture_or_task"))
    if not isinstance(task, str):
        raise UserError(
            "The stage's files bind no task: set MIXTURE_OR_TASK "
            "(t2t.runs.DataOptions.mixture_or_task)."
        )
    names = [task, *(_macro_value(evaluation.get("tasks")) or ())]
    runs.import_task_modules((), names)
    for name in names:
        registry.get_task_or_mixture(name)  # raises with the nearest registered names
    return task


def _split_bindings(bindings: Sequence[str], names: Sequence[str]) -> dict[str, list[str]]:
    """Each stage's share of the chain's bindings: `STAGE: BINDING` goes to that stage only,
    anything else to every stage."""
    result: dict[str, list[str]] = {name: [] for name in names}
    for binding in bindings:
        prefix, _, rest = binding.partition(":")
        if rest and prefix.strip() in result and "=" not in prefix:
            result[prefix.strip()].append(rest.strip())
        else:
            for name in names:
                result[name].append(binding)
    return result


def _stage_bindings(
    stage: Stage,
    directory: str,
    previous: str | None,
    common: Sequence[str],
    search_paths: Sequence[str],
) -> list[str]:
    """The stage's bindings: its directory and start, its own, the chain's, and the selection
    metric added to what its files keep as best checkpoints."""
    from t2t import runs

    result = [f"MODEL_DIR = {directory!r}"]
    if previous is not None:
        result.append(f"INIT_CHECKPOINT = {previous!r}")
    result += [*stage.bindings, *common]
    if stage.select != "last":
        runs.configure(stage.gin_files, result, search_paths, finalize=False)
        bound = dict(
            gin.get_bindings("t2t.runs.CheckpointOptions", resolve_references=False).get(
                "best_metrics"
            )
            or {}
        )
        if stage.select not in bound:
            from t2t.evaluation import higher_is_better

            bound[stage.select] = "max" if higher_is_better(stage.select) else "min"
            result.append(f"t2t.runs.CheckpointOptions.best_metrics = {bound!r}")
    return result


def _finished(directory: str) -> bool:
    """Whether a stage's directory already holds its last step (or stopped early)."""
    from t2t.checkpoints.manager import CheckpointManager

    if not files.isdir(files.join(directory, "checkpoints")):
        return False
    train_steps = gin.get_bindings("t2t.runs.train").get("train_steps")
    manager = CheckpointManager(directory, read_only=True)
    try:
        latest = manager.latest_step()
        if latest is None:
            return False
        metadata = manager.read_metadata(latest)
    finally:
        manager.close()
    return latest >= train_steps or metadata.get("stopped_early") is not None


def _latest(directory: str) -> int | None:
    from t2t.checkpoints.manager import CheckpointManager

    manager = CheckpointManager(directory, read_only=True)
    try:
        return manager.latest_step()
    finally:
        manager.close()


def step_in(directory: str) -> int:
    """The step of the stage directory's latest checkpoint; 0 before its first."""
    if not files.isdir(files.join(directory, "checkpoints")):
        return 0
    return _latest(directory) or 0


def command_line(gin_files: Sequence[str], bindings: Sequence[str]) -> str:
    """The `t2t train` command of a run (shell-quoted)."""
    parts = ["t2t", "train", *[f"--gin_file={f}" for f in gin_files]]
    for binding in bindings:
        if binding.startswith("import "):  # a gin import line: the module to import first
            parts.append(f"--import={binding[len('import ') :].strip()}")
            continue
        if binding.startswith("include "):  # a gin include line: one more gin file
            path = binding[len("include ") :].strip().strip("'\"")
            parts.append(f"--gin_file={path}")
            continue
        name, value = (part.strip() for part in binding.split("=", 1))
        parts.append(f"--gin.{name}={value}")
    return " ".join(_quote(p) for p in parts)


def _quote(argument: str) -> str:
    """Shell quoting that keeps gin's inner quotes readable: --gin.MODEL_DIR="'runs/x'"."""
    if re.fullmatch(r"[\w@%+=:,./-]+", argument):
        return argument
    if not re.search(r'["$`\\!]', argument):
        return f'"{argument}"'
    return shlex.quote(argument)


def _write_record(model_dir: str, records: list[dict[str, Any]]) -> None:
    import jax

    if jax.process_index() != 0:
        return
    files.makedirs(model_dir)
    files.write_text(files.join(model_dir, CHAIN_FILE), json.dumps({"stages": records}, indent=2))
