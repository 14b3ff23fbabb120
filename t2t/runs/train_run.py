"""`t2t train`: the run function that wires a task, a network, an optimizer and a mesh into the
trainer, with the checks made before anything is built and the files a model directory keeps."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import types
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import jax
import optax

from t2t import models
from t2t.finetuning import FineTuning
from t2t.nn.config import TransformerConfig
from t2t.runs.externals import EXTERNALS
from t2t.runs.helpers import import_task_modules, resolve_model_config, use_carried_vocabulary
from t2t.trainer import monitors


@gin.configurable(module="t2t.runs")
def train(
    model_dir: str = gin.REQUIRED,
    mixture_or_task: str = gin.REQUIRED,
    task_feature_lengths: Mapping[str, int] = gin.REQUIRED,
    train_steps: int = gin.REQUIRED,
    model_config: TransformerConfig | None = None,
    batch_size: int = 128,
    model_fn: Callable[..., models.BaseModel] = EXTERNALS["t2t.models.model_for"],
    optimizer: Callable[..., optax.GradientTransformation] = EXTERNALS["t2t.optim.adafactor"],
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
    start_over: bool = False,
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
      start_over: train from step 0 in a model directory whose checkpoints are all damaged
        (`t2t train --start_over`); without it such a directory is refused (exit 2).

    Returns:
      The trainer's summary (steps, first and last loss, compile time, eval results) and the
      printed predictions.
    """
    from t2t import partitioning
    from t2t.checkpoints import lock

    _check_counts(
        train_steps=train_steps,
        batch_size=batch_size,
        num_microbatches=num_microbatches,
        log_every=log_every,
        checkpoint_every=checkpoint_every,
        eval_every=eval_every,
        eval_steps=eval_steps,
        keep_checkpoints=keep_checkpoints,
        max_train_examples=max_train_examples,
        num_predictions=num_predictions,
    )
    partitioning.initialize_distributed()
    with lock.hold(model_dir):  # one writer per model directory; fails fast when held
        run = {k: v for k, v in locals().items() if k not in ("partitioning", "lock")}
        return _train(types.SimpleNamespace(**run))


def _train(run: types.SimpleNamespace) -> dict[str, Any]:
    """`train`'s body (its arguments are the attributes of `run`), run while holding the model
    directory's lock."""
    from t2t import partitioning
    from t2t.data import pipeline

    import_task_modules((), [run.mixture_or_task, *run.eval_tasks])
    use_carried_vocabulary(run.model_dir, run.init_checkpoint)
    config = resolve_model_config(run.model_config, run.init_checkpoint)
    model = run.model_fn(config)
    partitioner = partitioning.make_partitioner(*run.mesh_shape, mode=run.sharding_mode)
    if jax.process_index() == 0:
        print(_network_line(config, partitioner, run.task_feature_lengths), flush=True)
    train_config, eval_configs = _data_configs(run, config, model, partitioner)
    train_data = pipeline.InputPipeline(train_config)
    metadata = _run_metadata(run, train_data)
    trainer = _make_trainer(run, model, partitioner, train_data, eval_configs, metadata)
    vocabulary_file = metadata.get("vocabulary", {}).get("sentencepiece_model_file")
    write_run_files(run.model_dir, config, vocabulary_file=vocabulary_file)
    try:
        summary = trainer.train(run.train_steps)
        if trainer.is_chief:
            _say_if_nothing_was_trained(run, summary, trainer.step)
        shown = []
        if run.num_predictions:
            target = (
                eval_configs[run.eval_tasks[0]]
                if run.eval_tasks
                else dataclasses.replace(train_config, split=run.eval_split, max_examples=None)
            )
            shown = _show_predictions(run, model, trainer, partitioner, target)
    finally:
        trainer.close()
    write_run_files(run.model_dir, config)  # now with everything the run used
    return {**summary, "predictions": shown}


