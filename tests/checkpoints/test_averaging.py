"""Checkpoint averaging equals the numpy mean of the chosen checkpoints' parameters."""

import jax
import numpy as np
import pytest

from t2t import models, nn
from t2t.checkpoints import averaging
from t2t.checkpoints.manager import CheckpointManager
from t2t.checkpoints.model_dir import ModelDir

CONFIG = nn.get_preset("tiny", vocab_size=256, num_encoder_layers=1, num_decoder_layers=1)
STEPS = (100, 200, 300, 400)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """A model directory with four checkpoints of differently seeded parameters."""
    directory = tmp_path_factory.mktemp("run")
    manager = CheckpointManager(directory, keep=None, async_save=False)
    pure, abstract = {}, models.model_for(CONFIG).abstract_params()
    for seed, step in enumerate(STEPS):
        rng = np.random.default_rng(seed)
        params = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(x.dtype), abstract)
        manager.save(step, params=params, metadata={"config": CONFIG, "tokens_seen": step * 10})
        pure[step] = jax.tree.map(np.asarray, params.to_pure_dict())
    manager.close()
    (directory / "config.gin").write_text("# the run's gin config\n")
    return directory, pure


def _numpy_mean(pure, steps):
    return jax.tree.map(lambda *xs: np.mean(np.stack(xs), axis=0), *[pure[s] for s in steps])


def _assert_close(actual, expected):
    flat_actual = jax.tree_util.tree_leaves_with_path(actual)
    flat_expected = dict(jax.tree_util.tree_leaves_with_path(expected))
    assert len(flat_actual) == len(flat_expected) > 0
    for path, value in flat_actual:
        np.testing.assert_allclose(
            np.asarray(value),
            flat_expected[path],
            rtol=1e-6,
            atol=1e-7,
            err_msg=jax.tree_util.keystr(path),
        )


def test_average_of_last_n_equals_numpy_mean(run_dir):
    directory, pure = run_dir
    averaged = averaging.average_checkpoints(directory, last=3)
    assert averaged.steps == [200, 300, 400]
    assert averaged.metadata["tokens_seen"] == 4000  # the latest averaged step's metadata
    _assert_close(averaged.params.to_pure_dict(), _numpy_mean(pure, [200, 300, 400]))
    # The mean differs from every single checkpoint (the test would pass vacuously otherwise).
    kernel = ("decoder", "logits_dense", "kernel")
    value = np.asarray(averaged.params.to_pure_dict()["decoder"]["logits_dense"]["kernel"])
    for step in STEPS:
        assert not np.allclose(value, pure[step][kernel[0]][kernel[1]][kernel[2]])


def test_averaged_checkpoint_round_trips_with_metadata(run_dir, tmp_path):
    directory, pure = run_dir
    averaged = averaging.average_checkpoints(directory, steps=[100, 400])
    output = averaging.write_averaged(tmp_path / "avg", averaged)
    written = ModelDir(output)
    assert written.steps() == [400]
    metadata = written.metadata()
    assert metadata["averaged_steps"] == [100, 400]
    assert metadata["averaged_from"] == str(directory)
    assert written.config() == CONFIG
    assert (tmp_path / "avg" / "config.gin").read_text() == "# the run's gin config\n"
    loaded = written.load()
    _assert_close(loaded.params.to_pure_dict(), _numpy_mean(pure, [100, 400]))
    with pytest.raises(ValueError, match="already holds checkpoints"):
        averaging.write_averaged(output, averaged)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(), "either steps"),
        (dict(steps=[100], last=2), "not both"),
        (dict(steps=[100, 150]), r"\[150\] not saved"),
        (dict(last=5), "between 1 and the 4"),
    ],
)
def test_bad_selection_is_explained(kwargs, match):
    with pytest.raises(ValueError, match=match):
        averaging.select_steps(list(STEPS), **kwargs)
