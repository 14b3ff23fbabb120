"""Ragged batches of token sequences: the unit the objectives compute on.

Every objective is a chain of per-example steps (chunk, concatenate, split, corrupt). Running them
one example at a time in a `tf.data` map costs a few dozen tiny TensorFlow ops per example; running
them on a `RaggedTensor` holding many sequences costs the same few dozen ops per *batch*. The steps
in `chunking`, `noise` and `objectives` are therefore written as functions of ragged batches
`[B, None]`, and the dataset-level preprocessors batch, apply, and unbatch with the helpers here.

Randomness stays stateless: `map_with_seed` hands each batch its own seed pair from seqio's seed
mechanism (`seqio.map_over_dataset(num_seeds=1)`), so `Task.get_dataset(seed=...)` reproduces the
same output and another seed gives another.
"""

from typing import Callable, Mapping

import seqio
import tensorflow as tf

# NOTE: 128 documents per batch is also the group size of the t5 package's `reduce_concat_tokens`,
# so the concatenation boundaries (and hence the statistics of the last, shorter segment of each
# group) are the same as in the paper's pipeline.
DOCUMENTS_PER_BATCH = 128

RaggedBatch = Mapping[str, tf.RaggedTensor]


def batch_sequences(dataset: tf.data.Dataset, feature_key: str, batch_size: int) -> tf.data.Dataset:
    """Groups consecutive sequences of `feature_key` into ragged batches.

    Other features are dropped: the objectives build their examples from one token feature. Empty
    sequences may appear in a batch; every step handles empty rows.

    Args:
        dataset: examples with a 1-D integer feature `feature_key`.
        feature_key: the feature to keep.
        batch_size: sequences per batch (the last batch may hold fewer).

    Returns:
        A dataset of `{feature_key: RaggedTensor [B, None]}`.
    """
    _check_feature(dataset, feature_key)

    def select(example):
        return {feature_key: example[feature_key]}

    def as_ragged(batch):
        tokens = batch[feature_key]
        if not isinstance(tokens, tf.RaggedTensor):
            tokens = tf.RaggedTensor.from_tensor(tokens)
        return {feature_key: tokens}

    # NOTE: `Dataset.batch` joins ragged and fixed-shape elements without a per-element map;
    # `ragged_batch` (needed for plain variable-length tensors) maps every element first, which
    # costs about as much as the objective itself. Sequences from `unbatch_sequences` (and from
    # this package's `tokenize`) are ragged, so chained preprocessors take the fast path.
    if all(is_batchable(spec) for spec in tf.nest.flatten(dataset.element_spec)):
        return map_batches(dataset.batch(batch_size), as_ragged)
    dataset = map_batches(dataset, select)
    return dataset.ragged_batch(batch_size)


def unbatch_sequences(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Splits ragged batches back into examples of 1-D sequences.

    The sequences keep a `RaggedTensorSpec` of ragged rank 0 in `element_spec`: functions mapped
    over the dataset receive ordinary `tf.Tensor`s, and a later `batch_sequences` batches them
    without a per-element map.
    """
    return dataset.unbatch()


def is_batchable(spec: tf.TypeSpec) -> bool:
    """Whether `Dataset.batch` can join elements of this spec (ragged, or a fixed shape)."""
    if isinstance(spec, tf.RaggedTensorSpec):
        return True
    return isinstance(spec, tf.TensorSpec) and spec.shape.is_fully_defined()


def map_with_seed(dataset: tf.data.Dataset, fn: Callable[..., RaggedBatch]) -> tf.data.Dataset:
    """Maps `fn(element, seed)` over `dataset`, seeds drawn through seqio's seed mechanism.

    Args:
        dataset: any dataset.
        fn: called as `fn(element, seed=seed)` with `seed` an int32 `[2]` tensor.

    Returns:
        The mapped dataset.
    """
    return seqio.map_over_dataset(_plain(fn), num_seeds=1)(dataset)


def map_batches(dataset: tf.data.Dataset, fn: Callable[..., RaggedBatch]) -> tf.data.Dataset:
    """Maps a deterministic `fn(element)` over `dataset` in parallel."""
    return dataset.map(_plain(fn), num_parallel_calls=tf.data.AUTOTUNE)


def _plain(fn: Callable[..., RaggedBatch]) -> Callable[..., RaggedBatch]:
    # NOTE: the batch functions hold no tensor-dependent Python control flow, so AutoGraph's
    # source conversion (about a second per pipeline) buys nothing; trace them as written.
    return tf.autograph.experimental.do_not_convert(fn)


def _check_feature(dataset: tf.data.Dataset, feature_key: str) -> None:
    spec = dataset.element_spec
    if not isinstance(spec, Mapping) or feature_key not in spec:
        keys = sorted(spec) if isinstance(spec, Mapping) else type(spec).__name__
        raise ValueError(
            f"expected examples with a tokenized {feature_key!r} feature, got features {keys}; "
            "tokenize the text first (seqio.preprocessors.tokenize or preprocessors.tokenize)"
        )
    if not spec[feature_key].dtype.is_integer or spec[feature_key].shape.rank != 1:
        raise ValueError(
            f"expected {feature_key!r} to be a 1-D integer token sequence, got "
            f"{spec[feature_key]}; tokenize the text first"
        )
