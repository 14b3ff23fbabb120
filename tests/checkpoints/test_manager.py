"""Orbax checkpoints: round trips, retention, the data-iterator item, crash safety, resharding."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t import nn, optim, partitioning
from t2t.checkpoints.manager import (
    BestMetric,
    CheckpointManager,
    config_from_metadata,
)

CONFIG = nn.get_preset("tiny", vocab_size=256)


class CountingIterator:
    """A stand-in input pipeline whose position is one integer, saved as a file."""

    def __init__(self, position=0, fail_on_save=False):
        self.position = position
        self.fail_on_save = fail_on_save

    def __next__(self):
        self.position += 1
        return self.position

    def save(self, directory):
        if self.fail_on_save:
            raise RuntimeError("disk full")
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, "position.json"), "w") as f:
            json.dump(self.position, f)

    def restore(self, directory):
        with open(os.path.join(directory, "position.json")) as f:
            self.position = json.load(f)


@pytest.fixture(scope="module")
def params():
    return nnx.state(nn.build(CONFIG, nnx.Rngs(params=0)), nnx.Param)


def _abstract(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)


def _equal(a, b):
    return jax.tree.all(jax.tree.map(lambda x, y: bool(jnp.array_equal(x, y)), a, b))


def test_round_trip_params_optimizer_metadata_and_iterator(tmp_path, params):
    tx = optim.adafactor(optim.constant(1e-3))
    opt_state = tx.init(params)
    iterator = CountingIterator()
    for _ in range(7):
        next(iterator)
    manager = CheckpointManager(tmp_path)
    manager.save(
        7,
        params=params,
        opt_state=opt_state,
        data_iterator=iterator,
        metadata={"config": CONFIG, "tokens_seen": 1234},
    )
    manager.wait_until_finished()

    fresh = CountingIterator()
    restored = manager.restore(
        abstract_params=_abstract(params),
        abstract_opt_state=jax.eval_shape(tx.init, params),
        data_iterator=fresh,
    )
    assert restored.step == 7
    assert isinstance(restored.params, nnx.State)
    assert _equal(restored.params, params)
    assert _equal(restored.opt_state, opt_state)
    assert fresh.position == 7 and next(fresh) == 8
    assert restored.metadata["tokens_seen"] == 1234
    assert config_from_metadata(restored.metadata) == CONFIG
    assert manager.read_metadata(7)["step"] == 7


def test_a_relative_model_dir_saves_and_restores(tmp_path, params, monkeypatch):
    # `make demo` passes MODEL_DIR=runs/demo; Orbax's array writers need absolute paths.
    monkeypatch.chdir(tmp_path)
    manager = CheckpointManager("runs/demo")
    manager.save(5, params=params, metadata={"config": CONFIG})
    manager.wait_until_finished()
    monkeypatch.chdir(tmp_path / "runs")  # a later process in another directory
    assert CheckpointManager(tmp_path / "runs" / "demo").all_steps() == [5]
    restored = CheckpointManager("demo").restore(abstract_params=_abstract(params))
    assert restored.step == 5 and _equal(restored.params, params)


def test_keeps_the_last_k_and_the_best_per_metric_across_restarts(tmp_path, params):
    best = [BestMetric("accuracy", "max"), BestMetric("loss", "min")]
    history = {10: (50.0, 3.0), 20: (90.0, 2.5), 30: (60.0, 1.0)}
    manager = CheckpointManager(tmp_path, keep=2, best=best, async_save=False)
    for step, (accuracy, loss) in history.items():
        manager.save(step, params=params, metrics={"accuracy": accuracy, "loss": loss})
    manager.close()

    manager = CheckpointManager(tmp_path, keep=2, best=best, async_save=False)  # a restart
    assert manager.metrics(20) == {"accuracy": 90.0, "loss": 2.5}
    for step, (accuracy, loss) in {40: (70.0, 2.0), 50: (10.0, 5.0)}.items():
        manager.save(step, params=params, metrics={"accuracy": accuracy, "loss": loss})
    # Last two (40, 50), best accuracy (20), lowest loss (30); step 10 is gone.
    assert manager.all_steps() == [20, 30, 40, 50]


def test_a_crash_during_save_leaves_the_last_good_checkpoint(tmp_path, params):
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(1, params=params, data_iterator=CountingIterator(1))
    bad = jax.tree.map(lambda x: x + 1.0, params)
    with pytest.raises(RuntimeError, match="disk full"):
        manager.save(2, params=bad, data_iterator=CountingIterator(2, fail_on_save=True))
    manager.close()

    manager = CheckpointManager(tmp_path, async_save=False)  # the next run
    assert manager.all_steps() == [1]
    fresh = CountingIterator()
    restored = manager.restore(abstract_params=_abstract(params), data_iterator=fresh)
    assert restored.step == 1 and fresh.position == 1
    assert _equal(restored.params, params)
    leftovers = [p for p in os.listdir(manager.directory) if p not in ("1",)]
    assert all(not name.startswith("2") for name in leftovers), leftovers


def test_restores_onto_a_different_mesh(tmp_path):
    if jax.device_count() < 8:
        pytest.skip("needs 8 devices (tests/conftest.py sets them up)")

    def create():
        return nn.build(CONFIG, nnx.Rngs(params=0))

    wide = partitioning.make_partitioner(data=2, model=4, mode="tensor_parallel")
    written = nnx.state(wide.init_model(create), nnx.Param)
    manager = CheckpointManager(tmp_path, async_save=False)
    manager.save(3, params=written)

    tall = partitioning.make_partitioner(data=8, model=1, mode="fsdp")
    _, abstract = tall.abstract_model(create)
    restored = manager.restore(abstract_params=abstract)
    assert _equal(restored.params, written)
    embedding = restored.params["token_embedder"]["embedding"][...]
    assert embedding.sharding == abstract["token_embedder"]["embedding"].sharding
    kernel = restored.params["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"][...]
    # fsdp on an 8x1 mesh splits the embed dimension over data: each device holds 1/8 of it.
    assert kernel.addressable_shards[0].data.shape == (CONFIG.d_model // 8, CONFIG.d_ff)


def test_clear_errors(tmp_path, params):
    manager = CheckpointManager(tmp_path, async_save=False)
    with pytest.raises(FileNotFoundError, match="No checkpoint under"):
        manager.restore(abstract_params=_abstract(params))
    manager.save(5, params=params)
    with pytest.raises(FileNotFoundError, match=r"saved steps: \[5\]"):
        manager.restore(4, abstract_params=_abstract(params))
    with pytest.raises(ValueError, match="no 'config' entry"):
        config_from_metadata(manager.read_metadata())
    with pytest.raises(ValueError, match="'max' or 'min'"):
        BestMetric("loss", "lowest")
    with pytest.raises(TypeError, match="JSON-serializable"):
        manager.save(6, params=params, metadata={"fn": object()})
    assert np.array_equal(manager.all_steps(), [5])