def _network_line(config: TransformerConfig, partitioner, lengths) -> str:
    """What the step computes in and how attention runs on these devices, for the log."""
    from t2t.nn import attention_ops

    platform = partitioner.mesh.devices.flat[0].platform
    inputs, targets = lengths.get("inputs", 0), lengths.get("targets", 0)
    return f"compute {config.dtype}, parameters {config.param_dtype}; " + attention_ops.summary(
        config, platform, lengths=(inputs, targets)
    )


def _data_configs(run, config: TransformerConfig, model, partitioner):
    """The pipeline of the training data and one per eval task, this host's shard of each."""
    from t2t.data import pipeline

    shard_index, num_shards = partitioner.data_shard()
    data = dict(
        task_feature_lengths=dict(run.task_feature_lengths),
        global_batch_size=run.batch_size,
        architecture=config.architecture,
        feature_converter=model.feature_converter,
        pack=run.pack,
        use_cached=run.use_cached,
        seed=run.seed,
        shard_index=shard_index,
        num_shards=num_shards,
    )
    train_config = pipeline.PipelineConfig(
        run.mixture_or_task, **data, max_examples=run.max_train_examples
    )
    eval_configs = {
        name: pipeline.PipelineConfig(
            name,
            **{**data, "use_cached": False},
            split=run.eval_split,
            shuffle=False,
            num_epochs=1,
        )
        for name in run.eval_tasks
    }
    return train_config, eval_configs


def _run_metadata(run, train_data) -> dict[str, Any]:
    """The checkpoints' metadata of the run's data, refused when the model directory's
    checkpoints were trained on other data."""
    from t2t.data import registry

    provider = registry.get_task_or_mixture(run.mixture_or_task)
    metadata = _data_metadata(provider, run.mixture_or_task, run.task_feature_lengths)
    metadata["batch_size"] = run.batch_size
    _check_resumable(run.model_dir, metadata)
    subset = getattr(train_data, "subset", None)
    if subset is not None:
        metadata["train_subset"] = subset
    return metadata


def _make_trainer(run, model, partitioner, train_data, eval_configs, metadata):
    from t2t.checkpoints.manager import BestMetric
    from t2t.data import batches
    from t2t.trainer import Trainer

    return Trainer(
        model,
        run.optimizer(learning_rate=run.learning_rate),
        partitioner,
        run.model_dir,
        train_data,
        learning_rate=run.learning_rate,
        num_microbatches=run.num_microbatches,
        seed=run.seed,
        log_every=run.log_every,
        checkpoint_every=run.checkpoint_every,
        keep_checkpoints=run.keep_checkpoints,
        best_metrics=[BestMetric(k, v) for k, v in (run.best_metrics or {}).items()],
        eval_every=run.eval_every,
        eval_data={k: batches.eval_batches(c, run.eval_steps) for k, c in eval_configs.items()},
        evaluators=[make(model=model, partitioner=partitioner) for make in run.evaluators],
        metadata=metadata,
        init_checkpoint=run.init_checkpoint,
        finetuning=run.finetuning,
        early_stopping=run.early_stopping,
        reduce_on_plateau=run.reduce_on_plateau,
        async_checkpoints=run.async_checkpoints,
        progress=run.progress,
        start_over=run.start_over,
    )


def _say_if_nothing_was_trained(run, summary: Mapping[str, Any], step: int) -> None:
    """Tells why a run that trained no step did not (it had stopped early, or was done)."""
    stopped = summary["stopped_early"]
    if stopped is not None and summary["first_step"] == step:
        best = summary["best"].get("early_stopping", {})
        metric = run.early_stopping.metric if run.early_stopping else "metric"
        print(
            f"nothing to train: this run stopped early at step {stopped} (best {metric} "
            f"{best.get('value')} at step {best.get('step')}). Give a new MODEL_DIR to train "
            "again.",
            flush=True,
        )
    elif summary["first_step"] == step >= run.train_steps:
        print(
            f"nothing to train: the model directory is already at step {step}, the run's "
            "train_steps. Raise TRAIN_STEPS to go on, or give a new MODEL_DIR to start over.",
            flush=True,
        )


