"""Chunking: from tokenized documents to fixed-length raw segments, the input of every objective.

The paper's unsupervised pipeline (docs/spec.md section 4) takes one random chunk of at most 65536
tokens per document, concatenates documents with no separator, and splits the stream into segments
of the raw length an objective needs. Each step exists twice:

- as a function of a ragged batch (`random_chunks`, `concatenate_rows`, `split_rows`) and a
  batch-level dataset stage (`chunk_batches`, `concat_batches`, `split_batches`), which the
  objectives chain without leaving the batched form;
- as a per-example seqio preprocessor (`select_random_chunk`, `reduce_concat_tokens`,
  `split_tokens`, `split_tokens_to_inputs_length`, `split_tokens_to_targets_length`).
"""

from typing import Mapping

import seqio
import tensorflow as tf

from preprocessors import batching

MAX_CHUNK_LENGTH = 65536


# ---------------------------------------------------------------------------- ragged-batch steps


def random_chunks(tokens: tf.RaggedTensor, max_length: int, seed: tf.Tensor) -> tf.RaggedTensor:
    """Keeps one random chunk of at most `max_length` tokens per row.

    A row of n tokens is cut into ceil(n / max_length) aligned chunks (the last may be shorter) and
    one is picked uniformly; rows of at most `max_length` tokens are kept whole.

    Example: rows [[1 2 3 4 5], [6 7]], max_length 2 -> e.g. [[3 4], [6 7]] (or [[1 2]] / [[5]]
    for the first row).

    Args:
        tokens: int `[B, None]` token rows.
        max_length: the longest chunk kept.
        seed: int32 `[2]` stateless seed.

    Returns:
        int `[B, None]`, each row a contiguous piece of the input row.
    """
    lengths = tokens.row_lengths()
    num_chunks = (lengths + max_length - 1) // max_length
    uniform = tf.random.stateless_uniform(tf.shape(lengths), seed, dtype=tf.float64)
    chunk = tf.cast(uniform * tf.cast(num_chunks, tf.float64), tf.int64)
    chunk = tf.maximum(tf.minimum(chunk, num_chunks - 1), 0)  # empty rows stay empty
    starts = chunk * max_length
    stops = tf.minimum(starts + max_length, lengths)
    offsets = tf.ragged.range(starts, stops)  # [B, None] positions within each row
    return tf.gather(tokens.values, offsets + tf.expand_dims(tokens.row_starts(), 1))


def concatenate_rows(tokens: tf.RaggedTensor) -> tf.RaggedTensor:
    """Joins all rows into one, with no separator.

    Example: [[1 2], [3], [4 5 6]] -> [[1 2 3 4 5 6]].

    Args:
        tokens: int `[B, None]`.

    Returns:
        int `[1, None]`.
    """
    values = tokens.values
    return tf.RaggedTensor.from_row_lengths(values, tf.expand_dims(tf.size(values, tf.int64), 0))


def split_rows(tokens: tf.RaggedTensor, segment_length: int) -> tf.RaggedTensor:
    """Cuts every row into consecutive segments of `segment_length` (the last may be shorter).

    Example: [[1 2 3 4 5], [6 7]] with segment_length 2 -> [[1 2], [3 4], [5], [6 7]].

    Args:
        tokens: int `[B, None]`.
        segment_length: tokens per segment.

    Returns:
        int `[S, None]` with S = sum of ceil(row length / segment_length).
    """
    lengths = tokens.row_lengths()
    num_segments = (lengths + segment_length - 1) // segment_length
    segment_starts = tf.ragged.range(num_segments) * segment_length  # [B, None]
    segment_lengths = tf.minimum(segment_length, tf.expand_dims(lengths, 1) - segment_starts)
    return tf.RaggedTensor.from_row_lengths(tokens.values, segment_lengths.values)


# ----------------------------------------------------------------------- batch-level datasets


def chunk_batches(batches: tf.data.Dataset, feature_key: str, max_length: int) -> tf.data.Dataset:
    """`random_chunks` over a dataset of ragged batches, seeded per batch; drops empty rows."""
    _check_positive("max_length", max_length)

    def chunk(batch, seed):
        tokens = batch[feature_key]
        tokens = tf.ragged.boolean_mask(tokens, tokens.row_lengths() > 0)
        return {feature_key: random_chunks(tokens, max_length, seed)}

    return batching.map_with_seed(batches, chunk)


def concat_batches(batches: tf.data.Dataset, feature_key: str) -> tf.data.Dataset:
    """`concatenate_rows` over a dataset of ragged batches."""
    return batching.map_batches(batches, lambda b: {feature_key: concatenate_rows(b[feature_key])})


