"""`t2t train`: the run function that wires a task, a network, an optimizer and a mesh into the
trainer, with the checks made before anything is built and the files a model directory keeps."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin
import jax
import optax

from t2t import files, hosts, models
from t2t.errors import UserError
from t2t.finetuning import FineTuning
from t2t.nn.config import TransformerConfig
from t2t.runs.externals import EXTERNALS
from t2t.runs.helpers import import_task_modules, resolve_model_config, use_carried_vocabulary
from t2t.trainer import options
from t2t.trainer.options import CheckpointOptions, DataOptions, EvalOptions, LoopOptions

# The option groups `train` builds from gin when not given, and where its former arguments went.
OPTION_GROUPS = (DataOptions, CheckpointOptions, EvalOptions, LoopOptions)
MOVED_OPTIONS = {
    "mixture_or_task": "t2t.runs.DataOptions.mixture_or_task",
    "task_feature_lengths": "t2t.runs.DataOptions.task_feature_lengths",
    "batch_size": "t2t.runs.DataOptions.batch_size",
    "pack": "t2t.runs.DataOptions.pack",
    "use_cached": "t2t.runs.DataOptions.use_cached",
    "max_train_examples": "t2t.runs.DataOptions.max_examples",
    "checkpoint_every": "t2t.runs.CheckpointOptions.every",
    "keep_checkpoints": "t2t.runs.CheckpointOptions.keep",
    "best_metrics": "t2t.runs.CheckpointOptions.best_metrics",
    "async_checkpoints": "t2t.runs.CheckpointOptions.async_save",
    "start_over": "t2t.runs.CheckpointOptions.start_over",
    "eval_every": "t2t.runs.EvalOptions.every",
    "eval_tasks": "t2t.runs.EvalOptions.tasks",
    "eval_split": "t2t.runs.EvalOptions.split",
    "eval_steps": "t2t.runs.EvalOptions.steps",
    "evaluators": "t2t.runs.EvalOptions.evaluators",
    "early_stopping": "t2t.runs.EvalOptions.early_stopping",
    "reduce_on_plateau": "t2t.runs.EvalOptions.reduce_on_plateau",
    "num_predictions": "t2t.runs.EvalOptions.num_predictions",
    "log_every": "t2t.runs.LoopOptions.log_every",
    "num_microbatches": "t2t.runs.LoopOptions.num_microbatches",
    "progress": "t2t.runs.LoopOptions.progress",
}


@gin.configurable(module="t2t.runs")
def train(
    *,
    model_dir: str = gin.REQUIRED,
    train_steps: int = gin.REQUIRED,
    data: DataOptions | None = None,
    checkpoints: CheckpointOptions | None = None,
    evaluation: EvalOptions | None = None,
    loop: LoopOptions | None = None,
    model_config: TransformerConfig | None = None,
    model_fn: Callable[..., models.BaseModel] = EXTERNALS["t2t.models.model_for"],
    optimizer: Callable[..., optax.GradientTransformation] = EXTERNALS["t2t.optim.adafactor"],
    learning_rate: optax.Schedule | float = 1e-3,
    mesh_shape: Sequence[int] = (-1, 1),
    sharding_mode: str = "tensor_parallel",
    seed: int = 0,
    init_checkpoint: str | None = None,
    init_optimizer_state: bool = False,
    finetuning: FineTuning | None = None,
    check_attention: bool = True,
) -> dict[str, Any]:
    """Trains a model and keeps its checkpoints, summaries and config in `model_dir`.

    Restarting with the same `model_dir` resumes from its latest checkpoint (the data continues
    where it stopped). With no checkpoint there, `init_checkpoint` (a HF T5 directory or another
    run's model directory) supplies the first parameters and the optimizer starts afresh.

    The data, checkpoint, evaluation and loop options are groups gin binds by field
    (`t2t.runs.DataOptions.batch_size = 32`, `t2t.runs.CheckpointOptions.every = 500`,
    `t2t.runs.LoopOptions.log_every = 10`; `t2t.trainer.options` documents every field); a
    group not given here is built from those bindings, and each goes whole to the trainer.

    Args:
      model_dir: the run's directory (local or any path Orbax and TensorFlow can write).
      train_steps: train until this many updates (counting restored ones; TRAIN_STEPS).
      data: the training data (`DataOptions`).
      checkpoints: when checkpoints are written and which are kept (`CheckpointOptions`).
      evaluation: what is evaluated, how often, and what acts on it (`EvalOptions`).
      loop: logging, gradient accumulation, the progress bar (`LoopOptions`).
      model_config: the network; None takes it from `init_checkpoint`.
      model_fn: builds the model wrapper from the config (`t2t.models.model_for`; bind its
        `z_loss` and `loss_normalizing_factor`).
      optimizer: called as `optimizer(learning_rate=...)` (`t2t.optim.adafactor`).
      learning_rate: a schedule (`@t2t.optim.inverse_sqrt()`) or a constant.
      mesh_shape: (data, model) mesh sizes, one may be -1.
      sharding_mode: `data_parallel`, `tensor_parallel` or `fsdp`.
      seed: seeds initialization, dropout, the data order and the data subset.
      init_checkpoint: where the first parameters come from: a HF T5 directory, a t2t model
        directory, or a released T5X, T5X-on-Orbax or Mesh TensorFlow checkpoint.
      init_optimizer_state: also take `init_checkpoint`'s Adafactor statistics and step (a
        released T5X or Mesh TensorFlow checkpoint), to continue its pretraining; the
        default starts the optimizer afresh at step 0.
      finetuning: what trains and how (`@t2t.finetuning.FineTuning()`; the files in
        gin/finetuning/ bind it for each method).
      check_attention: before training, run each attention site that this platform puts on a
        fused kernel (cuDNN, Pallas flash) once at the run's lengths against the float32 formula
        on this device, and stop if it is off (`t2t.nn.attention_check`); nothing runs where
        every site is on XLA (CPUs).

    Returns:
      The trainer's summary (steps, first and last loss, compile time, eval results) and the
      printed predictions.
    """
    from t2t import partitioning, provenance
    from t2t.checkpoints import lock
    from t2t.data import batches, pipeline
    from t2t.trainer import Trainer

    data, checkpoints, evaluation, loop = _groups(data, checkpoints, evaluation, loop)
    options.check_count(
        "t2t.runs.train.train_steps", train_steps, options.Count.POSITIVE, "TRAIN_STEPS"
    )
    partitioning.initialize_distributed()
    _check_learning_rate(learning_rate, train_steps)
    with lock.hold(model_dir):  # one writer per model directory; fails fast when held
        import_task_modules((), [data.mixture_or_task, *evaluation.tasks])
        use_carried_vocabulary(model_dir, init_checkpoint)
        config = resolve_model_config(model_config, init_checkpoint)
        _check_vocabularies(config, data, evaluation, None if model_config else init_checkpoint)
        model = model_fn(config)
        partitioner = partitioning.make_partitioner(*mesh_shape, mode=sharding_mode)
        _announce_network(config, partitioner, data, check_attention)
        train_config, eval_configs = _data_configs(data, evaluation, seed, model, partitioner)
        train_data = pipeline.InputPipeline(train_config)
        metadata = _run_metadata(model_dir, data, train_data)
        trainer = Trainer.create(
            model,
            optimizer(learning_rate=learning_rate),
            partitioner,
            model_dir,
            train_data,
            checkpoints=checkpoints,
            evaluation=evaluation,
            loop=loop,
            init_checkpoint=init_checkpoint,
            init_optimizer_state=init_optimizer_state,
            finetuning=finetuning,
            eval_data={
                k: batches.eval_batches(c, evaluation.steps) for k, c in eval_configs.items()
            },
            metadata=metadata,
            learning_rate=learning_rate,
            seed=seed,
        )
        vocabulary_file = metadata.get("vocabulary", {}).get("sentencepiece_model_file")
        write_run_files(model_dir, config, vocabulary_file=vocabulary_file)
        provenance.record(model_dir, trainer.step)
        try:
            summary = trainer.train(train_steps)
            if trainer.is_chief:
                _say_if_nothing_was_trained(summary, trainer.step, train_steps, evaluation)
            target = _prediction_data(train_config, eval_configs, evaluation)
            shown = _show_predictions(model, trainer, partitioner, target, evaluation)
        finally:
            trainer.close()
        write_run_files(model_dir, config)  # now with everything the run used
    hosts.finished()  # the other hosts' watchdogs see this process end on purpose
    return {**summary, "predictions": shown}


def _groups(data, checkpoints, evaluation, loop):
    """The option groups, each one not given built from its gin bindings."""
    return (
        data or EXTERNALS["t2t.runs.DataOptions"](),
        checkpoints or EXTERNALS["t2t.runs.CheckpointOptions"](),
        evaluation or EXTERNALS["t2t.runs.EvalOptions"](),
        loop or EXTERNALS["t2t.runs.LoopOptions"](),
    )


def _check_learning_rate(rate: optax.Schedule | float, train_steps: int) -> None:
    """A constant must be positive; a schedule must give finite, non-negative rates at the
    first and the last step (a negative rate climbs the loss, and nothing else would say so).
    Evaluating a schedule runs JAX, so this comes after `jax.distributed.initialize` (and
    before the model directory is made)."""
    example = "e.g. --gin.t2t.runs.train.learning_rate=1e-3 or @t2t.optim.inverse_sqrt()"
    if callable(rate):
        for step in (0, train_steps):
            value = float(rate(step))
            if not math.isfinite(value) or value < 0:
                raise UserError(
                    f"t2t.runs.train.learning_rate is a schedule whose rate at step {step} is "
                    f"{value}; it must be finite and non-negative ({example})."
                )
        return
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 < rate < math.inf:
        raise UserError(
            f"t2t.runs.train.learning_rate must be a positive number or a schedule; got "
            f"{rate!r} ({type(rate).__name__}), {example}."
        )


def _check_vocabularies(
    config: TransformerConfig,
    data: DataOptions,
    evaluation: EvalOptions,
    network_from: str | None,
) -> None:
    """Before any data is read: the training and evaluation tasks can be read offline, and the
    model's embedding has a row for every id their vocabularies produce. `network_from`: the
    checkpoint the network came from (None: the run configured it)."""
    from t2t.data import registry

    if network_from is None:
        fix = (
            "Give the model at least that many (gin: t2t.nn.get_preset.vocab_size = N, a "
            "multiple of 128 is fastest) or train on tasks tokenized with a smaller vocabulary."
        )
    else:
        fix = (
            f"The network comes from {network_from}: train on tasks tokenized with the "
            "vocabulary it was trained with (its model directory carries it as spiece.model)."
        )
    names = [data.mixture_or_task, *evaluation.tasks]
    for position, name in enumerate(names):
        provider = registry.get_task_or_mixture(name)
        registry.check_ready(provider, use_cached=data.use_cached and position == 0)
        registry.check_vocabulary_fits(provider, config.vocab_size, fix=fix)


def _announce_network(
    config: TransformerConfig, partitioner, data: DataOptions, check_attention: bool
) -> None:
    """Prints what the step computes in and how attention runs on these devices; with
    `check_attention`, stops the run before its data is read if a fused attention kernel it
    would train on computes something else than the formula on this device
    (`t2t.nn.attention_check`)."""
    from t2t.nn import attention_check, attention_ops

    platform = partitioner.mesh.devices.flat[0].platform
    lengths = data.task_feature_lengths
    lengths = (lengths.get("inputs", 0), lengths.get("targets", 0))
    if jax.process_index() == 0:
        print(
            f"compute {config.dtype}, parameters {config.param_dtype}; "
            + attention_ops.summary(config, platform, lengths=lengths),
            flush=True,
        )
    if check_attention:
        results = attention_check.check(config, platform, lengths, packed=data.pack)
        if results and jax.process_index() == 0:
            print(attention_check.report(results), flush=True)


def _data_configs(data: DataOptions, evaluation: EvalOptions, seed: int, model, partitioner):
    """The pipeline of the training data and one per eval task, this host's shard of each."""
    from t2t.data import pipeline

    shard_index, num_shards = partitioner.data_shard()
    common = dict(
        task_feature_lengths=dict(data.task_feature_lengths),
        global_batch_size=data.batch_size,
        architecture=model.config.architecture,
        feature_converter=model.feature_converter,
        pack=data.pack,
        seed=seed,
        shard_index=shard_index,
        num_shards=num_shards,
    )
    train_config = pipeline.PipelineConfig(
        data.mixture_or_task, **common, use_cached=data.use_cached, max_examples=data.max_examples
    )
    eval_configs = {
        name: pipeline.PipelineConfig(
            name, **common, split=evaluation.split, shuffle=False, num_epochs=1
        )
        for name in evaluation.tasks
    }
    return train_config, eval_configs


