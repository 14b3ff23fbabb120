"""The two paddings of a short last batch (`t2t.data.batches`): zero rows for sums, copies of the
last row for decoding."""

import numpy as np
import pytest

from t2t.data import batches


def test_stack_rows_repeats_the_last_row():
    rows = [{"x": np.array([i, i + 1], np.int32)} for i in (1, 3, 5)]
    stacked = batches.stack_rows(rows, 4)  # the docstring's example: a, b, c -> a, b, c, c
    np.testing.assert_array_equal(stacked["x"], [[1, 2], [3, 4], [5, 6], [5, 6]])
    assert stacked["x"].dtype == np.int32
    np.testing.assert_array_equal(batches.stack_rows(rows, 3)["x"], [[1, 2], [3, 4], [5, 6]])
    with pytest.raises(ValueError, match="Expected 1 to 2 rows, got 3"):
        batches.stack_rows(rows, 2)
    with pytest.raises(ValueError, match="got 0"):
        batches.stack_rows([], 2)


def test_pad_batch_adds_zero_rows():
    padded = batches.pad_batch({"a": np.ones((3, 2), np.int32)}, 4)
    np.testing.assert_array_equal(padded["a"], [[1, 1], [1, 1], [1, 1], [0, 0]])
    with pytest.raises(ValueError, match="more than 2"):
        batches.pad_batch({"a": np.ones((3, 2))}, 2)
