"""Target-data subsampling: exactly N examples of a task, the same subset for a seed and
another subset for another seed, through the real input pipeline."""

import numpy as np
import pytest

from t2t.data import pipeline, subsample


def test_subset_indices_worked_example():
    np.testing.assert_array_equal(subsample.subset_indices(10, 3, 0), [5, 6, 9])
    np.testing.assert_array_equal(subsample.subset_indices(10, 3, 1), [3, 4, 7])
    np.testing.assert_array_equal(subsample.subset_indices(4, 9, 0), [0, 1, 2, 3])


def targets_seen(seed, max_examples, epochs=1, shuffle=False):
    config = pipeline.PipelineConfig(
        "builtin_package",
        {"inputs": 64, "targets": 8},
        global_batch_size=1,
        pack=False,
        shuffle=shuffle,
        num_epochs=epochs,
        seed=seed,
        max_examples=max_examples,
    )
    data = pipeline.InputPipeline(config)
    rows = [tuple(batch["encoder_input_tokens"][0]) for batch in data]
    return rows, data.subset


def test_a_capped_task_trains_on_exactly_the_seeds_subset(builtin_tasks):
    rows, subset = targets_seen(seed=3, max_examples=24)
    assert len(rows) == len(set(rows)) == 24
    assert subset["examples_kept"] == 24 and subset["examples_available"] > 24
    again, same = targets_seen(seed=3, max_examples=24, epochs=2, shuffle=True)
    assert set(again) == set(rows) and len(again) == 48  # reshuffled epochs over the subset
    assert same["subset_digest"] == subset["subset_digest"]
    other, different = targets_seen(seed=4, max_examples=24)
    assert set(other) != set(rows) and different["subset_digest"] != subset["subset_digest"]


def test_capping_a_mixture_is_refused_with_the_alternative(builtin_tasks):
    config = pipeline.PipelineConfig(
        "builtin_supervised", {"inputs": 64, "targets": 8}, global_batch_size=1, max_examples=5
    )
    with pytest.raises(ValueError, match="is a mixture. Cap its tasks"):
        pipeline.InputPipeline(config)
