"""seqio evaluation of a model's parameters on tasks, during training and after it.

`Evaluator` wraps one `seqio.Evaluator` per task or mixture name: seqio reads each task's split
once, converts it with the model's unpacked feature converter (`model.feature_converter`)
and keeps it in memory; every call decodes (greedy or beam, `models.predict_batch`) and scores
(`models.score_batch`) it in fixed-size batches through one `t2t.inference.Predictor`, so the
model compiles once, and seqio applies each task's postprocessor and metric functions. A call

    metrics = evaluator(params, step)    # {"glue_cola/matthews_corrcoef": 41.3, ...}

returns flat `task/metric` values (the signature the trainer calls every N steps), writes them
to TensorBoard (`log_dir`, tags `task/metric`) and prints a table.

The paper reports, for each task, the best validation score over the checkpoints of a run
(section 3.1.3 and Appendix E). `best_checkpoints` selects it from the metrics of every evaluated
step, and `evaluate_model_dir` (what `t2t eval` runs) evaluates some or all checkpoints of a model
directory and writes the per-step metrics and the selection to `<model_dir>/eval/results.json`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Callable

import numpy as np
import seqio
from flax import nnx

from t2t import files, inference, metrics, models
from t2t.checkpoints.integrity import CorruptCheckpointError

History = Mapping[int, Mapping[str, float]]
RESULTS_FILE = "results.json"
ENSEMBLE_RESULTS_FILE = "ensemble_results.json"
# Rank classification chooses among a task's distinct targets; more than this is not a label set.
MAX_CANDIDATES = 100
# Metric names (substrings) for which lower is better; every paper metric is higher-better.
_LOWER_IS_BETTER = ("loss", "perplexity")


class Evaluator:
    """Evaluates parameters on the validation split of tasks and mixtures.

    Attributes:
      history: step -> the flat metrics of every call so far.
      task_names: the evaluated tasks (those of the mixtures, with metric functions).
    """

    def __init__(
        self,
        model: models.BaseModel,
        mixtures_or_tasks: str | Sequence[str],
        *,
        split: str = "validation",
        task_feature_lengths: Mapping[str, int] | None = None,
        num_examples: int | None = None,
        log_dir: str | None = None,
        log_predictions: bool = False,
        console: Callable[[str], None] | None = print,
        partitioner: Any = None,
        rank_classification: bool | Sequence[str] = False,
        **predictor_options,
    ):
        """
        Args:
          model: the model wrapper.
          mixtures_or_tasks: a registered task or mixture name, or several.
          split: the split to evaluate.
          task_feature_lengths: cut examples to these lengths; None: the longest example (seqio
            measures them), so no example is truncated.
          num_examples: evaluate at most this many examples of each task.
          log_dir: where TensorBoard summaries go (e.g. `<model_dir>/eval`); None: none.
          log_predictions: also write every task's inputs, targets and predictions per step as
            JSONL under `log_dir` (seqio's `JSONLogger`).
          console: where the metrics table is printed (None: nowhere).
          partitioner: a `t2t.partitioning.Partitioner` whose shards the parameters live in.
          rank_classification: score every candidate label and predict the likeliest instead
            of decoding, for every task (True) or the named ones. A task's candidates are the
            distinct targets of the evaluated split (at most `MAX_CANDIDATES`).
          **predictor_options: `inference.Predictor` options: the decoding config
            (`t2t.decoding.DecodingConfig`, greedy or beam), batch_size.
        """
        from t2t.data import tf_setup

        tf_setup.hide_accelerators_from_tensorflow()
        names = (
            [mixtures_or_tasks] if isinstance(mixtures_or_tasks, str) else list(mixtures_or_tasks)
        )
        if log_predictions and not log_dir:
            raise ValueError("log_predictions writes under log_dir; pass log_dir too.")
        self._seqio = seqio.Evaluator(
            _one_name(_checked_names(model, names)),
            model.feature_converter(pack=False, for_inference=True, count_trimmed=True),
            eval_split=split,
            sequence_length=task_feature_lengths,
            num_examples=num_examples,
            logger_cls=(seqio.loggers.JSONLogger,) if log_predictions else (),
            log_dir=log_dir,
            async_compute_metrics=False,
        )
        self.task_names = [task.name for task in self._seqio.eval_tasks]
        if not self.task_names:
            raise ValueError(
                f"None of {names} has a task with metric functions and a {split!r} split; "
                "nothing to evaluate."
            )
        self.rank_tasks = _rank_tasks(rank_classification, self.task_names)
        self._candidates: dict[str, np.ndarray] = {}
        self.predictor = inference.Predictor(model, partitioner=partitioner, **predictor_options)
        self.log_dir = log_dir
        self.console = console
        self.split = split
        self.history: dict[int, dict[str, float]] = {}
        self._writer = None

    def __call__(self, params: nnx.State, step: int) -> dict[str, float]:
        """Evaluates `params` (the checkpoint of `step`): -> {"task/metric": value}."""
        params_predict = lambda dataset, *_: self._predict(params, dataset)  # noqa: E731
        params_score = lambda dataset, *_: self._score(params, dataset)  # noqa: E731
        flat: dict[str, float] = {}
        future, _ = self._seqio.evaluate(
            compute_metrics=True, step=int(step), predict_fn=params_predict, score_fn=params_score
        )
        for task, values in future.result().items():
            for name, value in values.items():
                number = _scalar(value)
                if number is not None:
                    flat[f"{task}/{name}"] = number
        self.history[int(step)] = flat
        self._write_summaries(flat, int(step))
        if self.console is not None:
            self.console(format_table(flat, title=f"eval step {step} ({self.split})"))
        return flat

    def best(self) -> dict[str, Any]:
        """`best_checkpoints` over the steps evaluated so far."""
        return best_checkpoints(self.history)

    def _predict(self, params, dataset) -> list[tuple[int, list[int]]]:
        indices, examples = _enumerated(dataset)
        task = self._task_of(dataset)
        if task in self.rank_tasks:
            candidates = self.candidates(task)
            best, _ = self.predictor.rank(params, examples, candidates)
            return [(i, candidates[b].tolist()) for i, b in zip(indices, best)]
        tokens, _ = self.predictor.predict(params, examples)
        return [(i, t.tolist()) for i, t in zip(indices, tokens)]

    def _task_of(self, dataset) -> str | None:
        for name, cached in self._seqio.cached_model_datasets.items():
            if cached is dataset:
                return name
        return None

    def candidates(self, task: str) -> np.ndarray:
        """[C, T] the distinct targets (weighted target tokens, EOS included) of `task`'s
        evaluated split, sorted, zero-padded: the labels rank classification chooses from."""
        if task not in self._candidates:
            _, examples = _enumerated(self._seqio.cached_model_datasets[task])
            labels = sorted(
                {
                    tuple(
                        int(t)
                        for t, w in zip(
                            example["decoder_target_tokens"], example["decoder_loss_weights"]
                        )
                        if w > 0
                    )
                    for example in examples
                }
            )
            if len(labels) > MAX_CANDIDATES:
                raise ValueError(
                    f"Rank classification of {task!r}: its {self.split} split has "
                    f"{len(labels)} distinct targets, more than {MAX_CANDIDATES}; it is not a "
                    "classification task. Decode it instead (leave it out of "
                    "rank_classification)."
                )
            width = max(map(len, labels))
            table = np.zeros((len(labels), width), np.int32)
            for row, label in enumerate(labels):
                table[row, : len(label)] = label
            self._candidates[task] = table
        return self._candidates[task]

    def _score(self, params, dataset) -> list[tuple[int, float]]:
        indices, examples = _enumerated(dataset)
        return list(zip(indices, self.predictor.score(params, examples)))

    def _write_summaries(self, flat: Mapping[str, float], step: int) -> None:
        if not self.log_dir:
            return
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        with self._writer.as_default():
            for name, value in flat.items():
                tf.summary.scalar(name, value, step=step)
        self._writer.flush()


def _rank_tasks(choice: bool | Sequence[str], tasks: Sequence[str]) -> frozenset[str]:
    if choice is True:
        return frozenset(tasks)
    if not choice:
        return frozenset()
    named = [choice] if isinstance(choice, str) else list(choice)
    unknown = sorted(set(named) - set(tasks))
    if unknown:
        raise ValueError(
            f"rank_classification names {unknown}, which are not evaluated here; "
            f"the evaluated tasks are {list(tasks)}."
        )
    return frozenset(named)


def _one_name(names: Sequence[str]) -> str:
    """One task or mixture name for seqio: the name itself, or a mixture of the named ones.

    Evaluating everything as one mixture makes seqio pad all tasks to the same lengths, so the
    model compiles once for all of them.
    """
    if len(names) == 1:
        return names[0]
    from t2t.data import registry

    tasks = sorted(
        {t.name for n in names for t in seqio.get_subtasks(registry.get_task_or_mixture(n))}
    )
    name = "t2t_eval_" + hashlib.sha1(",".join(tasks).encode()).hexdigest()[:12]
    if name not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add(name, tasks, default_rate=1.0)
    return name


def _enumerated(dataset) -> tuple[list[int], list[dict[str, np.ndarray]]]:
    pairs = list(dataset.as_numpy_iterator())
    return [int(i) for i, _ in pairs], [features for _, features in pairs]


def _scalar(value: Any) -> float | None:
    """A metric value as a float; None for non-scalar values (texts, histograms)."""
    value = getattr(value, "value", value)  # seqio.metrics.Scalar
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _checked_names(model: models.BaseModel, names: list[str]) -> list[str]:
    """`names`, each a task or mixture readable offline whose vocabulary fits `model`."""
    from t2t.data import registry

    if not names:
        raise ValueError("Expected at least one task or mixture name to evaluate.")
    for name in names:  # offline readiness first: the vocabulary check reads the files
        registry.check_ready(registry.get_task_or_mixture(name))
    _check_vocabularies(model, names)
    return names


def _check_vocabularies(model: models.BaseModel, names: Sequence[str]) -> None:
    from t2t.data import registry

    for name in names:
        registry.check_vocabulary_fits(
            registry.get_task_or_mixture(name),
            model.config.vocab_size,
            fix="Evaluate with the vocabulary the model was trained with.",
        )


# -- reporting -----------------------------------------------------------------------------------


def format_table(flat: Mapping[str, float], *, title: str = "") -> str:
    """A readable table of `task/metric` values, one row per task (tasks sorted)."""
    by_task: dict[str, list[tuple[str, float]]] = {}
    for key, value in flat.items():
        task, _, metric = key.rpartition("/")
        by_task.setdefault(task, []).append((metric, value))
    width = max([len(t) for t in by_task] + [4])
    lines = [title] if title else []
    lines.append(f"  {'task':<{width}}  metrics")
    for task in sorted(by_task):
        cells = "  ".join(f"{m} {v:.2f}" for m, v in sorted(by_task[task]))
        lines.append(f"  {task:<{width}}  {cells}")
    return "\n".join(lines)


def higher_is_better(metric: str) -> bool:
    """False for losses and perplexities; True for every metric the paper reports."""
    return not any(word in metric.lower() for word in _LOWER_IS_BETTER)


def best_checkpoints(history: History) -> dict[str, Any]:
    """The best checkpoint of each task, as the paper reports results (best per task).

    A task's score at a step is the mean of its higher-is-better metrics (the paper averages
    metric pairs such as MRPC's accuracy and F1); its best step maximizes that score (ties go to
    the earlier step). Each metric's own best step is reported too, and, when every GLUE or
    SuperGLUE task is present, the benchmark average of the tasks' best checkpoints.

    Example: history {100: {"a/accuracy": 50, "b/f1": 70}, 200: {"a/accuracy": 60, "b/f1": 65}}
    -> tasks a: best step 200 (score 60), b: best step 100 (score 70).

    Args:
      history: step -> {"task/metric": value}.

    Returns:
      {"tasks": {task: {"best_step", "score", "metrics" (at best_step), "best_per_metric":
      {metric: {"step", "value"}}}}, "averages": {"glue"?: value, "super_glue"?: value}}.
    """
    series: dict[str, dict[str, dict[int, float]]] = {}
    for step in sorted(history):
        for key, value in history[step].items():
            task, _, metric = key.rpartition("/")
            if task and not math.isnan(value):
                series.setdefault(task, {}).setdefault(metric, {})[step] = float(value)
    tasks = {}
    for task, by_metric in sorted(series.items()):
        tasks[task] = _best_of_task(by_metric)
    return {"tasks": tasks, "averages": _benchmark_averages(tasks)}


def _best_of_task(by_metric: Mapping[str, Mapping[int, float]]) -> dict[str, Any]:
    per_metric = {}
    for metric, values in sorted(by_metric.items()):
        sign = 1.0 if higher_is_better(metric) else -1.0
        step = max(sorted(values), key=lambda s: sign * values[s])  # max keeps the first on ties
        per_metric[metric] = {"step": step, "value": values[step]}
    ranked = [m for m in by_metric if higher_is_better(m)] or list(by_metric)
    steps = sorted(set.intersection(*(set(by_metric[m]) for m in ranked)))
    sign = 1.0 if higher_is_better(ranked[0]) else -1.0
    score = {s: float(np.mean([by_metric[m][s] for m in ranked])) for s in steps}
    best = max(steps, key=lambda s: sign * score[s])
    return {
        "best_step": best,
        "score": score[best],
        "metrics": {m: by_metric[m][best] for m in sorted(by_metric) if best in by_metric[m]},
        "best_per_metric": per_metric,
    }


def _benchmark_averages(tasks: Mapping[str, Mapping[str, Any]]) -> dict[str, float]:
    averages = {}
    for benchmark, prefix, fn in (
        ("glue", "glue_", metrics.glue_average),
        ("super_glue", "super_glue_", metrics.superglue_average),
    ):
        scores = {t[len(prefix) :]: r["metrics"] for t, r in tasks.items() if t.startswith(prefix)}
        if scores:
            try:
                averages[benchmark] = fn(scores)
            except ValueError:  # not every sub-task was evaluated
                continue
    return averages


def format_best(best: Mapping[str, Any]) -> str:
    """The `best_checkpoints` report as a table: task, best step, score, metrics there."""
    rows = best["tasks"]
    width = max([len(t) for t in rows] + [4])
    lines = ["best checkpoint per task", f"  {'task':<{width}}  {'step':>8}  {'score':>7}  metrics"]
    for task, report in rows.items():
        cells = "  ".join(f"{m} {v:.2f}" for m, v in report["metrics"].items())
        step, score = report["best_step"], report["score"]
        lines.append(f"  {task:<{width}}  {step:>8}  {score:>7.2f}  {cells}")
    for name, value in best["averages"].items():
        lines.append(f"  {name} average of the best checkpoints: {value:.2f}")
    return "\n".join(lines)


# -- a model directory ---------------------------------------------------------------------------


def evaluate_model_dir(
    model_dir: str,
    mixtures_or_tasks: str | Sequence[str],
    *,
    steps: Iterable[int] | str | None = None,
    output_file: str | None = None,
    partitioner: Any = None,
    console: Callable[[str], None] | None = print,
    **evaluator_options,
) -> dict[str, Any]:
    """Evaluates checkpoints of a model directory and selects the best per task.

    Args:
      model_dir: the run's model directory.
      mixtures_or_tasks: task or mixture names.
      steps: None for the latest checkpoint, "all" for every saved one, or a list of steps.
      output_file: where the results JSON goes (default `<model_dir>/eval/results.json`).
      partitioner: restore and evaluate in its shards.
      console: where tables are printed.
      **evaluator_options: `Evaluator` options (split, batch_size, method, ...).

    Returns:
      {"split", "tasks", "steps": {step: {"task/metric": value}}, "best": best_checkpoints(...)}.
    """
    from t2t.checkpoints import model_dir as model_dir_lib

    directory = model_dir_lib.open_model_dir(model_dir)
    log_dir = files.join(directory.path, "eval")
    if not getattr(directory, "writable", True):  # a released checkpoint's folder
        if output_file is None:
            raise ValueError(
                f"{model_dir} is a released checkpoint, and nothing is written beside it: give "
                "--output_file for the results."
            )
        log_dir = files.parent(output_file)
    chosen, newest = _chosen_steps(directory, steps, partitioner)
    config = directory.config(chosen[-1])
    model = models.model_for(config)
    evaluator = Evaluator(
        model,
        mixtures_or_tasks,
        log_dir=log_dir,
        partitioner=partitioner,
        console=console,
        **evaluator_options,
    )
    skipped = _evaluate_steps(evaluator, directory, chosen, config, newest, partitioner, steps)
    if not evaluator.history:
        raise CorruptCheckpointError(
            model_dir, chosen[-1], "every checkpoint", f"none could be evaluated: {skipped}"
        )
    best = evaluator.best()
    if console is not None:
        console(format_best(best))
    results = {
        "split": evaluator.split,
        "tasks": evaluator.task_names,
        "steps": {str(s): m for s, m in sorted(evaluator.history.items())},
        "best": best,
    }
    if skipped:
        results["skipped_damaged"] = {str(s): why for s, why in skipped.items()}
    _write_json(output_file or files.join(log_dir, RESULTS_FILE), results)
    return results


def _chosen_steps(directory, steps, partitioner) -> tuple[list[int], Any]:
    """The steps `evaluate_model_dir` evaluates; for the latest, also its restored checkpoint
    (the newest intact one, read once)."""
    if steps == "all":
        chosen, newest = directory.steps(), None
    elif steps is None:
        newest = directory.load(None, partitioner=partitioner)  # the newest intact checkpoint
        chosen = [newest.step]
    else:
        chosen, newest = [directory.resolve_step(int(s)) for s in steps], None
    if not chosen:
        raise FileNotFoundError(f"{directory.path} holds no checkpoint to evaluate.")
    return chosen, newest


def _evaluate_steps(evaluator, directory, chosen, config, newest, partitioner, steps):
    """Evaluates each chosen step; with `steps="all"` a damaged one is skipped and said (and
    returned, step -> why), a step asked for by number raises its damage."""
    skipped = {}
    for step in chosen:
        try:
            params = _params_to_evaluate(directory, step, config, newest, partitioner)
        except CorruptCheckpointError as error:
            if steps != "all":
                raise  # a step asked for by number: its damage is the answer
            skipped[step] = f"{error.item}: {error.detail}"
            print(
                f"Skipped step {step}: its checkpoint is damaged ({skipped[step]}).",
                file=sys.stderr,
                flush=True,
            )
            continue
        newest = None
        evaluator(params, step)
        del params
    return skipped


def _params_to_evaluate(directory, step: int, config, newest, partitioner):
    """The parameters of `step` (the already loaded `newest` when it is that step).

    Raises:
      CorruptCheckpointError: the step's checkpoint is damaged.
      ValueError: its network differs from the one evaluated.
    """
    if directory.config(step) != config:
        raise ValueError(
            f"Checkpoint {step} of {directory.path} has a different network config from "
            f"the latest evaluated one; evaluate them separately."
        )
    if newest is not None and newest.step == step:
        return newest.params
    params, _ = directory.restore_params(step, config=config, partitioner=partitioner)
    return params


def evaluate_ensemble(
    model_dir: str | None,
    checkpoints: Sequence[str | int],
    mixtures_or_tasks: str | Sequence[str],
    *,
    output_file: str | None = None,
    partitioner: Any = None,
    console: Callable[[str], None] | None = print,
    **evaluator_options,
) -> dict[str, Any]:
    """Evaluates an ensemble of checkpoints (paper section 3.6): decoding averages the members'
    logits; scores and rank classification average their log-likelihoods.

    Args:
      model_dir: the model directory the members' bare steps refer to (may be None when every
        member names its directory).
      checkpoints: members: steps of `model_dir` and/or model directories (`DIR` or `DIR@STEP`).
      mixtures_or_tasks, partitioner, console, **evaluator_options: as `evaluate_model_dir`.
      output_file: the results JSON (default `<model_dir or first member>/eval/` +
        `ENSEMBLE_RESULTS_FILE`).

    Returns:
      {"split", "tasks", "members", "metrics": {"task/metric": value}}.
    """
    from t2t.checkpoints import model_dir as model_dir_lib

    if len(checkpoints) < 2:
        raise ValueError(f"An ensemble needs two or more checkpoints, got {list(checkpoints)}.")
    loaded, params = model_dir_lib.load_members(
        model_dir, list(checkpoints), partitioner=partitioner
    )
    evaluator = Evaluator(
        models.model_for(loaded.config),
        mixtures_or_tasks,
        partitioner=partitioner,
        console=console,
        **evaluator_options,
    )
    flat = evaluator(params, 0)
    members = [
        ":".join(str(x) for x in model_dir_lib.parse_member(c, model_dir)) for c in checkpoints
    ]
    results = {
        "split": evaluator.split,
        "tasks": evaluator.task_names,
        "members": members,
        "metrics": flat,
    }
    home = model_dir or model_dir_lib.parse_member(checkpoints[0], None)[0]
    _write_json(output_file or files.join(home, "eval", ENSEMBLE_RESULTS_FILE), results)
    return results


def _write_json(path: str, value: Any) -> None:
    import jax

    if jax.process_index() != 0:
        return
    files.makedirs(files.parent(files.absolute(path)))
    files.write_text(path, json.dumps(value, indent=2, sort_keys=True))
    logging.info("Wrote evaluation results to %s", path)
