"""The run's option groups refuse bad values when they are built, naming the binding to fix."""

import dataclasses

import pytest

from t2t.trainer import monitors
from t2t.trainer.options import CheckpointOptions, DataOptions, EvalOptions

DATA = dict(mixture_or_task="builtin_order", task_feature_lengths={"inputs": 64, "targets": 8})


@pytest.mark.parametrize(
    "make, binding, wanted",
    [
        (
            lambda: DataOptions(**DATA, batch_size=0),
            r"DataOptions\.batch_size \(the gin macro "
            r"BATCH_SIZE\)",
            "a positive int",
        ),
        (
            lambda: DataOptions(**DATA, max_examples=-1),
            r"DataOptions\.max_examples",
            "a positive int or None",
        ),
        (lambda: CheckpointOptions(every=0), r"CheckpointOptions\.every", "a positive int"),
        (
            lambda: CheckpointOptions(keep=True),
            r"CheckpointOptions\.keep",
            "a positive int or None",
        ),
        (lambda: EvalOptions(every="10"), r"EvalOptions\.every", "a positive int or None"),
        (
            lambda: EvalOptions(num_predictions=-2),
            r"EvalOptions\.num_predictions",
            "a non-negative int",
        ),
    ],
)
def test_a_bad_count_names_its_binding(make, binding, wanted):
    with pytest.raises(ValueError, match=rf"t2t\.runs\.{binding} must be {wanted}; got"):
        make()


def test_the_data_options_require_a_task_and_its_lengths():
    with pytest.raises(ValueError, match=r"mixture_or_task \(the gin macro MIXTURE_OR_TASK\)"):
        DataOptions(task_feature_lengths={"inputs": 8})
    with pytest.raises(ValueError, match=r"TASK_FEATURE_LENGTHS"):
        DataOptions(mixture_or_task="builtin_order")
    data = DataOptions(**DATA)
    assert (data.batch_size, data.pack, data.max_examples) == (128, True, None)


def test_a_watcher_without_evaluations_is_refused():
    stopping = monitors.EarlyStopping(metric="builtin_order/accuracy", mode="max")
    with pytest.raises(ValueError, match=r"EarlyStopping watches evaluations.*EvalOptions\.every"):
        EvalOptions(early_stopping=stopping)
    assert EvalOptions(every=10, early_stopping=stopping).early_stopping is stopping


def test_a_best_metric_mode_is_max_or_min():
    with pytest.raises(ValueError, match=r"'builtin_order/accuracy' must be 'max' or 'min'"):
        CheckpointOptions(best_metrics={"builtin_order/accuracy": "highest"})


def test_the_groups_are_frozen_and_keyword_only():
    options = CheckpointOptions(every=5)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.every = 6
    with pytest.raises(TypeError):
        CheckpointOptions(5)
    assert dataclasses.replace(options, keep=None) == CheckpointOptions(every=5, keep=None)
