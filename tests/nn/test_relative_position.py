"""The relative position bucket function: docs/spec.md check values and HF transformers on a grid."""

import numpy as np
import pytest
import torch
from transformers.models.t5.modeling_t5 import T5Attention

from t2t.nn.relative_position import relative_position_bucket


def buckets(relative, bidirectional, num_buckets=32, max_distance=128):
    return np.asarray(
        relative_position_bucket(
            np.asarray(relative),
            bidirectional=bidirectional,
            num_buckets=num_buckets,
            max_distance=max_distance,
        )
    )


def test_bidirectional_small_distances_get_their_own_bucket():
    # relative = key_pos - query_pos: keys before the query in [0, 16), after in [16, 32).
    assert buckets([0, -1, -7, 1, 7], True).tolist() == [0, 1, 7, 17, 23]


def test_bidirectional_saturates_at_91():
    assert buckets([-90, -91, -500], True).tolist() == [14, 15, 15]
    assert buckets([90, 91, 500], True).tolist() == [30, 31, 31]


def test_bidirectional_never_uses_bucket_16():
    used = set(buckets(np.arange(-1000, 1001), True).tolist())
    assert 16 not in used
    assert used == set(range(32)) - {16}


def test_causal_saturates_at_113_and_future_is_bucket_0():
    assert buckets([0, -5, -15, -16], False).tolist() == [0, 5, 15, 16]
    assert buckets([-112, -113, -10_000], False).tolist() == [30, 31, 31]
    assert buckets([1, 50, 1000], False).tolist() == [0, 0, 0]


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("num_buckets, max_distance", [(32, 128), (8, 20), (64, 256)])
def test_equals_hf_on_a_grid(bidirectional, num_buckets, max_distance):
    relative = np.arange(-700, 701)[:, None] + np.arange(0, 9)[None, :] * 37
    ours = buckets(relative, bidirectional, num_buckets, max_distance)
    theirs = T5Attention._relative_position_bucket(
        torch.tensor(relative),
        bidirectional=bidirectional,
        num_buckets=num_buckets,
        max_distance=max_distance,
    ).numpy()
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("path", ["one-hot matmul", "scatter-add"])
def test_the_tables_gradient_equals_the_gathers_scatter_add(path, monkeypatch):
    """`take_buckets` sums the table's gradient as a one-hot matmul (or, past its size limit,
    autodiff's scatter-add): both equal the gradient of the plain gather, and the gradient's
    program is the path asked for."""
    import jax
    import jax.numpy as jnp

    from t2t.nn import relative_position

    if path == "scatter-add":  # per-example positions past the one-hot limit
        monkeypatch.setattr(relative_position, "_ONE_HOT_ELEMENTS", 1000)
    rng = np.random.default_rng(0)
    positions = rng.integers(0, 200, (3, 40))
    buckets = relative_position_bucket(
        jnp.asarray(positions[:, None, :] - positions[:, :, None]), bidirectional=True
    )
    table = jnp.asarray(rng.normal(size=(6, 32)), jnp.float32)
    cotangent = jnp.asarray(rng.normal(size=(6, *buckets.shape)), jnp.float32)

    def loss(t):
        return jnp.sum(relative_position.take_buckets(t, buckets) * cotangent)

    program = str(jax.make_jaxpr(jax.grad(loss))(table))
    assert ("scatter-add" in program) == (path == "scatter-add"), program
    assert ("dot_general" in program) == (path == "one-hot matmul"), program
    got = jax.grad(loss)(table)
    want = jax.grad(lambda t: jnp.sum(jnp.take(t, buckets, axis=1) * cotangent))(table)
    np.testing.assert_array_equal(
        relative_position.take_buckets(table, buckets), jnp.take(table, buckets, axis=1)
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)  # sums of ~150 terms
