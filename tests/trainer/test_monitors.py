"""The watchers alone: early stopping and reduce-on-plateau decide from a sequence of evaluations
(the trainer only acts on their decisions; tests/finetuning/test_runs.py runs them in training)."""

import pytest

from t2t.trainer import monitors


def _decisions(watcher, values, scale=1.0):
    watch, out = monitors.Watch(), []
    for step, value in enumerate(values, start=1):
        if isinstance(watcher, monitors.ReduceOnPlateau):
            decision = watcher.decide(watch, step * 10, value, scale)
            scale = decision.scale if decision.scale is not None else scale
        else:
            decision = watcher.decide(watch, step * 10, value)
        out.append(decision)
    return watch, out


def test_early_stopping_the_module_docstring_example():
    # mode "max", patience 2: best 0.61 at the 4th evaluation; the 5th and 6th do not improve.
    stopping = monitors.EarlyStopping("task/accuracy", mode="max", patience=2)
    watch, decisions = _decisions(stopping, [0.50, 0.60, 0.58, 0.61, 0.59, 0.60])
    assert [d.best for d in decisions] == [True, True, False, True, False, False]
    assert [d.stop for d in decisions] == [False] * 5 + [True]
    assert (watch.best, watch.best_step) == (0.61, 40)
    assert "best 0.61 at step 40" in decisions[-1].note
    assert all(d.note is None for d in decisions[:-1])


def test_early_stopping_min_mode_and_min_delta():
    stopping = monitors.EarlyStopping("task/loss", mode="min", patience=1, min_delta=0.1)
    _, decisions = _decisions(stopping, [2.0, 1.95])  # 1.95 is within min_delta of 2.0
    assert [(d.best, d.stop) for d in decisions] == [(True, False), (False, True)]
    _, decisions = _decisions(stopping, [2.0, 1.85])
    assert [(d.best, d.stop) for d in decisions] == [(True, False), (True, False)]


def test_reduce_on_plateau_lowers_the_scale_then_cools_down():
    plateau = monitors.ReduceOnPlateau(
        "task/accuracy", patience=2, factor=0.5, cooldown=1, min_scale=0.2
    )
    values = [0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]
    _, decisions = _decisions(plateau, values)
    # Two evaluations without improvement -> 0.5; one of cooldown; two more -> 0.25; then
    # cooldown, two more -> 0.2 (the floor), and again at the floor.
    assert [d.scale for d in decisions] == [
        None,
        None,
        0.5,
        None,
        None,
        0.25,
        None,
        None,
        0.2,
        None,
    ]
    assert "update scale 1 -> 0.5" in decisions[2].note
    assert not any(d.stop for d in decisions)


def test_a_new_best_resets_the_plateau_count():
    plateau = monitors.ReduceOnPlateau("task/accuracy", patience=2)
    _, decisions = _decisions(plateau, [0.5, 0.4, 0.6, 0.5, 0.5])
    assert [d.best for d in decisions] == [True, False, True, False, False]
    assert [d.scale for d in decisions] == [None, None, None, None, 0.5]


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: monitors.EarlyStopping("m", mode="up"), "mode must be 'max' or 'min'"),
        (lambda: monitors.EarlyStopping("m", patience=0), "patience must be a positive int"),
        (lambda: monitors.ReduceOnPlateau("m", factor=1.5), r"factor must be in \(0, 1\)"),
    ],
)
def test_bad_settings_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()
