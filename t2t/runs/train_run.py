"""`t2t train`: the run function that wires a task, a network, an optimizer and a mesh into the
trainer, with the checks made before anything is built and the files a model directory keeps."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
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
        return _train(**{k: v for k, v in locals().items() if k not in ("partitioning", "lock")})


def _train(
    *,
    model_dir,
    mixture_or_task,
    task_feature_lengths,
    train_steps,
    model_config,
    batch_size,
    model_fn,
    optimizer,
    learning_rate,
    num_microbatches,
    mesh_shape,
    sharding_mode,
    pack,
    use_cached,
    max_train_examples,
    seed,
    log_every,
    checkpoint_every,
    keep_checkpoints,
    best_metrics,
    eval_every,
    eval_tasks,
    eval_split,
    eval_steps,
    evaluators,
    init_checkpoint,
    finetuning,
    early_stopping,
    reduce_on_plateau,
    num_predictions,
    async_checkpoints,
    progress,
) -> dict[str, Any]:
    """`train`'s body, run while holding the model directory's lock."""
    from t2t import partitioning
    from t2t.checkpoints.manager import BestMetric
    from t2t.data import batches, pipeline, registry
    from t2t.trainer import Trainer, predictions

    import_task_modules((), [mixture_or_task, *eval_tasks])
    use_carried_vocabulary(model_dir, init_checkpoint)
    config = resolve_model_config(model_config, init_checkpoint)
    model = model_fn(config)
    partitioner = partitioning.make_partitioner(*mesh_shape, mode=sharding_mode)
    shard_index, num_shards = partitioner.data_shard()
    data = dict(
        task_feature_lengths=dict(task_feature_lengths),
        global_batch_size=batch_size,
        architecture=config.architecture,
        feature_converter=model.feature_converter,
        pack=pack,
        use_cached=use_cached,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
    )
    train_config = pipeline.PipelineConfig(mixture_or_task, **data, max_examples=max_train_examples)
    train_data = pipeline.InputPipeline(train_config)
    metadata = _data_metadata(
        registry.get_task_or_mixture(mixture_or_task), mixture_or_task, task_feature_lengths
    )
    metadata["batch_size"] = batch_size
    _check_resumable(model_dir, metadata)
    subset = getattr(train_data, "subset", None)
    if subset is not None:
        metadata["train_subset"] = subset
    eval_configs = {
        name: pipeline.PipelineConfig(
            name, **{**data, "use_cached": False}, split=eval_split, shuffle=False, num_epochs=1
        )
        for name in eval_tasks
    }
    trainer = Trainer(
        model,
        optimizer(learning_rate=learning_rate),
        partitioner,
        model_dir,
        train_data,
        learning_rate=learning_rate,
        num_microbatches=num_microbatches,
        seed=seed,
        log_every=log_every,
        checkpoint_every=checkpoint_every,
        keep_checkpoints=keep_checkpoints,
        best_metrics=[BestMetric(k, v) for k, v in (best_metrics or {}).items()],
        eval_every=eval_every,
        eval_data={k: batches.eval_batches(c, eval_steps) for k, c in eval_configs.items()},
        evaluators=[make(model=model, partitioner=partitioner) for make in evaluators],
        metadata=metadata,
        init_checkpoint=init_checkpoint,
        finetuning=finetuning,
        early_stopping=early_stopping,
        reduce_on_plateau=reduce_on_plateau,
        async_checkpoints=async_checkpoints,
        progress=progress,
    )
    write_run_files(
        model_dir,
        config,
        vocabulary_file=metadata.get("vocabulary", {}).get("sentencepiece_model_file"),
    )
    try:
        summary = trainer.train(train_steps)
        chief = trainer.is_chief
        stopped = summary["stopped_early"]
        if chief and stopped is not None and summary["first_step"] == trainer.step:
            best = summary["best"].get("early_stopping", {})
            print(
                f"nothing to train: this run stopped early at step {stopped} (best "
                f"{early_stopping.metric if early_stopping else 'metric'} {best.get('value')} "
                f"at step {best.get('step')}). Give a new MODEL_DIR to train again.",
                flush=True,
            )
        elif chief and summary["first_step"] == trainer.step >= train_steps:
            print(
                f"nothing to train: the model directory is already at step {trainer.step}, the "
                "run's train_steps. Raise TRAIN_STEPS to go on, or give a new MODEL_DIR to "
                "start over.",
                flush=True,
            )
        shown = []
        if num_predictions:
            vocabulary = (
                registry.get_task_or_mixture(mixture_or_task).output_features["targets"].vocabulary
            )
            target = (
                eval_configs[eval_tasks[0]]
                if eval_tasks
                else dataclasses.replace(train_config, split=eval_split, max_examples=None)
            )
            shown = predictions.show_examples(
                model, trainer.params, partitioner, target, vocabulary, num_predictions
            )
            if chief:
                print(
                    f"\nGreedy predictions after step {trainer.step} "
                    f"({target.mixture_or_task}, {eval_split}):\n"
                    f"{predictions.format_predictions(shown)}",
                    flush=True,
                )
    finally:
        trainer.close()
    write_run_files(model_dir, config)  # now with everything the run used
    return {**summary, "predictions": shown}


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