def _run_metadata(model_dir: str, data: DataOptions, train_data) -> dict[str, Any]:
    """The checkpoints' metadata of the run's data, refused when the model directory's
    checkpoints were trained on other data."""
    from t2t.data import registry

    provider = registry.get_task_or_mixture(data.mixture_or_task)
    metadata = _data_metadata(provider, data.mixture_or_task, data.task_feature_lengths)
    metadata["batch_size"] = data.batch_size
    _check_resumable(model_dir, metadata)
    subset = getattr(train_data, "subset", None)
    if subset is not None:
        metadata["train_subset"] = subset
    return metadata


def _say_if_nothing_was_trained(
    summary: Mapping[str, Any], step: int, train_steps: int, evaluation: EvalOptions
) -> None:
    """Tells why a run that trained no step did not (it had stopped early, or was done)."""
    stopped = summary["stopped_early"]
    if stopped is not None and summary["first_step"] == step:
        best = summary["best"].get("early_stopping", {})
        stopping = evaluation.early_stopping
        metric = stopping.metric if stopping else "metric"
        print(
            f"nothing to train: this run stopped early at step {stopped} (best {metric} "
            f"{best.get('value')} at step {best.get('step')}). Give a new MODEL_DIR to train "
            "again.",
            flush=True,
        )
    elif summary["first_step"] == step >= train_steps:
        print(
            f"nothing to train: the model directory is already at step {step}, the run's "
            "train_steps. Raise TRAIN_STEPS to go on, or give a new MODEL_DIR to start over.",
            flush=True,
        )


