"""The gin edge: run functions configured from `gin/` files, and the library callables gin names.

Library modules carry no gin; everything gin binds is registered here. Run functions, each thin,
calling library code:

- `train` (`t2t train`): pretraining or fine-tuning (`t2t.trainer`);
- `evaluate` (`t2t eval`): seqio evaluation of one, some or all checkpoints of a model
  directory, and the best checkpoint per task (`t2t.evaluation`);
- `seqio_evaluator`: the same evaluation as a factory `factory(model=..., partitioner=...)` the
  trainer calls every `eval_every` steps (`train.evaluators = [@t2t.runs.seqio_evaluator]`);
- `infer` (`t2t infer`): predict or score a file or task, single model or ensemble
  (`t2t.inference`);
- `export` (`t2t export`): a HF-format release directory (`t2t.release`);
- `average` (`t2t average`): the mean of checkpoints (`t2t.checkpoints.averaging`);
- `compile_train` (`t2t compile`): the training run's programs compiled ahead of time for a TPU
  slice or CPU devices, with their memory, FLOPs and collectives (`t2t.aot`).

External configurables for what gin files reference: `t2t.nn.get_preset`, the `t2t.optim`
optimizer and schedules, the `t2t.models` wrappers, and `checkpoint_model_config` (the network
of a HF or t2t checkpoint to fine-tune).

Gin names are module-qualified as in Python (`@t2t.optim.inverse_sqrt()`,
`t2t.runs.train.batch_size = 128`); the short names (`train.batch_size`) work too when unique.
Every argument of evaluate/infer/export/average can also come from the CLI's flags. A training
run writes its operative gin config to `<model_dir>/config.gin` and the network's configuration
to `<model_dir>/model_config.json`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import json
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import optax

from t2t import decoding, models, optim
from t2t import nn as t2t_nn
from t2t.finetuning import FineTuning
from t2t.nn.config import TransformerConfig
from t2t.trainer import monitors

# -- external configurables ----------------------------------------------------------------------


def checkpoint_model_config(path: str, **overrides) -> TransformerConfig:
    """The network of a checkpoint to start from, with field overrides (e.g. dropout_rate).

    Args:
      path: a HF T5 directory (read from its `config.json`) or a t2t model directory (read
        from its latest checkpoint's metadata).
    """
    from t2t.trainer import init

    return init.source_config(path, **overrides)


def _register_externals() -> dict[str, Callable]:
    registered = {}
    for module, functions in (
        ("t2t.nn", (t2t_nn.get_preset,)),
        ("t2t.optim", (optim.adafactor, optim.inverse_sqrt, optim.constant,
                       optim.warmup_linear_decay, optim.warmup_cosine_decay,
                       optim.slanted_triangular)),
        ("t2t.finetuning", (FineTuning,)),
        ("t2t.trainer", (monitors.EarlyStopping, monitors.ReduceOnPlateau)),
        ("t2t.models", (models.EncoderDecoderModel, models.DecoderOnlyModel, models.model_for)),
        ("optax", (optax.adamw, optax.sgd)),
        ("t2t.runs", (checkpoint_model_config,)),
    ):
        for function in functions:
            name = function.__name__
            registered[f"{module}.{name}"] = gin.external_configurable(function, name, module)
    return registered


_EXTERNALS = _register_externals()


def _register_objectives() -> None:
    """Every pretraining objective's knobs bindable from gin, for every task built on it
    (built-in corpus, text files, C4, the C4 pipeline's output): `span_corruption.noise_density
    = 0.5`, `span_corruption.mean_noise_span_length = 10.0`, `bert_style.mask_rate = 0.8`.
    Knobs a task was registered with (the C4 sweep tasks) take precedence."""
    import preprocessors
    from t2t.data.tasks import text

    for name in text.OBJECTIVES:
        wrapper = gin.external_configurable(getattr(preprocessors, name), name, "preprocessors")
        text.set_objective_implementation(name, wrapper)


_register_objectives()


# -- train ---------------------------------------------------------------------------------------


@gin.configurable(module="t2t.runs")
def train(
    model_dir: str = gin.REQUIRED,
    mixture_or_task: str = gin.REQUIRED,
    task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
    train_steps: int = gin.REQUIRED,
    model_config: TransformerConfig | None = None,
    batch_size: int = 128,
    model_fn: Callable[..., models.BaseModel] = _EXTERNALS["t2t.models.model_for"],
    optimizer: Callable[..., optax.GradientTransformation] = _EXTERNALS["t2t.optim.adafactor"],
    learning_rate: optax.Schedule | float = 1e-3,
    num_microbatches: int = 1,
    mesh_shape: Sequence[int] = (-1, 1),
    sharding_mode: str = "tensor_parallel",
    pack: bool = True,
    use_cached: bool = False,
    max_train_examples: int | None = None,
    seed: int = 0,
    log_every: int = 100,
    checkpoint_every: int = 1000,
    keep_checkpoints: int | None = 3,
    best_metrics: Mapping[str, str] | None = None,
    eval_every: int | None = None,
    eval_tasks: Sequence[str] = (),
    eval_split: str = "validation",
    eval_steps: int | None = 10,
    evaluators: Sequence[Callable[..., Callable]] = (),
    init_checkpoint: str | None = None,
    finetuning: FineTuning | None = None,
    early_stopping: monitors.EarlyStopping | None = None,
    reduce_on_plateau: monitors.ReduceOnPlateau | None = None,
    num_predictions: int = 0,
    async_checkpoints: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Trains a model and keeps its checkpoints, summaries and config in `model_dir`.

    Restarting with the same `model_dir` resumes from its latest checkpoint (the data continues
    where it stopped). With no checkpoint there, `init_checkpoint` (a HF T5 directory or another
    run's model directory) supplies the first parameters and the optimizer starts afresh.

    Args:
      model_dir: the run's directory (local or any path Orbax and TensorFlow can write).
      mixture_or_task: the registered seqio task or mixture to train on.
      task_feature_lengths: e.g. {"inputs": 512, "targets": 114}.
      train_steps: train until this many updates (counting restored ones).
      model_config: the network; None takes it from `init_checkpoint`.
      batch_size: global batch (rows over all hosts).
      model_fn: builds the model wrapper from the config (`t2t.models.model_for`; bind its
        `z_loss` and `loss_normalizing_factor`).
      optimizer: called as `optimizer(learning_rate=...)` (`t2t.optim.adafactor`).
      learning_rate: a schedule (`@t2t.optim.inverse_sqrt()`) or a constant.
      num_microbatches: gradient-accumulation microbatches per step.
      mesh_shape: (data, model) mesh sizes, one may be -1.
      sharding_mode: `data_parallel`, `tensor_parallel` or `fsdp`.
      pack: pack examples into rows.
      use_cached: read the tasks' seqio caches.
      max_train_examples: train on a subset of this many examples of the task, chosen by
        `seed` (None: all); recorded in the checkpoints' metadata as `train_subset`.
      seed: seeds initialization, dropout, the data order and the subset.
      log_every, checkpoint_every, eval_every: periods in steps (eval None: never).
      keep_checkpoints: recent checkpoints to keep (None: all).
      best_metrics: {metric: "max" | "min"} whose best checkpoint is also kept, e.g.
        {"builtin_package/token_accuracy": "max"}.
      eval_tasks: tasks whose teacher-forced loss and token accuracy are measured.
      eval_split: their split.
      eval_steps: batches per eval task (None: the whole split).
      evaluators: factories `factory(model=..., partitioner=...)` returning
        `evaluator(params, step) -> {metric: value}` (decoding metrics).
      init_checkpoint: HF T5 directory or t2t model directory to start from.
      finetuning: what trains and how (`@t2t.finetuning.FineTuning()`; the files in
        gin/finetuning/ bind it for each method).
      early_stopping: `@t2t.trainer.EarlyStopping()`: stop after `patience` evaluations
        without improving its metric (the best checkpoint is kept).
      reduce_on_plateau: `@t2t.trainer.ReduceOnPlateau()`: lower the update scale when its
        metric stops improving.
      num_predictions: decode and print this many validation examples at the end.
      async_checkpoints: write checkpoints in the background.
      progress: show a progress bar.

    Returns:
      The trainer's summary (steps, first and last loss, compile time, eval results) and the
      printed predictions.
    """
    from t2t import partitioning
    from t2t.checkpoints import lock

    _check_counts(train_steps=train_steps, batch_size=batch_size,
                  num_microbatches=num_microbatches, log_every=log_every,
                  checkpoint_every=checkpoint_every, eval_every=eval_every,
                  eval_steps=eval_steps, keep_checkpoints=keep_checkpoints,
                  max_train_examples=max_train_examples, num_predictions=num_predictions)
    partitioning.initialize_distributed()
    with lock.hold(model_dir):  # one writer per model directory; fails fast when held
        return _train(**{k: v for k, v in locals().items() if k not in ("partitioning", "lock")})


def _train(*, model_dir, mixture_or_task, task_feature_lengths, train_steps, model_config,
           batch_size, model_fn, optimizer, learning_rate, num_microbatches, mesh_shape,
           sharding_mode, pack, use_cached, max_train_examples, seed, log_every,
           checkpoint_every, keep_checkpoints, best_metrics, eval_every, eval_tasks, eval_split,
           eval_steps, evaluators, init_checkpoint, finetuning, early_stopping,
           reduce_on_plateau, num_predictions, async_checkpoints, progress) -> dict[str, Any]:
    """`train`'s body, run while holding the model directory's lock."""
    from t2t import partitioning
    from t2t.checkpoints.manager import BestMetric
    from t2t.data import pipeline, registry
    from t2t.trainer import Trainer, batches, predictions

    import_task_modules((), [mixture_or_task, *eval_tasks])
    use_carried_vocabulary(model_dir, init_checkpoint)
    config = _resolve_model_config(model_config, init_checkpoint)
    model = model_fn(config)
    partitioner = partitioning.make_partitioner(*mesh_shape, mode=sharding_mode)
    shard_index, num_shards = partitioner.data_shard()
    data = dict(task_feature_lengths=dict(task_feature_lengths), global_batch_size=batch_size,
                architecture=config.architecture, feature_converter=model.feature_converter,
                pack=pack, use_cached=use_cached, seed=seed,
                shard_index=shard_index, num_shards=num_shards)
    train_config = pipeline.PipelineConfig(mixture_or_task, **data,
                                           max_examples=max_train_examples)
    train_data = pipeline.InputPipeline(train_config)
    metadata = _data_metadata(registry.get_task_or_mixture(mixture_or_task), mixture_or_task,
                              task_feature_lengths)
    metadata["batch_size"] = batch_size
    _check_resumable(model_dir, metadata)
    subset = getattr(train_data, "subset", None)
    if subset is not None:
        metadata["train_subset"] = subset
    eval_configs = {
        name: pipeline.PipelineConfig(name, **{**data, "use_cached": False}, split=eval_split,
                                      shuffle=False, num_epochs=1)
        for name in eval_tasks
    }
    trainer = Trainer(
        model, optimizer(learning_rate=learning_rate), partitioner, model_dir,
        train_data, learning_rate=learning_rate,
        num_microbatches=num_microbatches, seed=seed, log_every=log_every,
        checkpoint_every=checkpoint_every, keep_checkpoints=keep_checkpoints,
        best_metrics=[BestMetric(k, v) for k, v in (best_metrics or {}).items()],
        eval_every=eval_every,
        eval_data={k: batches.eval_batches(c, eval_steps) for k, c in eval_configs.items()},
        evaluators=[make(model=model, partitioner=partitioner) for make in evaluators],
        metadata=metadata, init_checkpoint=init_checkpoint, finetuning=finetuning,
        early_stopping=early_stopping, reduce_on_plateau=reduce_on_plateau,
        async_checkpoints=async_checkpoints, progress=progress,
    )
    write_run_files(model_dir, config,
                    vocabulary_file=metadata.get("vocabulary", {}).get("sentencepiece_model_file"))
    try:
        summary = trainer.train(train_steps)
        chief = trainer.is_chief
        stopped = summary["stopped_early"]
        if chief and stopped is not None and summary["first_step"] == trainer.step:
            best = summary["best"].get("early_stopping", {})
            print(f"nothing to train: this run stopped early at step {stopped} (best "
                  f"{early_stopping.metric if early_stopping else 'metric'} {best.get('value')} "
                  f"at step {best.get('step')}). Give a new MODEL_DIR to train again.",
                  flush=True)
        elif chief and summary["first_step"] == trainer.step >= train_steps:
            print(f"nothing to train: the model directory is already at step {trainer.step}, the "
                  "run's train_steps. Raise TRAIN_STEPS to go on, or give a new MODEL_DIR to "
                  "start over.", flush=True)
        shown = []
        if num_predictions:
            vocabulary = registry.get_task_or_mixture(mixture_or_task).output_features[
                "targets"].vocabulary
            target = eval_configs[eval_tasks[0]] if eval_tasks else dataclasses.replace(
                train_config, split=eval_split, max_examples=None)
            shown = predictions.predict_examples(model, trainer.params, partitioner, target,
                                                 vocabulary, num_predictions)
            if chief:
                print(f"\nGreedy predictions after step {trainer.step} "
                      f"({target.mixture_or_task}, {eval_split}):\n"
                      f"{predictions.format_predictions(shown)}", flush=True)
    finally:
        trainer.close()
    write_run_files(model_dir, config)  # now with everything the run used
    return {**summary, "predictions": shown}


# The counts `train` takes: None allowed?, zero allowed?, the macro most gin files bind it by.
_COUNTS = {
    "train_steps": (False, False, "TRAIN_STEPS"), "batch_size": (False, False, "BATCH_SIZE"),
    "num_microbatches": (False, False, None), "log_every": (False, False, None),
    "checkpoint_every": (False, False, None), "eval_every": (True, False, None),
    "eval_steps": (True, False, None), "keep_checkpoints": (True, False, None),
    "max_train_examples": (True, False, None), "num_predictions": (False, True, None),
}


def _check_counts(**values: Any) -> None:
    """Refuses a count that is not a positive int (e.g. TRAIN_STEPS = 0, or a string) before
    anything is built, naming the binding and what to give."""
    for name, value in values.items():
        none_ok, zero_ok, macro = _COUNTS[name]
        if value is None and none_ok:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and (
                value > 0 or (zero_ok and value == 0)):
            continue
        binding = f"t2t.runs.train.{name}" + (f" (the gin macro {macro})" if macro else "")
        wanted = "a non-negative int" if zero_ok else "a positive int"
        if none_ok:
            wanted += " or None"
        raise ValueError(f"{binding} must be {wanted}; got {value!r} "
                         f"({type(value).__name__}). Example: --gin.{macro or binding}=100")


def _resolve_model_config(model_config: TransformerConfig | None,
                          init_checkpoint: str | None) -> TransformerConfig:
    if model_config is not None:
        if not isinstance(model_config, TransformerConfig):
            raise TypeError(
                "train.model_config must be a TransformerConfig (e.g. @t2t.nn.get_preset()), got "
                f"{type(model_config).__name__}."
            )
        return model_config
    if init_checkpoint is None:
        raise ValueError(
            "No model: bind train.model_config (include a gin/models/ file) or set "
            "train.init_checkpoint to take the network of a checkpoint."
        )
    return checkpoint_model_config(init_checkpoint)


def _data_metadata(provider, name: str, lengths: Mapping[str, int]) -> dict[str, Any]:
    """The data entries of the checkpoint metadata: task, lengths and vocabulary."""
    vocabulary = provider.output_features["targets"].vocabulary
    entry: dict[str, Any] = {"mixture_or_task": name, "task_feature_lengths": dict(lengths)}
    model_file = getattr(vocabulary, "sentencepiece_model_file", None)
    if model_file is not None:
        entry["vocabulary"] = {"sentencepiece_model_file": model_file,
                               "extra_ids": vocabulary.extra_ids}
    else:
        logging.warning("The vocabulary of %s is not SentencePiece; not recorded.", name)
    return entry


def _check_resumable(model_dir: str, metadata: Mapping[str, Any]) -> None:
    """Refuses to resume a model directory with another data layout than its checkpoints': the
    saved input-pipeline position only fits the same task, batch size and feature lengths.

    Reads the newest readable metadata file directly, not through Orbax, whose managers
    synchronize every host when they open (hosts reach this point at different times)."""
    from t2t.checkpoints.manager import CHECKPOINTS_SUBDIR

    directory = os.path.join(model_dir, CHECKPOINTS_SUBDIR)
    if "://" in model_dir or not os.path.isdir(directory):
        return
    saved = None
    for step in sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True):
        try:
            with open(os.path.join(directory, str(step), "metadata", "metadata")) as f:
                saved = json.load(f)
            break
        except (OSError, ValueError):
            continue  # damaged: the restore will report it and fall back
    if not isinstance(saved, dict):
        return
    for key, flag in (("mixture_or_task", "MIXTURE_OR_TASK"), ("batch_size", "BATCH_SIZE"),
                      ("task_feature_lengths", "TASK_FEATURE_LENGTHS")):
        if key in saved and saved[key] != metadata[key]:
            raise ValueError(
                f"The checkpoints in {model_dir} were trained with {key} {saved[key]!r}; this "
                f"run has {metadata[key]!r}. A run resumes only with the data it was saved "
                f"with (the input pipeline's position is in the checkpoint): resume with "
                f"{flag}={saved[key]!r}, or give a new MODEL_DIR with "
                f"INIT_CHECKPOINT='{model_dir}' to start from its parameters.")


def use_carried_vocabulary(*directories: str | None) -> str | None:
    """Makes the tasks registered with the default vocabulary (`t2t.data.vocab`) tokenize with
    the SentencePiece model the first of `directories` carries (`spiece.model`: a t2t model
    directory's copy, a HF directory's tokenizer), so a checkpoint is read with its own
    tokenizer wherever it was moved. Returns the file used, or None when none carries one."""
    import tensorflow as tf

    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.data import vocab

    for directory in directories:
        if not directory or not isinstance(directory, str):
            continue
        path = os.path.join(directory.split("@")[0], model_dir_lib.VOCABULARY_FILE)
        if tf.io.gfile.exists(path):
            if vocab.default_vocabulary_path() != path:
                logging.info("Tasks with the default vocabulary use %s.", path)
            vocab.set_default_vocabulary(path)
            return path
    return None


def write_run_files(model_dir: str, config: TransformerConfig,
                    vocabulary_file: str | None = None) -> None:
    """Writes `config.gin` (the operative gin config), `model_config.json` and a copy of the
    SentencePiece model, `spiece.model`, so the directory is self-contained (process 0)."""
    import jax
    import tensorflow as tf

    from t2t.checkpoints import model_dir as model_dir_lib

    if jax.process_index() != 0:
        return
    os.makedirs(model_dir, exist_ok=True)
    with open(os.path.join(model_dir, model_dir_lib.CONFIG_GIN), "w") as f:
        f.write(gin.operative_config_str())
    with open(os.path.join(model_dir, model_dir_lib.MODEL_CONFIG_JSON), "w") as f:
        json.dump(dataclasses.asdict(config), f, indent=2, sort_keys=True)
    copy = os.path.join(model_dir, model_dir_lib.VOCABULARY_FILE)
    if vocabulary_file and os.path.abspath(vocabulary_file) != os.path.abspath(copy):
        temporary = copy + ".tmp"  # renamed into place: never a half-written tokenizer
        tf.io.gfile.copy(vocabulary_file, temporary, overwrite=True)
        tf.io.gfile.rename(temporary, copy, overwrite=True)


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
        model_dir = _require(model_dir, "--model_dir", "evaluate.model_dir")
    names = _names(tasks, "evaluate")
    choices = sum([step is not None, steps is not None, bool(all_steps)])
    if choices > 1:
        raise ValueError("Pass at most one of step, steps and all_steps.")
    selection = "all" if all_steps else (list(steps) if steps is not None else
                                         None if step is None else [step])
    import_task_modules(modules, names)
    use_carried_vocabulary(model_dir, *(_names(checkpoints, "evaluate.checkpoints")
                                        if checkpoints else ()))
    if isinstance(rank_classification, str):
        rank_classification = _names(rank_classification, "evaluate.rank_classification")
    options = dict(split=split, task_feature_lengths=task_feature_lengths,
                   num_examples=num_examples, rank_classification=rank_classification,
                   batch_size=batch_size, config=decoding_config)
    if checkpoints is not None:
        if choices:
            raise ValueError("An ensemble names its members in checkpoints; drop step, steps "
                             "and all_steps.")
        members = _names(checkpoints, "evaluate.checkpoints")
        return evaluation.evaluate_ensemble(
            model_dir, members, names, output_file=output_file,
            partitioner=_partitioner(mesh_shape, sharding_mode), **options)
    return evaluation.evaluate_model_dir(
        model_dir, names, steps=selection, output_file=output_file,
        partitioner=_partitioner(mesh_shape, sharding_mode), log_predictions=log_predictions,
        **options)


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

    Bind `train.evaluators = [@t2t.runs.seqio_evaluator]` and its `tasks` (and `model_dir =
    %MODEL_DIR` for TensorBoard summaries under `<model_dir>/eval`). `rank_classification =
    True` (or a list of tasks) scores each label instead of decoding.
    """
    from t2t import evaluation

    names = _names(tasks, "seqio_evaluator")
    import_task_modules((), names)
    return evaluation.Evaluator(
        model, names, split=split, task_feature_lengths=task_feature_lengths,
        num_examples=num_examples, log_predictions=log_predictions,
        log_dir=os.path.join(model_dir, "eval") if model_dir else None, partitioner=partitioner,
        batch_size=batch_size, config=decoding_config, rank_classification=rank_classification,
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

    output_file = _require(output_file, "--output_file", "infer.output_file")
    if isinstance(checkpoints, str):
        checkpoints = [c.strip() for c in checkpoints.split(",") if c.strip()]
    if task is not None:
        import_task_modules(modules, [task])
        use_carried_vocabulary(model_dir, *checkpoints)
    count = inference.infer(
        output_file, model_dir=model_dir, input_file=input_file, task=task, mode=mode,
        checkpoints=list(checkpoints), step=step, split=split, vocabulary_file=vocabulary_file,
        inputs_length=inputs_length, targets_length=targets_length, num_examples=num_examples,
        partitioner=_partitioner(mesh_shape, sharding_mode), batch_size=batch_size,
        config=decoding_config,
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
    overwrite: bool = False,
) -> str:
    """Writes a HF-format release directory from a checkpoint (see `t2t.release.export`)."""
    from t2t import release

    path = release.export(
        _require(model_dir, "--model_dir", "export.model_dir"),
        _require(output_dir, "--output_dir", "export.output_dir"),
        step=step, vocabulary_file=vocabulary_file, eval_results=eval_results,
        overwrite=overwrite,
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


# -- compile -------------------------------------------------------------------------------------

# The arguments of `train` that decide its programs, and their defaults.
_TRAIN_PROGRAM_ARGS = ("model_config", "init_checkpoint", "batch_size", "task_feature_lengths",
                       "mesh_shape", "sharding_mode", "num_microbatches", "pack", "model_fn",
                       "optimizer", "learning_rate")


def _train_bindings() -> dict[str, Any]:
    """The program-deciding arguments `train` would be called with under the current gin
    configuration (its bindings over its defaults)."""
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items()}
    bound = gin.get_bindings("t2t.runs.train")
    return {name: bound.get(name, defaults[name]) for name in _TRAIN_PROGRAM_ARGS}


@gin.configurable(module="t2t.runs")
def compile_train(
    topology: str | None = None,
    *,
    cpu_devices: int | None = None,
    device_memory_gib: float | None = None,
    batch_size: int | None = None,
    mesh_shape: Sequence[int] | None = None,
    sharding_mode: str | None = None,
    num_microbatches: int | None = None,
    remat_policy: str | None = None,
    scan_layers: bool | None = None,
    decode: bool = True,
    output_json: str | None = None,
    progress: bool = True,
):
    """Compiles the configured training run's programs ahead of time and reports their costs.

    The run is what `t2t train` would run under the same gin files (`t2t.runs.train`'s network,
    batch, lengths, mesh, sharding mode, microbatches and optimizer); the arguments here
    override those. Nothing is allocated or executed, and no data is read.

    Args:
      topology: a Cloud TPU slice as libtpu names it, e.g. "v5e:4x4", "v5p:4x4x4" (needs the
        `tpu` extra); or
      cpu_devices: compile for this many CPU devices of this process instead.
      device_memory_gib: the memory per CPU device to check against (TPU: the chip's own).
      batch_size, mesh_shape, sharding_mode, num_microbatches: override the run's.
      remat_policy, scan_layers: override the network's (`TransformerConfig`).
      decode: also compile greedy decoding of one batch.
      output_json: write the report there as JSON.
      progress: show the elapsed time while compiling.

    Returns:
      The `t2t.aot.Report`.
    """
    from t2t import aot

    if (topology is None) == (cpu_devices is None):
        raise ValueError("Give exactly one target: --topology=v5e:4x4 (a TPU slice) or "
                         "--cpu_devices=N.")
    run = _train_bindings()
    for name, value in (("batch_size", batch_size), ("mesh_shape", mesh_shape),
                        ("sharding_mode", sharding_mode), ("num_microbatches", num_microbatches)):
        if value is not None:
            run[name] = value
    for name in ("task_feature_lengths",):
        if run[name] is gin.REQUIRED or run[name] is None:
            raise ValueError(f"The run binds no {name}; include the gin file of a run "
                             "(gin/runs/pretrain.gin and an objective) or bind it.")
    config = _resolve_model_config(run["model_config"], run["init_checkpoint"])
    changes = {k: v for k, v in (("remat_policy", remat_policy), ("scan_layers", scan_layers))
               if v is not None}
    config = config.replace(**changes)
    target = (aot.tpu_target(topology) if topology is not None
              else aot.cpu_target(cpu_devices, device_memory_gib))
    shape = aot.RunShape(
        config, run["batch_size"], dict(run["task_feature_lengths"]),
        mesh_shape=tuple(run["mesh_shape"]), sharding_mode=run["sharding_mode"],
        num_microbatches=run["num_microbatches"], pack=run["pack"])
    report = aot.compile_run(shape, target, model=run["model_fn"](config),
                             tx=run["optimizer"](learning_rate=run["learning_rate"]),
                             decode=decode, progress=progress)
    print(aot.format_report(report), flush=True)
    if output_json:
        with open(output_json, "w") as f:
            json.dump(report.to_json(), f, indent=2)
        print(f"wrote {output_json}")
    return report


# -- parsing ---------------------------------------------------------------------------------------


def default_search_paths() -> list[str]:
    """Where the shipped gin files are: the `gin/` directory and its parent, so both
    `gin/experiments/x.gin` and an `include 'runs/pretrain.gin'` resolve. From a checkout that
    is the repository's `gin/`; installed (a wheel), the copy in the package (`t2t._shipped`)."""
    package = os.path.dirname(os.path.abspath(__file__))
    roots = (os.path.dirname(package), os.path.join(package, "_shipped"))
    return [p for root in roots for p in (os.path.join(root, "gin"), root)
            if os.path.isdir(os.path.join(root, "gin"))]


def configure(gin_files: Sequence[str], bindings: Sequence[str] = (),
              search_paths: Sequence[str] = (), *, finalize: bool = True) -> None:
    """Parses gin files (in order) and then bindings, as the `t2t` CLI does.

    Files and their `include`s are looked up as given, then under each search path (given
    ones first, then the repository's `gin/` directory and its parent). Earlier configuration
    is cleared.

    Args:
      gin_files: e.g. ["gin/experiments/tiny_builtin_demo.gin"].
      bindings: e.g. ["MODEL_DIR = '/tmp/demo'", "t2t.runs.train.train_steps = 10"].
      search_paths: extra directories to resolve files and includes in.
      finalize: lock the configuration (no later changes).

    """
    gin.clear_config()
    _guard_system_path_lookup()
    for path in [*search_paths, *default_search_paths()]:
        gin.add_config_file_search_path(path)
    root = logging.getLogger()
    root.addFilter(_quiet_search_misses)
    try:
        gin.parse_config_files_and_bindings(list(gin_files), list(bindings),
                                            finalize_config=False)
    finally:
        root.removeFilter(_quiet_search_misses)
    _check_macros_are_used(bindings)
    if finalize:
        gin.finalize()


_MACRO_BINDING = re.compile(r"^\s*([A-Za-z_]\w*)\s*=", re.MULTILINE)


def _check_macros_are_used(bindings: Sequence[str]) -> None:
    """Refuses a binding of a macro that nothing refers to: a misspelt `TRAIN_STEP=10`.

    gin defines any macro it is given, so a typo would otherwise go unnoticed and the run would
    take the gin file's value. Only bindings are checked; gin files may define spare macros.
    """
    from gin import config as gin_config

    bound = {name for binding in bindings for name in _MACRO_BINDING.findall(binding)}
    if not bound:
        return
    defined, used = set(), set()

    def walk(value):
        if isinstance(value, gin_config.ConfigurableReference):
            scope, _, selector = value.scoped_selector.rpartition("/")
            if selector == "gin.macro":
                used.add(scope)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                walk(item)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)

    for (scope, selector), params in gin_config._CONFIG.items():  # noqa: SLF001
        if selector == "gin.macro":
            defined.add(scope)
        for value in params.values():
            walk(value)
    for name in sorted(bound - used):
        close = difflib.get_close_matches(name, sorted(defined - bound), n=3)
        hint = f" Did you mean {' or '.join(close)}?" if close else ""
        raise ValueError(
            f"The binding {name} = ... sets a gin macro that no configuration refers to (as "
            f"%{name}), so it would change nothing.{hint}"
        )


def _guard_system_path_lookup() -> None:
    """Makes gin's Python-path lookup of a config file answer "no" instead of crashing.

    gin also looks for `include 'runs/pretrain.gin'` as file `pretrain.gin` of a Python package
    `runs`. When a plain directory of that name is importable (a `runs/` model directory in the
    working directory of `python -m pytest` or a notebook), it is a namespace package without a
    file, and gin-config 0.5's check raises a TypeError instead of moving on to the search
    paths. The check is wrapped, in gin's reader table, to treat that case as "not there".
    """
    from gin import config as gin_config
    from gin import resource_reader

    def exists(path: str) -> bool:
        try:
            return resource_reader.system_path_file_exists(path)
        except TypeError:  # a namespace package: no origin file, so no config file in it
            return False

    gin_config._FILE_READERS[:] = [  # noqa: SLF001 (gin has no public way to replace a reader)
        (reader, exists if check is resource_reader.system_path_file_exists else check)
        for reader, check in gin_config._FILE_READERS
    ]


def _quiet_search_misses(record: logging.LogRecord) -> bool:
    """Drops gin's error log for each search path a file is not in (it is found in the next)."""
    return not (record.module == "resource_reader" and record.msg.startswith("Path not found"))
