"""`t2t eval` and `t2t infer`, and the evaluator the trainer calls: run functions that decode
(or score) with checkpoints of a model directory, one model or an ensemble."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import gin

from t2t import decoding
from t2t.runs import helpers
from t2t.runs.externals import decoding_config as gin_decoding_config


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
    decoding_config: decoding.DecodingConfig | None = None,
    task_feature_lengths: dict[str, int] | None = None,
    num_examples: int | None = None,
    output_file: str | None = None,
    log_predictions: bool = False,
    rank_classification: bool | str | Sequence[str] = False,
    checkpoints: str | Sequence[str] | None = None,
    modules: Sequence[str] = (),
    mesh_shape: Sequence[int] | None = None,
    sharding_mode: str = "tensor_parallel",
) -> dict[str, Any]:
    """Evaluates checkpoints of `model_dir` on tasks and reports the best checkpoint per task;
    or, with `checkpoints`, evaluates them as one ensemble.

    Args:
      model_dir: the run's model directory.
      tasks: task or mixture names (a list, or one comma-separated string).
      step: evaluate this step; steps: these steps; all_steps: every saved step; none of
        them: the latest step.
      split: the split to evaluate.
      batch_size: rows per decoding batch.
      decoding_config: how to decode (`t2t.decoding.DecodingConfig`, default greedy; the
        paper's beam is `method="beam", beam_size=4, alpha=0.6`).
      task_feature_lengths: cut examples to these lengths (default: no cut).
      num_examples: at most this many examples per task.
      output_file: results JSON (default `<model_dir>/eval/results.json`).
      log_predictions: also write predictions per task and step under `<model_dir>/eval`.
      rank_classification: pick the likeliest of each task's labels instead of decoding, for
        every task (True) or the named ones (a list, or a comma-separated string).
      checkpoints: ensemble members (steps of `model_dir`, `DIR` or `DIR@STEP`; a list or a
        comma-separated string): evaluate them as one ensemble.
      modules: task registration modules to import (e.g. "t2t.data.tasks.glue").
      mesh_shape, sharding_mode: run sharded on a (data, model) mesh.

    Returns:
      What `t2t.evaluation.evaluate_model_dir` returns (per-step metrics and the best), or
      for an ensemble what `evaluate_ensemble` returns.
    """
    from t2t import evaluation

    if checkpoints is None:
        model_dir = helpers.require(model_dir, "--model_dir", "evaluate.model_dir")
    members = helpers.task_names(checkpoints, "evaluate.checkpoints") if checkpoints else []
    helpers.refuse_overwriting_inputs(
        {"--output_file": output_file},
        model_dirs={"--model_dir": model_dir, **_member_dirs(members)},
    )
    names = helpers.task_names(tasks, "evaluate")
    selection = _step_selection(step, steps, all_steps)
    helpers.import_task_modules(modules, names)
    helpers.use_carried_vocabulary(model_dir, *members)
    if isinstance(rank_classification, str):
        rank_classification = helpers.task_names(
            rank_classification, "evaluate.rank_classification"
        )
    options = dict(
        split=split,
        task_feature_lengths=task_feature_lengths,
        num_examples=num_examples,
        rank_classification=rank_classification,
        batch_size=batch_size,
        config=gin_decoding_config(decoding_config),
    )
    options.update(
        output_file=output_file, partitioner=helpers.partitioner_for(mesh_shape, sharding_mode)
    )
    if checkpoints is not None:
        return _evaluate_ensemble(model_dir, checkpoints, selection, names, options)
    return evaluation.evaluate_model_dir(
        model_dir, names, steps=selection, log_predictions=log_predictions, **options
    )


def _evaluate_ensemble(model_dir, checkpoints, selection, names, options) -> dict[str, Any]:
    """`evaluate` of the ensemble `checkpoints` names (no step selection: they name theirs)."""
    from t2t import evaluation

    if selection is not None:
        raise ValueError(
            "An ensemble names its members in checkpoints; drop step, steps and all_steps."
        )
    members = helpers.task_names(checkpoints, "evaluate.checkpoints")  # refuses an empty list
    return evaluation.evaluate_ensemble(model_dir, members, names, **options)


def _step_selection(step, steps, all_steps) -> str | list[int] | None:
    """`evaluate`'s checkpoints to read: "all", the steps given, or None (the latest)."""
    if sum([step is not None, steps is not None, bool(all_steps)]) > 1:
        raise ValueError("Pass at most one of step, steps and all_steps.")
    if all_steps:
        return "all"
    if steps is not None:
        return list(steps)
    return None if step is None else [step]


@gin.configurable(module="t2t.runs")
def seqio_evaluator(
    model,
    partitioner=None,
    *,
    tasks: str | Sequence[str] | None = None,
    model_dir: str | None = None,
    split: str = "validation",
    batch_size: int = 32,
    decoding_config: decoding.DecodingConfig | None = None,
    task_feature_lengths: dict[str, int] | None = None,
    num_examples: int | None = None,
    log_predictions: bool = False,
    rank_classification: bool | Sequence[str] = False,
):
    """The trainer's decoding evaluator: `evaluator(params, step) -> {"task/metric": value}`.

    Bind `t2t.runs.EvalOptions.evaluators = [@t2t.runs.seqio_evaluator]` and its `tasks` (and `model_dir =
    %MODEL_DIR` for TensorBoard summaries under `<model_dir>/eval`). `rank_classification =
    True` (or a list of tasks) scores each label instead of decoding.
    """
    from t2t import evaluation

    names = helpers.task_names(tasks, "seqio_evaluator")
    helpers.import_task_modules((), names)
    return evaluation.Evaluator(
        model,
        names,
        split=split,
        task_feature_lengths=task_feature_lengths,
        num_examples=num_examples,
        log_predictions=log_predictions,
        log_dir=os.path.join(model_dir, "eval") if model_dir else None,
        partitioner=partitioner,
        batch_size=batch_size,
        config=gin_decoding_config(decoding_config),
        rank_classification=rank_classification,
    )


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
    decoding_config: decoding.DecodingConfig | None = None,
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
      batch_size: rows per decoding batch.
      decoding_config: how to decode (`t2t.decoding.DecodingConfig`; default greedy).
      inputs_length, targets_length: feature lengths (default: the longest example).
      num_examples: at most this many examples (per task).
      modules: task registration modules to import.
      mesh_shape, sharding_mode: run sharded on a (data, model) mesh.

    Returns:
      The number of records written.
    """
    from t2t import inference
    from t2t.data import vocab

    output_file = helpers.require(output_file, "--output_file", "infer.output_file")
    if isinstance(checkpoints, str):
        checkpoints = [c.strip() for c in checkpoints.split(",") if c.strip()]
    helpers.refuse_overwriting_inputs(
        {"--output_file": output_file},
        {"--input_file": input_file, "--vocabulary_file": vocabulary_file},
        {"--model_dir": model_dir, **_member_dirs(checkpoints)},
    )
    if vocabulary_file is not None:
        vocab.check_model_file(vocabulary_file)
    if task is not None:
        helpers.import_task_modules(modules, [task])
        helpers.use_carried_vocabulary(model_dir, *checkpoints)
    count = inference.infer(
        output_file,
        model_dir=model_dir,
        input_file=input_file,
        task=task,
        mode=mode,
        checkpoints=list(checkpoints),
        step=step,
        split=split,
        vocabulary_file=vocabulary_file,
        inputs_length=inputs_length,
        targets_length=targets_length,
        num_examples=num_examples,
        partitioner=helpers.partitioner_for(mesh_shape, sharding_mode),
        batch_size=batch_size,
        config=gin_decoding_config(decoding_config),
    )
    print(f"wrote {count} records to {output_file}")
    return count


def _member_dirs(members) -> dict[str, str]:
    """The model directories an ensemble's members name (steps of the run's own are ints)."""
    return {
        f"--checkpoints ({member})": str(member)
        for member in members
        if not str(member).strip().isdigit()
    }
