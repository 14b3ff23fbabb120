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


def _span_corruption(max_examples, epochs=None):
    return pipeline.PipelineConfig(
        "builtin_span_corruption",
        {"inputs": 32, "targets": 16},
        global_batch_size=4,
        num_epochs=epochs,
        seed=5,
        max_examples=max_examples,
    )


def _caches(data) -> int:
    """The number of cache stages in the pipeline's tf.data graph."""
    import tensorflow as tf

    graph = tf.compat.v1.GraphDef.FromString(data.dataset._as_serialized_graph().numpy())
    nodes = [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
    return sum(node.op == "CacheDatasetV2" for node in nodes)


def test_a_small_subset_is_cached_and_gives_the_batches_of_a_reread(builtin_tasks, monkeypatch):
    """Eight examples through a random preprocessor for three epochs: the same batches whether
    each epoch reads the split again (the graph before the cache) or the cache."""
    cached = pipeline.InputPipeline(_span_corruption(8, epochs=3))
    monkeypatch.setattr(pipeline, "CACHE_SUBSET_AT_MOST", 7)  # the subset is above it
    reread = pipeline.InputPipeline(_span_corruption(8, epochs=3))
    assert _caches(cached) == _caches(reread) + 1
    got, want = list(cached), list(reread)
    assert len(got) == len(want) >= 3
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])


def test_positions_saved_before_the_cache_restore_exactly(builtin_tasks, monkeypatch, tmp_path):
    """A run that saved its data position with the uncached graph resumes under the cached
    one (it falls back to the graph the position came from), as do positions the cached graph
    saves, before its first epoch ends and after."""

    def package():
        config = pipeline.PipelineConfig(
            "builtin_package",
            {"inputs": 64, "targets": 8},
            global_batch_size=2,
            pack=False,
            seed=1,
            max_examples=6,
        )
        return pipeline.InputPipeline(config)

    with monkeypatch.context() as patch:
        patch.setattr(pipeline, "CACHE_SUBSET_AT_MOST", 0)
        before = package()
        next(before)
        before.save(str(tmp_path / "old"))
        want = [next(before) for _ in range(4)]
    resumed = package()
    cached = _caches(resumed)
    resumed.restore(str(tmp_path / "old"))
    assert _caches(resumed) == cached - 1
    for a, b in zip([next(resumed) for _ in range(4)], want, strict=True):
        np.testing.assert_array_equal(a["encoder_input_tokens"], b["encoder_input_tokens"])
    for steps in (1, 4):  # inside the first epoch (3 batches of 2), then past it
        run = package()
        for _ in range(steps):
            next(run)
        run.save(str(tmp_path / f"new{steps}"))
        want = [next(run)["encoder_input_tokens"] for _ in range(4)]
        again = package()
        again.restore(str(tmp_path / f"new{steps}"))
        assert _caches(again) == cached
        for a, b in zip([next(again)["encoder_input_tokens"] for _ in range(4)], want, strict=True):
            np.testing.assert_array_equal(a, b)
