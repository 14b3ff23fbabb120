"""Shared helpers of the network tests."""

import jax
import numpy as np
import pytest
from flax import nnx

import t2t.nn as tn


def random_model(config, seed=0):
    """A model with random parameters set from numpy, skipping the jax initializers.

    Initializers compile once per parameter shape (tens of seconds on a busy 2-core machine);
    invariance tests need only some well-scaled values: kernels with std fan_in**-0.5, the
    embedding with std 1, norm scales near 1. `test_layers.py` tests the real initializers.
    """
    abstract = nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    rng = np.random.RandomState(seed)

    def fill(path, leaf):
        name = path[-1].key if hasattr(path[-1], "key") else str(path[-1])
        if name == "scale":
            return (1 + 0.1 * rng.randn(*leaf.shape)).astype(leaf.dtype)
        std = 1.0 if name in ("embedding", "rel_embedding") else leaf.shape[0] ** -0.5
        return (std * rng.randn(*leaf.shape)).astype(leaf.dtype)

    pure = jax.tree_util.tree_map_with_path(fill, state.to_pure_dict())
    nnx.replace_by_pure_dict(state, pure)
    return nnx.merge(graphdef, state)


@pytest.fixture(scope="session")
def make_model():
    return random_model
