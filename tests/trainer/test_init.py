"""`init_or_restore` alone: the first state of an empty model directory, the same state again
from its checkpoint (parameters, optimizer state, counters, the watchers' memory), and no
silent start from step 0 when every checkpoint is damaged."""

import os
import shutil

import jax
import numpy as np
import pytest

from t2t import nn as t2t_nn
from t2t import optim, partitioning
from t2t.checkpoints.manager import DAMAGED_SUBDIR, CheckpointManager
from t2t.errors import UserError
from t2t.finetuning import FineTuning
from t2t.trainer import init, monitors

CONFIG = t2t_nn.get_preset("tiny", vocab_size=64)


def _start(model_dir, **kwargs):
    partitioner = partitioning.make_partitioner(1, 1, devices=jax.devices()[:1])
    tx = init.optimizer_for(optim.adafactor(1e-2), CONFIG, FineTuning())
    manager = CheckpointManager(str(model_dir), async_save=False)
    return manager, init.init_or_restore(manager, CONFIG, tx, partitioner, **kwargs)


def _leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_a_first_state_then_the_same_state_from_its_checkpoint(tmp_path):
    manager, first = _start(tmp_path, seed=3)
    assert first.step == 0 and first.origin == {"kind": "random", "seed": 3}
    assert first.watches == init.fresh_watches() and first.stopped_early is None
    watch = monitors.Watch(best=0.75, best_step=4, since_best=1)
    manager.save(
        5,
        params=first.params,
        opt_state=first.opt_state,
        metadata={
            "tokens_seen": 70,
            "examples_seen": 9,
            "watches": {"early_stopping": vars(watch)},
            "stopped_early": None,
        },
    )
    manager.close()
    _, again = _start(tmp_path, seed=99)  # the seed no longer matters: the checkpoint does
    assert again.step == 5 and again.origin == {"kind": "resume", "step": 5}
    assert (again.tokens_seen, again.examples_seen) == (70, 9)
    assert again.watches["early_stopping"] == watch
    assert again.watches["reduce_on_plateau"] == monitors.Watch()
    for got, want in zip(_leaves(again.params), _leaves(first.params), strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(_leaves(again.opt_state), _leaves(first.opt_state), strict=True):
        np.testing.assert_array_equal(got, want)
    _, other_seed = _start(tmp_path / "fresh", seed=4)
    assert not all(
        np.array_equal(a, b)
        for a, b in zip(_leaves(other_seed.params), _leaves(first.params), strict=True)
    )


def test_a_directory_with_only_damaged_checkpoints_is_refused_unless_asked(tmp_path):
    os.makedirs(tmp_path / DAMAGED_SUBDIR / "5")
    with pytest.raises(UserError, match=r"no intact checkpoint.*--start_over"):
        _start(tmp_path)
    _, state = _start(tmp_path, start_over=True)
    assert state.step == 0 and state.origin["kind"] == "random"
    shutil.rmtree(tmp_path / DAMAGED_SUBDIR)