def split_batches(
    batches: tf.data.Dataset, feature_key: str, segment_length: int
) -> tf.data.Dataset:
    """`split_rows` over a dataset of ragged batches."""
    _check_positive("segment_length", segment_length)
    return batching.map_batches(
        batches, lambda b: {feature_key: split_rows(b[feature_key], segment_length)}
    )


# ------------------------------------------------------------------- per-example preprocessors


def select_random_chunk(
    dataset: tf.data.Dataset,
    max_length: int = MAX_CHUNK_LENGTH,
    feature_key: str = "targets",
    batch_size: int = batching.DOCUMENTS_PER_BATCH,
) -> tf.data.Dataset:
    """Keeps one random chunk of at most `max_length` tokens per document (see `random_chunks`).

    Empty documents are dropped, and so are features other than `feature_key`.

    Example: {"targets": [1 2 3 4 5]}, max_length 2 -> {"targets": [3 4]} (or [1 2], or [5]).

    Args:
        dataset: examples with a 1-D integer feature `feature_key`.
        max_length: the longest chunk kept (the paper: 65536).
        feature_key: the token feature.
        batch_size: documents processed together (affects speed only).

    Returns:
        A dataset of `{feature_key: [None]}`.
    """
    batches = batching.batch_sequences(dataset, feature_key, batch_size)
    return batching.unbatch_sequences(chunk_batches(batches, feature_key, max_length))


def reduce_concat_tokens(
    dataset: tf.data.Dataset,
    feature_key: str = "targets",
    batch_size: int = batching.DOCUMENTS_PER_BATCH,
) -> tf.data.Dataset:
    """Concatenates each group of `batch_size` consecutive documents, with no separator.

    Example: [1 2], [3], [4 5 6] with batch_size 2 -> [1 2 3], [4 5 6].

    Args:
        dataset: examples with a 1-D integer feature `feature_key`.
        feature_key: the token feature; other features are dropped.
        batch_size: documents per concatenation.

    Returns:
        A dataset of `{feature_key: [None]}`.
    """
    batches = batching.batch_sequences(dataset, feature_key, batch_size)
    return batching.unbatch_sequences(concat_batches(batches, feature_key))


def split_tokens(
    dataset: tf.data.Dataset,
    max_tokens_per_segment: int,
    feature_key: str = "targets",
    batch_size: int = batching.DOCUMENTS_PER_BATCH,
) -> tf.data.Dataset:
    """Splits every sequence into segments of `max_tokens_per_segment` (the last may be shorter).

    Example: [1 2 3 4 5], [6 7] with max_tokens_per_segment 2 -> [1 2], [3 4], [5], [6 7].

    Args:
        dataset: examples with a 1-D integer feature `feature_key`.
        max_tokens_per_segment: tokens per segment.
        feature_key: the token feature; other features are dropped.
        batch_size: sequences processed together (affects speed only).

    Returns:
        A dataset of `{feature_key: [None]}`.
    """
    batches = batching.batch_sequences(dataset, feature_key, batch_size)
    return batching.unbatch_sequences(split_batches(batches, feature_key, max_tokens_per_segment))


def split_tokens_to_inputs_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    feature_key: str = "targets",
) -> tf.data.Dataset:
    """`split_tokens` into segments that fill `sequence_length['inputs']`, leaving room for EOS."""
    length = length_leaving_room_for_eos("inputs", sequence_length, output_features)
    return split_tokens(dataset, length, feature_key=feature_key)


def split_tokens_to_targets_length(
    dataset: tf.data.Dataset,
    sequence_length: Mapping[str, int],
    output_features: Mapping[str, seqio.Feature],
    feature_key: str = "targets",
) -> tf.data.Dataset:
    """`split_tokens` into segments that fill `sequence_length['targets']`, leaving room for EOS."""
    length = length_leaving_room_for_eos("targets", sequence_length, output_features)
    return split_tokens(dataset, length, feature_key=feature_key)


def length_leaving_room_for_eos(
    key: str, sequence_length: Mapping[str, int], output_features: Mapping[str, seqio.Feature]
) -> int:
    """`sequence_length[key]`, less one when the feature appends EOS. Example: 512 -> 511."""
    if sequence_length is None or sequence_length.get(key) is None:
        raise ValueError(
            f"this preprocessor needs sequence_length[{key!r}], got {sequence_length}; pass "
            f"sequence_length={{{key!r}: ...}} to Task.get_dataset"
        )
    length = sequence_length[key]
    if key in output_features and output_features[key].add_eos:
        length -= 1
    _check_positive(f"sequence_length[{key!r}] minus EOS", length)
    return length


def _check_positive(name: str, value: int) -> None:
    if int(value) < 1:
        raise ValueError(f"{name} must be a positive number of tokens, got {value}")
