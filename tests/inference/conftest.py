"""Fixtures for the evaluation, inference and release tests: a tiny vocabulary, tiny networks and
model directories written directly with `CheckpointManager` (the layout `t2t train` writes)."""

import json
import os

import jax
import numpy as np
import pytest
from flax import nnx

from t2t import decoding, models, nn
from t2t.checkpoints.manager import CheckpointManager

NUM_PIECES = 412  # + 100 sentinels = 512 ids


@pytest.fixture(scope="session")
def vocabulary_file(tmp_path_factory):
    """A SentencePiece model trained on part of Python's documentation (about a second)."""
    import pydoc_data.topics

    from t2t.data import vocab

    documents = [pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics)[:40]]
    path = str(tmp_path_factory.mktemp("vocab") / "tiny.model")
    return vocab.train_sentencepiece(documents, path, num_pieces=NUM_PIECES)


@pytest.fixture(scope="session")
def vocabulary(vocabulary_file):
    from t2t.data import vocab

    return vocab.load_vocabulary(vocabulary_file)


def tiny_config(**overrides):
    fields = dict(
        vocab_size=512,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.0,
    )
    fields.update(overrides)
    return nn.get_preset("tiny", **fields)


def random_params(config, seed):
    """Parameters with spread-out logits (so greedy outputs vary with the input), from numpy."""
    rng = np.random.default_rng(seed)

    def leaf(path, x):
        name = jax.tree_util.keystr(path)
        if "scale" in name:
            return np.ones(x.shape, x.dtype)
        std = 1.0 if "embedding" in name or "rel_embedding" in name else x.shape[0] ** -0.5
        return (rng.normal(size=x.shape) * std).astype(x.dtype)

    abstract = models.model_for(config).abstract_params()
    return jax.tree_util.tree_map_with_path(leaf, abstract)


def write_model_dir(
    path, config, params_by_step, vocabulary_file, *, task="builtin_span_corruption"
):
    """A model directory as `t2t train` leaves it: checkpoints with the brief's metadata keys,
    config.gin and model_config.json."""
    import dataclasses

    manager = CheckpointManager(path, keep=None, async_save=False)
    for step, params in sorted(params_by_step.items()):
        manager.save(
            step,
            params=params,
            metadata={
                "config": config,
                "vocabulary": {"sentencepiece_model_file": vocabulary_file, "extra_ids": 100},
                "mixture_or_task": task,
                "task_feature_lengths": {"inputs": 64, "targets": 16},
                "tokens_seen": 1000 * step,
                "examples_seen": 10 * step,
                "architecture": config.architecture,
            },
        )
    manager.close()
    with open(os.path.join(path, "config.gin"), "w") as f:
        f.write("# operative gin config of the test run\nMODEL_DIR = 'test'\n")
    with open(os.path.join(path, "model_config.json"), "w") as f:
        json.dump(dataclasses.asdict(config), f)
    return str(path)


_FORWARDS = {}


def _forward(model):
    """The full teacher-forced forward pass, jitted once per network config."""
    if model.config not in _FORWARDS:
        _FORWARDS[model.config] = jax.jit(lambda p, x, y: model.module(p)(x, y))
    return _FORWARDS[model.config]


def uncached_greedy(model, params_list, input_ids, max_length):
    """Greedy decoding by full forward passes (no cache), logits averaged over `params_list`:
    the independent reference for single models and ensembles. -> list of token lists."""
    forward = _forward(model)
    inputs = np.zeros((len(input_ids), max(map(len, input_ids))), np.int32)
    for row, ids in enumerate(input_ids):
        inputs[row, : len(ids)] = ids
    outputs = np.zeros((len(input_ids), max_length), np.int32)
    done = np.zeros(len(input_ids), bool)
    for t in range(max_length):
        # NOTE: the decoder is causal, so padding the inputs after t does not change step t.
        decoder_inputs = np.pad(outputs[:, :-1], ((0, 0), (1, 0)))  # [B, T]
        logits = np.mean(
            [np.asarray(forward(p, inputs, decoder_inputs))[:, t] for p in params_list], axis=0
        )
        token = np.where(done, 0, np.argmax(logits, axis=-1))
        outputs[:, t] = token
        done |= token == decoding.EOS_ID
        if done.all():
            break
    return [row[: list(row).index(1) + 1] if 1 in row else row for row in outputs.tolist()]


@pytest.fixture(scope="session")
def config():
    return tiny_config()


@pytest.fixture(scope="session")
def params_a(config):
    return random_params(config, 0)


@pytest.fixture(scope="session")
def params_b(config):
    return random_params(config, 1)


def is_state(x):
    return isinstance(x, nnx.State)
