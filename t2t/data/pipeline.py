"""The per-host input pipeline: task or mixture -> feature conversion -> batches of numpy arrays.

Each host reads its own shard of the data (`seqio.ShardInfo(index, num_shards)`), so a global
batch of B rows is assembled from B / num_shards rows per host. The pipeline is deterministic
given a seed, and its position can be saved and restored exactly with tf.data's iterator
checkpointing (`tf.train.Checkpoint(iterator=...)`), which records the state of every stage
(shuffle buffers, mixture sampling, packing, prefetch), so a resumed run sees exactly the
batches an uninterrupted run would have. TensorFlow is kept off the accelerators.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

import numpy as np
import seqio

from t2t import files
from t2t.data import features, registry, subsample, tf_setup

_CHECKPOINT_NAME = "data_iterator"
# A capped task's kept examples are held in memory after the first epoch (tf.data's cache), up
# to this many: every later epoch reads them from there instead of running the task's whole
# split through its preprocessors again to keep a few (Table 9's pretraining on 32 examples of the
# built-in corpus: 0.93 -> about 0.4 s a step, as on the full corpus; studies/results/builtin_tiny/
# data_size/RUN.md; the same batches). tf.data writes the cache into every saved
# iterator position, so a larger subset is read again each epoch, as before.
CACHE_SUBSET_AT_MOST = 10_000


@dataclasses.dataclass(frozen=True)
class PipelineConfig:
    """What to read and how to batch it.

    Attributes:
      mixture_or_task: a registered task or mixture name.
      task_feature_lengths: lengths of the task features, e.g. {"inputs": 512, "targets": 114}.
      global_batch_size: rows per step over all hosts (split evenly between them).
      architecture: one of `features.ARCHITECTURES`; picks the feature converter when
        `feature_converter` is None (data-only uses: tests, benchmarks).
      split: the data split.
      seed: seeds shuffling, mixture sampling and random preprocessors (None: nondeterministic).
      shuffle: shuffle the data (training).
      num_epochs: passes over the data; None repeats forever (training).
      pack: pack several examples per row.
      use_cached: read the seqio cache of the tasks instead of preprocessing on the fly.
      shard_index: this host's index (`jax.process_index()`).
      num_shards: number of hosts reading disjoint shards (`jax.process_count()`).
      max_examples: train on at most this many examples of the task, a subset chosen by `seed`
        (`t2t.data.subsample`); None: all of them.
      feature_converter: the model's converter factory, `model.feature_converter`
        (`(pack=..., has_inputs=...) -> seqio.FeatureConverter`): runs pass it, so the model
        wrapper decides which features its batches have.
    """

    mixture_or_task: str
    task_feature_lengths: Mapping[str, int]
    global_batch_size: int
    architecture: str = "encoder_decoder"
    split: str = "train"
    seed: int | None = 0
    shuffle: bool = True
    num_epochs: int | None = None
    pack: bool = True
    use_cached: bool = False
    shard_index: int = 0
    num_shards: int = 1
    max_examples: int | None = None
    feature_converter: Callable[..., seqio.FeatureConverter] | None = dataclasses.field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self):
        if not 0 <= self.shard_index < self.num_shards:
            raise ValueError(
                f"shard_index must be in [0, num_shards={self.num_shards}), got {self.shard_index}."
            )
        if self.global_batch_size <= 0 or self.global_batch_size % self.num_shards:
            raise ValueError(
                f"global_batch_size ({self.global_batch_size}) must be a positive multiple of the "
                f"number of shards ({self.num_shards}) so every host reads the same number of rows."
            )

    @property
    def per_host_batch_size(self) -> int:
        return self.global_batch_size // self.num_shards


def build_dataset(config: PipelineConfig):
    """The batched `tf.data.Dataset` of model features for this host.

    Returns:
      a dataset of dicts of int32 tensors shaped [per_host_batch_size, length]; the last partial
      batch is dropped when the data repeats forever and kept otherwise.
    """
    return build_dataset_and_subset(config)[0]


def check_readable(config: PipelineConfig):
    """The task or mixture of `config`, checked readable offline with its lengths (what
    `build_dataset` checks first, without building the tf.data graph); returns (provider,
    lengths)."""
    provider = registry.get_task_or_mixture(config.mixture_or_task)
    registry.check_ready(provider, use_cached=config.use_cached)
    return provider, _lengths_for(provider, config.task_feature_lengths)


def build_dataset_and_subset(config: PipelineConfig, cache_subset: bool = True):
    """`build_dataset`, and the description of the subset kept (None without `max_examples`).

    `cache_subset=False` builds a capped task's graph without the cache of its kept examples
    (`CACHE_SUBSET_AT_MOST`), as t2t built it before 2026-11-30: iterator positions saved then
    restore only into that graph (`InputPipeline.restore`)."""
    tf_setup.hide_accelerators_from_tensorflow()
    import tensorflow as tf

    provider, lengths = check_readable(config)
    has_inputs = features.task_has_inputs(provider)
    # seqio's Task.get_dataset has trimmed the examples to `lengths` already; no trim stage, so
    # the tf.data graph (and the iterator positions saved with checkpoints) stays as it was.
    if config.feature_converter is not None:
        converter = config.feature_converter(pack=config.pack, has_inputs=has_inputs, trim=False)
    else:
        converter = features.feature_converter(
            config.architecture, has_inputs=has_inputs, pack=config.pack, trim=False
        )
    subset = None
    if config.max_examples is not None:
        dataset, subset = _capped(provider, lengths, converter, config, cache_subset)
    else:
        dataset = _full(provider, lengths, converter, config)
    options = tf.data.Options()
    options.deterministic = True
    # No autotuning model. Its thread sleeps up to a minute between rounds once a pipeline has
    # run a while, and dropping an iterator whose position was saved waited for it: 38 s at the
    # end of 100 demo steps, of every training run and study stage
    # (benchmarks/input_pipeline_teardown.py). Without it, maps given AUTOTUNE run one call per
    # core: the same batches, the same step time.
    options.autotune.enabled = False
    dataset = dataset.with_options(options)
    dataset = dataset.batch(config.per_host_batch_size, drop_remainder=config.num_epochs is None)
    return dataset.prefetch(tf.data.AUTOTUNE), subset


def _full(provider, lengths, converter, config: PipelineConfig):
    return seqio.get_dataset(
        mixture_or_task_name=provider,
        task_feature_lengths=lengths,
        dataset_split=config.split,
        shuffle=config.shuffle,
        num_epochs=config.num_epochs,
        feature_converter=converter,
        shard_info=seqio.ShardInfo(config.shard_index, config.num_shards),
        use_cached=config.use_cached,
        seed=config.seed,
    )


def _capped(provider, lengths, converter, config: PipelineConfig, cache: bool):
    """The task's split read in order, cut to the seed's subset (held in memory when small and
    `cache`), then sharded, shuffled, repeated and converted as `seqio.get_dataset` would."""
    if not isinstance(provider, seqio.Task):
        raise ValueError(
            f"max_train_examples caps a task, and {provider.name!r} is a mixture. Cap its "
            "tasks instead (register a mixture of tasks you train capped one by one), or train "
            "on one task."
        )
    seed = 0 if config.seed is None else config.seed
    dataset = provider.get_dataset(
        lengths,
        split=config.split,
        use_cached=config.use_cached,
        shuffle=False,
        num_epochs=1,
        seed=seed,
    )
    dataset, subset = subsample.subsample(dataset, config.max_examples, seed)
    if cache and subset["examples_kept"] <= CACHE_SUBSET_AT_MOST:
        # The elements are those of a re-read: the preprocessors' random seeds restart with
        # every epoch of the graph below (tests/data/test_subsample.py checks the batches equal).
        dataset = dataset.cache()
    dataset = dataset.shard(config.num_shards, config.shard_index)
    if config.shuffle:
        dataset = dataset.shuffle(subset["examples_kept"], seed=seed, reshuffle_each_iteration=True)
    dataset = dataset.repeat(config.num_epochs)
    return converter(dataset, task_feature_lengths=lengths), subset


def _lengths_for(provider, task_feature_lengths: Mapping[str, int]) -> dict[str, int]:
    """The lengths of the features `provider` has (a targets-only task ignores an inputs length)."""
    missing = sorted(set(provider.output_features) - set(task_feature_lengths))
    if missing:
        raise ValueError(
            f"{provider.name!r} has features {sorted(provider.output_features)} but "
            f"task_feature_lengths {dict(task_feature_lengths)} gives no length for {missing}."
        )
    return {k: v for k, v in task_feature_lengths.items() if k in provider.output_features}


class InputPipeline:
    """An iterator of numpy batches whose position can be saved and restored.

    Example:
      pipeline = InputPipeline(PipelineConfig("builtin_span_corruption", {"inputs": 128,
                               "targets": 32}, global_batch_size=8))
      batch = next(pipeline)          # {"encoder_input_tokens": int32 [8, 128], ...}
      pipeline.save(checkpoint_dir)   # after step n
      resumed = InputPipeline(same_config); resumed.restore(checkpoint_dir)
      next(resumed)                   # == the batch an uninterrupted run reads at step n + 1
    """

    def __init__(self, config: PipelineConfig):
        import tensorflow as tf

        self.config = config
        self.dataset, self.subset = build_dataset_and_subset(config)
        self._iterator = iter(self.dataset)
        self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        batch = next(self._iterator)
        return {name: value.numpy() for name, value in batch.items()}

    @property
    def element_spec(self) -> dict:
        return self.dataset.element_spec

    def save(self, directory: str) -> str:
        """Writes the iterator state under `directory`; returns the checkpoint prefix."""
        files.makedirs(directory)
        return self._checkpoint.write(files.join(directory, _CHECKPOINT_NAME))

    def restore(self, directory: str) -> None:
        """Moves this (fresh) pipeline to the position saved by `save(directory)`.

        Raises:
          ValueError: when `directory` holds no saved data iterator.
        """
        prefix = files.join(directory, _CHECKPOINT_NAME)
        if not files.exists(prefix + ".index"):
            raise ValueError(
                f"No data iterator state in {directory!r} (expected {prefix}.index, written by "
                "InputPipeline.save). Restore from the directory given to save()."
            )
        import tensorflow as tf

        try:
            self._checkpoint.read(prefix).assert_consumed()
        except tf.errors.NotFoundError:
            if self.config.max_examples is None:
                raise
            # A position saved before capped subsets were cached: the graph it was saved from.
            self.dataset, self.subset = build_dataset_and_subset(self.config, cache_subset=False)
            self._iterator = iter(self.dataset)
            self._checkpoint = tf.train.Checkpoint(iterator=self._iterator)
            self._checkpoint.read(prefix).assert_consumed()