def _prediction_data(train_config, eval_configs, evaluation: EvalOptions):
    """The data whose predictions are shown after training: the first evaluated task's, else
    the training mixture's evaluation split."""
    if evaluation.tasks:
        return eval_configs[evaluation.tasks[0]]
    return dataclasses.replace(train_config, split=evaluation.split, max_examples=None)


def _show_predictions(model, trainer, partitioner, target, evaluation: EvalOptions) -> list:
    """Greedy predictions of the first `evaluation.num_predictions` examples of `target`
    (printed by process 0); none when `num_predictions` is 0."""
    from t2t.data import registry
    from t2t.trainer import predictions

    if not evaluation.num_predictions:
        return []
    provider = registry.get_task_or_mixture(target.mixture_or_task)
    vocabulary = provider.output_features["targets"].vocabulary
    shown = predictions.show_examples(
        model, trainer.params, partitioner, target, vocabulary, evaluation.num_predictions
    )
    if trainer.is_chief:
        print(
            f"\nGreedy predictions after step {trainer.step} ({target.mixture_or_task}, "
            f"{evaluation.split}):\n{predictions.format_predictions(shown)}",
            flush=True,
        )
    return shown


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

    directory = files.join(model_dir, CHECKPOINTS_SUBDIR)
    if not files.isdir(directory):
        return
    saved = None
    for step in sorted((int(n) for n in files.listdir(directory) if n.isdigit()), reverse=True):
        try:
            saved = json.loads(
                files.read_text(files.join(directory, str(step), "metadata", "metadata"))
            )
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
    from t2t.checkpoints import model_dir as model_dir_lib

    if jax.process_index() != 0:
        return
    files.makedirs(model_dir)
    files.write_text(files.join(model_dir, model_dir_lib.CONFIG_GIN), gin.operative_config_str())
    files.write_text(
        files.join(model_dir, model_dir_lib.MODEL_CONFIG_JSON),
        json.dumps(dataclasses.asdict(config), indent=2, sort_keys=True),
    )
    copy = files.join(model_dir, model_dir_lib.VOCABULARY_FILE)
    if vocabulary_file and files.absolute(vocabulary_file) != files.absolute(copy):
        files.copy(vocabulary_file, copy)  # replaced whole: never a half-written tokenizer
