"""The trainer on synthetic batches: sharded steps equal one device, microbatches equal one
batch, non-finite values stop the run with the last good checkpoint intact, restores onto
another mesh, starts from HF and t2t checkpoints, and the reporting helpers."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t import models, optim, partitioning
from t2t import nn as t2t_nn
from t2t.checkpoints import hf
from t2t.checkpoints.manager import CheckpointManager
from t2t.trainer import NonFiniteError, Trainer, init, reporting, sources, steps
from t2t.trainer.options import CheckpointOptions, EvalOptions, LoopOptions

CONFIG = t2t_nn.get_preset("tiny", vocab_size=128, dropout_rate=0.1)
LENGTHS = (16, 8)  # inputs, targets
BATCH = 8


class SyntheticBatches:
    """Deterministic packed-looking encoder-decoder batches; batch i depends only on i."""

    def __init__(self, batch_size=BATCH, seed=0):
        self.batch_size, self.seed, self.index = batch_size, seed, 0

    def __next__(self):
        rng = np.random.RandomState(self.seed * 1000 + self.index)
        self.index += 1
        inputs_length, targets_length = LENGTHS
        inputs = rng.randint(3, CONFIG.vocab_size, (self.batch_size, inputs_length))
        targets = rng.randint(3, CONFIG.vocab_size, (self.batch_size, targets_length))
        lengths = rng.randint(2, targets_length + 1, self.batch_size)
        targets[np.arange(targets_length)[None, :] >= lengths[:, None]] = 0  # padded rows
        inputs[:, -2:] = 0
        return {
            "encoder_input_tokens": inputs.astype(np.int32),
            "decoder_target_tokens": targets.astype(np.int32),
            "decoder_input_tokens": np.pad(targets[:, :-1], ((0, 0), (1, 0))).astype(np.int32),
            "decoder_loss_weights": (targets > 0).astype(np.float32),
        }


def _model(config=CONFIG, factor="num_real_target_tokens"):
    return models.EncoderDecoderModel(config, loss_normalizing_factor=factor)


def _single_device():
    return partitioning.make_partitioner(1, 1, devices=jax.devices()[:1])


LOOP = LoopOptions(log_every=1, progress=False)


def _trainer(
    model_dir,
    partitioner,
    model=None,
    learning_rate=1e-2,
    checkpoints=CheckpointOptions(every=100),
    loop=LOOP,
    **kwargs,
):
    """A trainer on `model_dir` (`Trainer.create`) with seed 3."""
    return Trainer.create(
        model or _model(),
        optim.adafactor(learning_rate),
        partitioner,
        str(model_dir),
        SyntheticBatches(),
        checkpoints=checkpoints,
        loop=loop,
        learning_rate=learning_rate,
        **{"seed": 3, **kwargs},
    )


def _leaves(state):
    return {
        partitioning.param_path(p): np.asarray(x)
        for p, x in jax.tree_util.tree_flatten_with_path(state)[0]
    }


def _assert_close(a, b, atol):
    a, b = _leaves(a), _leaves(b)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], atol=atol, rtol=0, err_msg=name)


@pytest.fixture(scope="module")
def single_run(tmp_path_factory):
    """Three steps on one device (with dropout), checkpoints at steps 2 and 3."""
    model_dir = tmp_path_factory.mktemp("single")
    trainer = _trainer(model_dir, _single_device(), checkpoints=CheckpointOptions(every=2))
    summary = trainer.train(3)
    trainer.close()
    return model_dir, trainer, summary


def test_sharded_steps_equal_single_device_and_follow_the_rules(tmp_path, single_run):
    _, single, _ = single_run
    partitioner = partitioning.make_partitioner(2, 4, mode="fsdp")
    sharded = _trainer(tmp_path, partitioner)
    sharded.train(3)
    _assert_close(sharded.params, single.params, atol=1e-5)
    losses = [s["loss"] for _, s in sharded.history]
    np.testing.assert_allclose(losses, [s["loss"] for _, s in single.history], rtol=1e-5)
    # Every parameter lives where the fsdp rules put it: embed over data, mlp/heads over model.
    state = sharded.params
    wi = state["encoder"]["layers_0"]["mlp"]["wi_0"]["kernel"].get_value()
    assert wi.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    assert wi.addressable_shards[0].data.shape == (CONFIG.d_model // 2, CONFIG.d_ff // 4)
    query = state["decoder"]["layers_1"]["self_attention"]["query"]["kernel"].get_value()
    assert query.sharding.spec == jax.sharding.PartitionSpec("data", "model")
    embedding = state["token_embedder"]["embedding"].get_value()
    assert embedding.sharding.spec == jax.sharding.PartitionSpec("model", "data")
    expected = sharded.partitioner.shardings(init.abstract_of(sharded.params))
    for path, x in jax.tree_util.tree_flatten_with_path(state)[0]:
        want = jax.tree_util.tree_flatten_with_path(expected)[0]
        assert any(p == path and x.sharding.is_equivalent_to(s, x.ndim) for p, s in want)
    sharded.close()


def test_restore_onto_a_different_mesh(single_run):
    model_dir, single, _ = single_run
    partitioner = partitioning.make_partitioner(2, 4, mode="tensor_parallel")
    restored = _trainer(model_dir, partitioner)
    assert restored.step == 3 and restored.state.origin == {"kind": "resume", "step": 3}
    _assert_close(restored.params, single.params, atol=0)
    _assert_close(restored.state.opt_state, single.state.opt_state, atol=0)
    wo = restored.params["decoder"]["layers_0"]["mlp"]["wo"]["kernel"].get_value()
    assert wo.sharding.spec == jax.sharding.PartitionSpec("model", None)
    assert restored.state.tokens_seen == single.state.tokens_seen > 0
    restored.close()


def test_microbatches_give_the_one_batch_update():
    model = _model(CONFIG.replace(dropout_rate=0.0))
    tx = optim.adafactor(1e-2)
    partitioner = _single_device()
    _, abstract = partitioner.abstract_model(lambda: t2t_nn.build(model.config, nnx.Rngs(0)))
    abstract_opt = partitioner.abstract_optimizer(tx, abstract)
    batch = partitioner.make_global_batch(next(SyntheticBatches(batch_size=8)))
    results = []
    for k in (1, 4):
        params = nnx.split(
            partitioner.init_model(lambda: t2t_nn.build(model.config, nnx.Rngs(params=0)))
        )[1]
        opt_state = partitioner.init_optimizer(tx, params)
        step = steps.jit_train_step(
            steps.make_train_step(model, tx, num_microbatches=k),
            partitioner,
            abstract,
            abstract_opt,
            batch,
        )
        with partitioner.context():
            params, _, metrics = step(params, opt_state, batch, jax.random.PRNGKey(0), np.int32(0))
        results.append((params, jax.device_get(metrics)))
    (params_1, metrics_1), (params_4, metrics_4) = results
    _assert_close(params_4, params_1, atol=1e-5)
    np.testing.assert_allclose(metrics_4["loss"], metrics_1["loss"], rtol=1e-5)
    for name in ("weight_sum", "num_correct_tokens", "num_tokens", "num_examples"):
        assert float(metrics_4[name]) == float(metrics_1[name]), name
    np.testing.assert_allclose(metrics_4["cross_ent_sum"], metrics_1["cross_ent_sum"], rtol=1e-5)


def test_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    def exploding(count):  # a learning rate that turns the parameters to NaN at the 4th update
        return jnp.where(count < 3, 1e-2, jnp.nan)

    trainer = _trainer(
        tmp_path,
        _single_device(),
        learning_rate=exploding,
        checkpoints=CheckpointOptions(every=2),
        loop=LoopOptions(log_every=5, progress=False),
    )
    with pytest.raises(
        NonFiniteError,
        match=r"step 4: the updated parameters' norm \(param_norm\)"
        r" is nan.*last checkpoint \(step 2\)",
    ) as error:
        trainer.train(10)
    assert error.value.step == 4 and error.value.last_checkpoint == 2
    manager = CheckpointManager(tmp_path, read_only=True)
    assert manager.all_steps() == [2]
    restored = manager.restore(abstract_params=init.abstract_of(trainer.params))
    assert all(np.isfinite(x).all() for x in _leaves(restored.params).values())
    assert os.path.exists(os.path.join(tmp_path, "loss_curve.png"))


def test_start_from_hf_and_t2t_checkpoints(tmp_path, single_run):
    model_dir, single, _ = single_run
    partitioner = partitioning.make_partitioner(2, 4)
    config = CONFIG.replace(dropout_rate=0.0)  # dropout may differ from the checkpoint's
    params = nnx.split(t2t_nn.build(config, nnx.Rngs(params=7)))[1]
    hf.export_hf(tmp_path / "hf", config, params)
    from_hf = _trainer(
        tmp_path / "from_hf",
        partitioner,
        model=_model(config),
        init_checkpoint=str(tmp_path / "hf"),
    )
    assert from_hf.step == 0 and from_hf.state.origin["kind"] == "hf"
    _assert_close(from_hf.params, params, atol=0)
    assert from_hf.params["encoder"]["layers_0"]["mlp"]["wi_0"][
        "kernel"
    ].get_value().sharding.spec == jax.sharding.PartitionSpec(None, "model")
    from_run = _trainer(
        tmp_path / "from_run", partitioner, model=_model(config), init_checkpoint=str(model_dir)
    )
    assert from_run.step == 0 and from_run.state.origin == {
        "kind": "t2t",
        "path": os.path.abspath(model_dir),
        "step": 3,
    }
    _assert_close(from_run.params, single.params, atol=0)
    assert int(jax.device_get(from_run.state.opt_state[0].count)) == 0  # a fresh optimizer
    for trainer in (from_hf, from_run):
        trainer.close()
    other = CONFIG.replace(d_ff=256)
    with pytest.raises(ValueError, match="d_ff: checkpoint 512, run 256"):
        _trainer(
            tmp_path / "mismatch",
            partitioner,
            model=_model(other),
            init_checkpoint=str(tmp_path / "hf"),
        )
    with pytest.raises(FileNotFoundError, match="HF T5 directory"):
        sources.checkpoint_kind(str(tmp_path))


def test_run_directory_has_summaries_curve_and_metadata(single_run):
    model_dir, single, summary = single_run
    assert summary["first_step"] == 0 and summary["last_step"] == 3
    assert summary["tokens_seen"] == single.state.tokens_seen
    scalars = reporting.read_scalars(os.path.join(model_dir, "train"))
    assert [s for s, _ in scalars["loss"]] == [1, 2, 3]
    np.testing.assert_allclose(
        [v for _, v in scalars["loss"]], [s["loss"] for _, s in single.history], rtol=1e-6
    )
    assert {"learning_rate", "tokens_per_second", "token_accuracy", "z_loss"} <= set(scalars)
    assert os.path.getsize(os.path.join(model_dir, "loss_curve.png")) > 1000
    metadata = CheckpointManager(model_dir, read_only=True).read_metadata(3)
    assert metadata["tokens_seen"] == single.state.tokens_seen
    # Tokens seen: non-zero input and target tokens of the three batches.
    data = SyntheticBatches()
    expected = sum(
        int(
            np.count_nonzero(b["encoder_input_tokens"])
            + np.count_nonzero(b["decoder_target_tokens"])
        )
        for b in (next(data) for _ in range(3))
    )
    assert metadata["tokens_seen"] == expected
    assert metadata["examples_seen"] == 3 * BATCH
    assert metadata["architecture"] == "encoder_decoder" and metadata["config"]["vocab_size"] == 128


def test_restart_markers_hide_the_lost_steps_of_an_interrupted_run(tmp_path, capfd, caplog):
    first = reporting.ScalarWriter(str(tmp_path))
    first.restart(0)
    for step in range(1, 6):
        first.write(step, {"loss": 10.0 - step})
    first.close()
    second = reporting.ScalarWriter(str(tmp_path))  # resumed from a checkpoint of step 3
    second.restart(4)
    second.write(4, {"loss": 0.5})
    second.close()
    caplog.set_level("INFO")
    capfd.readouterr()
    assert reporting.read_scalars(str(tmp_path))["loss"] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 0.5)]
    # The purge is the markers' purpose: TensorBoard's out-of-order warning is not printed.
    assert "out of order" not in capfd.readouterr().err
    assert not [r for r in caplog.records if "out of order" in r.getMessage()]


def test_batch_counts_worked_example():
    batch = {
        "decoder_segment_ids": jnp.array([[1, 1, 2, 0], [1, 0, 0, 0], [0, 0, 0, 0]]),
        "decoder_target_tokens": jnp.array([[5, 1, 1, 0], [7, 0, 0, 0], [0, 0, 0, 0]]),
        "encoder_input_tokens": jnp.array([[4, 4, 0], [3, 1, 0], [0, 0, 0]]),
    }
    counts = steps.batch_counts(batch)
    assert int(counts["num_examples"]) == 3 and int(counts["num_tokens"]) == 4 + 4
    del batch["decoder_segment_ids"]
    assert int(steps.batch_counts(batch)["num_examples"]) == 2


def test_train_scalars():
    raw = {
        "loss": 3.0,
        "cross_ent_sum": 50.0,
        "z_loss_sum": 10.0,
        "weight_sum": 20.0,
        "num_correct_tokens": 5.0,
        "grad_norm": 1.0,
        "param_norm": 2.0,
        "num_tokens": 40,
        "num_examples": 4,
    }
    constant = steps.train_scalars(raw, 20.0)
    assert constant["z_loss"] == 0.5 and constant["cross_ent_per_token"] == 2.5
    assert constant["token_accuracy"] == 25.0  # percent, as the tasks' accuracies
    per_batch = steps.train_scalars({**raw, "loss_denominator": 40.0}, "num_total_target_tokens")
    assert per_batch["z_loss"] == 0.25
    assert steps.first_non_finite({**raw, "grad_norm": np.inf}) == (
        "the gradient norm (grad_norm) is inf"
    )
    assert steps.eval_scalars(
        {"cross_ent_sum": 6.0, "z_loss_sum": 0.3, "weight_sum": 3.0, "num_correct_tokens": 1.5}
    ) == pytest.approx({"loss": 2.0, "z_loss": 0.1, "token_accuracy": 50.0, "target_tokens": 3.0})


def test_bad_periods_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"CheckpointOptions.every must be a positive int; got 0"):
        CheckpointOptions(every=0)
    with pytest.raises(ValueError, match=r"LoopOptions.log_every must be a positive int; got 0"):
        LoopOptions(log_every=0)
    with pytest.raises(ValueError, match=r"num_microbatches must be a positive int; got True"):
        LoopOptions(num_microbatches=True)


def test_hf_directory_is_recognized(tmp_path):
    os.makedirs(tmp_path / "hf")
    with open(tmp_path / "hf" / "config.json", "w") as f:
        json.dump(hf.hf_config_from_config(CONFIG), f)
    with pytest.raises(FileNotFoundError):
        sources.checkpoint_kind(str(tmp_path / "hf"))  # no weights yet
    (tmp_path / "hf" / "model.safetensors").write_bytes(b"")
    assert sources.checkpoint_kind(str(tmp_path / "hf")) == sources.HF
    assert sources.source_config(str(tmp_path / "hf"), dropout_rate=0.0) == CONFIG.replace(
        dropout_rate=0.0
    )


def test_checkpoint_saved_is_said_only_once_the_save_is_committed(tmp_path, capsys):
    """With asynchronous saves still in flight at every log boundary, no "saved" line appears
    until the trainer has waited for them; then one per step."""
    trainer = _trainer(
        tmp_path, _single_device(), checkpoints=CheckpointOptions(every=2, async_save=True)
    )
    real_wait = trainer.manager.wait_until_finished
    trainer.manager.is_saving_in_progress = lambda: True  # never committed while training

    def wait():
        real_wait()
        print("<all saves committed>")

    trainer.manager.wait_until_finished = wait
    trainer.train(4)
    lines = capsys.readouterr().out.splitlines()
    saved = [line for line in lines if "checkpoint saved" in line]
    assert saved == [f"step {s}: checkpoint saved to {trainer.manager.directory}" for s in (2, 4)]
    assert lines.index("<all saves committed>") < lines.index(saved[0])
    assert trainer.manager.all_steps() == [2, 4]


def test_an_evaluation_with_nothing_to_evaluate_prints_no_empty_line(tmp_path, capsys):
    """Issue 33: a chain stage with no eval tasks printed "step N eval: " with nothing after it
    at every evaluation."""
    trainer = _trainer(tmp_path, _single_device(), evaluation=EvalOptions(every=1))
    trainer.train(2)
    lines = capsys.readouterr().out.splitlines()
    assert not [line for line in lines if "eval:" in line], lines
    assert [step for step, _ in trainer.eval_history] == [1, 2]  # evaluated, silently