def _show_predictions(run, model, trainer, partitioner, target) -> list:
    """Greedy predictions of the first `num_predictions` examples of `target` (printed by
    process 0)."""
    from t2t.data import registry
    from t2t.trainer import predictions

    provider = registry.get_task_or_mixture(run.mixture_or_task)
    vocabulary = provider.output_features["targets"].vocabulary
    shown = predictions.show_examples(
        model, trainer.params, partitioner, target, vocabulary, run.num_predictions
    )
    if trainer.is_chief:
        print(
            f"\nGreedy predictions after step {trainer.step} ({target.mixture_or_task}, "
            f"{run.eval_split}):\n{predictions.format_predictions(shown)}",
            flush=True,
        )
    return shown


# The counts `train` takes: None allowed?, zero allowed?, the macro most gin files bind it by.
_COUNTS = {
    "train_steps": (False, False, "TRAIN_STEPS"),
    "batch_size": (False, False, "BATCH_SIZE"),
    "num_microbatches": (False, False, None),
    "log_every": (False, False, None),
    "checkpoint_every": (False, False, None),
    "eval_every": (True, False, None),
    "eval_steps": (True, False, None),
    "keep_checkpoints": (True, False, None),
    "max_train_examples": (True, False, None),
    "num_predictions": (False, True, None),
}


def _check_counts(**values: Any) -> None:
    """Refuses a count that is not a positive int (e.g. TRAIN_STEPS = 0, or a string) before
    anything is built, naming the binding and what to give."""
    for name, value in values.items():
        none_ok, zero_ok, macro = _COUNTS[name]
        if value is None and none_ok:
            continue
        if (
            isinstance(value, int)
            and not isinstance(value, bool)
            and (value > 0 or (zero_ok and value == 0))
        ):
            continue
        binding = f"t2t.runs.train.{name}" + (f" (the gin macro {macro})" if macro else "")
        wanted = "a non-negative int" if zero_ok else "a positive int"
        if none_ok:
            wanted += " or None"
        raise ValueError(
            f"{binding} must be {wanted}; got {value!r} "
            f"({type(value).__name__}). Example: --gin.{macro or binding}=100"
        )


def _data_metadata(provider, name: str, lengths: Mapping[str, int]) -> dict[str, Any]:
    """The data entries of the checkpoint metadata: task, lengths and vocabulary."""
    vocabulary = provider.output_features["targets"].vocabulary
    entry: dict[str, Any] = {"mixture_or_task": name, "task_feature_lengths": dict(lengths)}
    model_file = getattr(vocabulary, "sentencepiece_model_file", None)
    if model_file is not None:
        entry["vocabulary"] = {
            "sentencepiece_model_file": model_file,
            "extra_ids": vocabulary.extra_ids,
        }
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
    for key, flag in (
        ("mixture_or_task", "MIXTURE_OR_TASK"),
        ("batch_size", "BATCH_SIZE"),
        ("task_feature_lengths", "TASK_FEATURE_LENGTHS"),
    ):
        if key in saved and saved[key] != metadata[key]:
            raise ValueError(
                f"The checkpoints in {model_dir} were trained with {key} {saved[key]!r}; this "
                f"run has {metadata[key]!r}. A run resumes only with the data it was saved "
                f"with (the input pipeline's position is in the checkpoint): resume with "
                f"{flag}={saved[key]!r}, or give a new MODEL_DIR with "
                f"INIT_CHECKPOINT='{model_dir}' to start from its parameters."
            )


def write_run_files(
    model_dir: str, config: TransformerConfig, vocabulary_file: str | None = None
) -> None:
    """Writes `config.gin` (the operative gin config), `model_config.json` and a copy of the
    SentencePiece model, `spiece.model`, so the directory is self-contained (process 0)."""
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
