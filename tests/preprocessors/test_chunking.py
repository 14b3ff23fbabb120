"""Chunking steps: random chunk per document, concatenation, fixed-length segments."""

import collections

import pytest
import seqio
import tensorflow as tf

from preprocessors import batching, chunking

SEED = tf.constant([5, 9], tf.int32)


def _rows(ragged):
    return ragged.to_list()


# ----------------------------------------------------------------------- ragged-batch steps


def test_random_chunks_docstring_example():
    tokens = tf.ragged.constant([[1, 2, 3, 4, 5], [6, 7]])
    first, second = _rows(chunking.random_chunks(tokens, 2, SEED))
    assert first in ([1, 2], [3, 4], [5]) and second == [6, 7]


def test_random_chunks_picks_each_aligned_chunk_uniformly():
    tokens = tf.ragged.constant([[1, 2, 3, 4, 5]] * 3000)
    chunks = collections.Counter(tuple(r) for r in _rows(chunking.random_chunks(tokens, 2, SEED)))
    assert set(chunks) == {(1, 2), (3, 4), (5,)}
    assert all(900 <= c <= 1100 for c in chunks.values()), chunks  # expected 1000, sd ~26


def test_concatenate_rows_docstring_example():
    tokens = tf.ragged.constant([[1, 2], [3], [4, 5, 6]])
    assert _rows(chunking.concatenate_rows(tokens)) == [[1, 2, 3, 4, 5, 6]]


def test_split_rows_docstring_example():
    tokens = tf.ragged.constant([[1, 2, 3, 4, 5], [6, 7]])
    assert _rows(chunking.split_rows(tokens, 2)) == [[1, 2], [3, 4], [5], [6, 7]]


def test_split_rows_drops_empty_rows():
    tokens = tf.ragged.constant([[], [1, 2, 3]], dtype=tf.int32)
    assert _rows(chunking.split_rows(tokens, 2)) == [[1, 2], [3]]


# ------------------------------------------------------------------- per-example preprocessors


def test_select_random_chunk_docstring_example(token_dataset, as_lists):
    out = as_lists(chunking.select_random_chunk(token_dataset([[1, 2, 3, 4, 5]]), max_length=2))
    assert out in ([{"targets": [1, 2]}], [{"targets": [3, 4]}], [{"targets": [5]}])


def test_select_random_chunk_keeps_short_documents_whole_and_drops_empty(token_dataset, as_lists):
    docs = [[7, 8, 9], [], [10]]
    out = as_lists(chunking.select_random_chunk(token_dataset(docs)))
    assert out == [{"targets": [7, 8, 9]}, {"targets": [10]}]


def test_select_random_chunk_same_seed_same_chunks(token_dataset, as_lists):
    docs = [list(range(3, 103))] * 40

    def run(seed):
        with seqio.map_seed_manager(seed):
            return as_lists(chunking.select_random_chunk(token_dataset(docs), max_length=10))

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_reduce_concat_tokens_docstring_example(token_dataset, as_lists):
    out = as_lists(
        chunking.reduce_concat_tokens(token_dataset([[1, 2], [3], [4, 5, 6]]), batch_size=2)
    )
    assert out == [{"targets": [1, 2, 3]}, {"targets": [4, 5, 6]}]


def test_split_tokens_docstring_example(token_dataset, as_lists):
    out = as_lists(chunking.split_tokens(token_dataset([[1, 2, 3, 4, 5], [6, 7]]), 2))
    assert out == [{"targets": s} for s in ([1, 2], [3, 4], [5], [6, 7])]


def test_split_tokens_to_lengths_leave_room_for_eos(token_dataset, as_lists, features32100):
    docs = [list(range(10, 17))]
    by_inputs = chunking.split_tokens_to_inputs_length(
        token_dataset(docs),
        sequence_length={"inputs": 4, "targets": 3},
        output_features=features32100,
    )
    by_targets = chunking.split_tokens_to_targets_length(
        token_dataset(docs),
        sequence_length={"inputs": 4, "targets": 3},
        output_features=features32100,
    )
    assert [e["targets"] for e in as_lists(by_inputs)] == [[10, 11, 12], [13, 14, 15], [16]]
    assert [e["targets"] for e in as_lists(by_targets)] == [[10, 11], [12, 13], [14, 15], [16]]


def test_chained_steps_take_the_batched_fast_path_with_the_same_result(
    token_dataset, as_lists, monkeypatch
):
    docs = [[1, 2, 3], [4], [5, 6, 7, 8, 9]]
    mapped = []  # the batch functions batch_sequences maps: `select` (slow), `as_ragged` (fast)
    original = batching.map_batches
    monkeypatch.setattr(
        batching, "map_batches", lambda d, fn: mapped.append(fn.__name__) or original(d, fn)
    )

    plain = chunking.split_tokens(token_dataset(docs), 2)  # variable-length TensorSpec input
    assert mapped[0] == "select"  # a per-element map, then ragged_batch
    concatenated = chunking.reduce_concat_tokens(token_dataset(docs))
    assert isinstance(concatenated.element_spec["targets"], tf.RaggedTensorSpec)
    del mapped[:]
    chained = chunking.split_tokens(concatenated, 2)
    assert mapped[0] == "as_ragged" and "select" not in mapped  # Dataset.batch, no per-element map
    assert [e["targets"] for e in as_lists(plain)] == [[1, 2], [3], [4], [5, 6], [7, 8], [9]]
    fast = [e["targets"] for e in as_lists(chained)]
    assert fast == [[1, 2], [3, 4], [5, 6], [7, 8], [9]]

    # The same input forced down the slow path gives the same segments.
    monkeypatch.setattr(batching, "is_batchable", lambda spec: False)
    del mapped[:]
    slow = chunking.split_tokens(chunking.reduce_concat_tokens(token_dataset(docs)), 2)
    assert mapped.count("select") == 2  # both steps took the per-element map
    assert [e["targets"] for e in as_lists(slow)] == fast


def test_missing_or_untokenized_feature_is_a_clear_error(token_dataset):
    with pytest.raises(ValueError, match="tokenized 'targets'"):
        chunking.split_tokens(token_dataset([[1]], key="text"), 2)
    text = tf.data.Dataset.from_tensors({"targets": tf.constant("raw text")})
    with pytest.raises(ValueError, match="1-D integer token sequence"):
        chunking.split_tokens(text, 2)


def test_missing_sequence_length_is_a_clear_error(token_dataset, features32100):
    with pytest.raises(ValueError, match=r"sequence_length\['inputs'\]"):
        chunking.split_tokens_to_inputs_length(
            token_dataset([[1]]), sequence_length={"targets": 3}, output_features=features32100
        )
