"""The gin edge: run functions configured from `gin/` files and `--gin.NAME=VALUE` flags.

Library modules carry no gin; the run functions here are thin and call library code:

- `evaluate` (`t2t eval`): seqio evaluation of one, some or all checkpoints of a model
  directory, and the best checkpoint per task (`t2t.evaluation`);
- `seqio_evaluator`: the same evaluation as a factory `factory(model=..., partitioner=...)` the
  trainer calls to evaluate every N steps (`train.evaluators = [@t2t.runs.seqio_evaluator]`);
- `infer` (`t2t infer`): predict or score a file or task, single model or ensemble
  (`t2t.inference`);
- `export` (`t2t export`): a HF-format release directory (`t2t.release`);
- `average` (`t2t average`): the mean of checkpoints (`t2t.checkpoints.averaging`).

Gin names are module-qualified (`t2t.runs.evaluate.tasks = ["glue_cola"]`); the short names
(`evaluate.tasks`) work too when unique. Every argument can also come from the CLI's flags.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Sequence
from typing import Any

import gin

# -- shared helpers ------------------------------------------------------------------------------


def _partitioner(mesh_shape: Sequence[int] | None, sharding_mode: str):
    """None (one device) without a mesh shape, else a Partitioner over (data, model)."""
    if mesh_shape is None:
        return None
    from t2t import partitioning

    partitioning.initialize_distributed()
    return partitioning.make_partitioner(*mesh_shape, mode=sharding_mode)


def _names(tasks: str | Sequence[str] | None, what: str) -> list[str]:
    if tasks is None:
        raise ValueError(f"{what} needs tasks: --tasks=NAME[,NAME] or {what}.tasks = [...] in gin.")
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"{what}: the task list {tasks!r} names no task.")
    return names


def import_task_modules(modules: Sequence[str] = (), names: Sequence[str] = ()) -> None:
    """Imports registration modules, then every one of `t2t.data.tasks` if a name is missing.

    Args:
      modules: modules to import first, e.g. ["t2t.data.tasks.glue"].
      names: the task or mixture names the run needs.
    """
    import seqio

    for module in modules:
        importlib.import_module(module)
    registered = set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
    if any(name not in registered for name in names):
        from t2t.data import tasks

        logging.info("Importing every task registration module to find %s.", list(names))
        tasks.import_all()


def _require(value: Any, flag: str, binding: str) -> Any:
    if value is None:
        raise ValueError(f"Missing {flag}: pass the flag, or bind {binding} in gin (the files "
                         "in gin/runs/ take it from a macro, e.g. --gin.MODEL_DIR=\"'/path'\").")
    return value


# -- evaluate ------------------------------------------------------------------------------------


@gin.configurable(module="t2t.runs")
def evaluate(
    model_dir: str | None = None,
    tasks: str | Sequence[str] | None = None,
    *,
    step: int | None = None,
    steps: Sequence[int] | None = None,
    all_steps: bool = False,
    split: str = "validation",
    batch_size: int = 32,
    method: str = "greedy",
    beam_size: int = 4,
    alpha: float = 0.6,
    max_decode_length: int | None = None,
    task_feature_lengths: dict[str, int] | None = None,
    num_examples: int | None = None,
    output_file: str | None = None,
    log_predictions: bool = False,
    modules: Sequence[str] = (),
    mesh_shape: Sequence[int] | None = None,
    sharding_mode: str = "tensor_parallel",
) -> dict[str, Any]:
    """Evaluates checkpoints of `model_dir` on tasks and reports the best checkpoint per task.

    Args:
      model_dir: the run's model directory.
      tasks: task or mixture names (a list, or one comma-separated string).
      step: evaluate this step; steps: these steps; all_steps: every saved step; none of
        them: the latest step.
      split: the split to evaluate.
      batch_size, method, beam_size, alpha, max_decode_length: decoding (greedy by default;
        beam 4 with alpha 0.6 as in the paper).
      task_feature_lengths: cut examples to these lengths (default: no cut).
      num_examples: at most this many examples per task.
      output_file: results JSON (default `<model_dir>/eval/results.json`).
      log_predictions: also write predictions per task and step under `<model_dir>/eval`.
      modules: task registration modules to import (e.g. "t2t.data.tasks.glue").
      mesh_shape, sharding_mode: run sharded on a (data, model) mesh.

    Returns:
      What `t2t.evaluation.evaluate_model_dir` returns (per-step metrics and the best).
    """
    from t2t import evaluation

    model_dir = _require(model_dir, "--model_dir", "evaluate.model_dir")
    names = _names(tasks, "evaluate")
    choices = sum([step is not None, steps is not None, bool(all_steps)])
    if choices > 1:
        raise ValueError("Pass at most one of step, steps and all_steps.")
    selection = "all" if all_steps else (list(steps) if steps is not None else
                                         None if step is None else [step])
    import_task_modules(modules, names)
    return evaluation.evaluate_model_dir(
        model_dir, names, steps=selection, output_file=output_file,
        partitioner=_partitioner(mesh_shape, sharding_mode), split=split,
        task_feature_lengths=task_feature_lengths, num_examples=num_examples,
        log_predictions=log_predictions, batch_size=batch_size, method=method,
        beam_size=beam_size, alpha=alpha, max_decode_length=max_decode_length,
    )


@gin.configurable(module="t2t.runs")
def seqio_evaluator(
    model,
    partitioner=None,
    *,
    tasks: str | Sequence[str] | None = None,
    model_dir: str | None = None,
    split: str = "validation",
    batch_size: int = 32,
    method: str = "greedy",
    beam_size: int = 4,
    alpha: float = 0.6,
    max_decode_length: int | None = None,
    task_feature_lengths: dict[str, int] | None = None,
    num_examples: int | None = None,
    log_predictions: bool = False,
):
    """The trainer's decoding evaluator: `evaluator(params, step) -> {"task/metric": value}`.

    Bind `train.evaluators = [@t2t.runs.seqio_evaluator]` and its `tasks` (and `model_dir =
    %MODEL_DIR` for TensorBoard summaries under `<model_dir>/eval`).
    """
    from t2t import evaluation

    names = _names(tasks, "seqio_evaluator")
    import_task_modules((), names)
    return evaluation.Evaluator(
        model, names, split=split, task_feature_lengths=task_feature_lengths,
        num_examples=num_examples, log_predictions=log_predictions,
        log_dir=os.path.join(model_dir, "eval") if model_dir else None, partitioner=partitioner,
        batch_size=batch_size, method=method, beam_size=beam_size, alpha=alpha,
        max_decode_length=max_decode_length,
    )


# -- infer ---------------------------------------------------------------------------------------


@gin.configurable(module="t2t.runs")
def infer(
    output_file: str | None = None,
    *,
    model_dir: str | None = None,
    input_file: str | None = None,
    task: str | None = None,
    mode: str = "predict",
    checkpoints: str | Sequence[str] = (),
    step: int | None = None,
    split: str = "validation",
    vocabulary_file: str | None = None,
    batch_size: int = 32,
    method: str = "greedy",
    beam_size: int = 4,
    alpha: float = 0.6,
    max_decode_length: int | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int = 0,
    inputs_length: int | None = None,
    targets_length: int | None = None,
    num_examples: int | None = None,
    modules: Sequence[str] = (),
    mesh_shape: Sequence[int] | None = None,
    sharding_mode: str = "tensor_parallel",
) -> int:
    """Predicts or scores a JSONL/TSV file or a task/mixture; writes JSONL records.

    Args:
      output_file: the JSONL file to write.
      model_dir: the run's model directory (its `step`, default the latest).
      input_file: JSONL ({"inputs", "targets"?}) or TSV (inputs[<TAB>targets]) examples, or
      task: a registered task or mixture (its `split`).
      mode: "predict" or "score" (the targets' log-likelihood).
      checkpoints: an ensemble (logits averaged): steps of model_dir and/or other model
        directories (DIR or DIR@STEP), as a list or a comma-separated string.
      vocabulary_file: a SentencePiece model overriding the checkpoint's (files only).
      batch_size, method, beam_size, alpha, max_decode_length, temperature, top_k, top_p,
        seed: decoding options of `t2t.inference.Predictor`.
      inputs_length, targets_length: feature lengths (default: the longest example).
      num_examples: at most this many examples (per task).
      modules: task registration modules to import.
      mesh_shape, sharding_mode: run sharded on a (data, model) mesh.

    Returns:
      The number of records written.
    """
    from t2t import inference

    output_file = _require(output_file, "--output_file", "infer.output_file")
    if isinstance(checkpoints, str):
        checkpoints = [c.strip() for c in checkpoints.split(",") if c.strip()]
    if task is not None:
        import_task_modules(modules, [task])
    count = inference.infer(
        output_file, model_dir=model_dir, input_file=input_file, task=task, mode=mode,
        checkpoints=list(checkpoints), step=step, split=split, vocabulary_file=vocabulary_file,
        inputs_length=inputs_length, targets_length=targets_length, num_examples=num_examples,
        partitioner=_partitioner(mesh_shape, sharding_mode), batch_size=batch_size,
        method=method, beam_size=beam_size, alpha=alpha, max_decode_length=max_decode_length,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
    )
    print(f"wrote {count} records to {output_file}")
    return count


# -- export and average --------------------------------------------------------------------------


@gin.configurable(module="t2t.runs")
def export(
    model_dir: str | None = None,
    output_dir: str | None = None,
    *,
    step: int | None = None,
    vocabulary_file: str | None = None,
    eval_results: str | None = None,
) -> str:
    """Writes a HF-format release directory from a checkpoint (see `t2t.release.export`)."""
    from t2t import release

    path = release.export(
        _require(model_dir, "--model_dir", "export.model_dir"),
        _require(output_dir, "--output_dir", "export.output_dir"),
        step=step, vocabulary_file=vocabulary_file, eval_results=eval_results,
    )
    print(f"wrote the release directory {path}")
    return path


@gin.configurable(module="t2t.runs")
def average(
    model_dir: str | None = None,
    output_dir: str | None = None,
    *,
    last: int | None = None,
    steps: Sequence[int] | None = None,
) -> str:
    """Averages the last N (or the given) checkpoints into a new model directory."""
    from t2t.checkpoints import averaging

    averaged = averaging.average_checkpoints(
        _require(model_dir, "--model_dir", "average.model_dir"), steps=steps, last=last)
    path = averaging.write_averaged(_require(output_dir, "--output_dir", "average.output_dir"),
                                    averaged)
    print(f"averaged steps {averaged.steps} of {model_dir} into {path}")
    return path


# -- parsing -------------------------------------------------------------------------------------


def default_search_paths() -> list[str]:
    """The repository's `gin/` directory and its parent, when t2t runs from a checkout."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return [p for p in (os.path.join(root, "gin"), root) if os.path.isdir(p)]


def configure(gin_files: Sequence[str], bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (), *, finalize: bool = True) -> None:
    """Parses gin files (in order) and then bindings, as the `t2t` CLI does.

    Files and their `include`s are looked up as given, then under each search path (given ones
    first, then the repository's `gin/` directory and its parent). Earlier configuration is
    cleared.
    """
    gin.clear_config()
    for path in [*search_paths, *default_search_paths()]:
        gin.add_config_file_search_path(path)
    gin.parse_config_files_and_bindings(list(gin_files), list(bindings), finalize_config=finalize)
