"""Tests of t2t.optim: Adafactor against an independent NumPy Adafactor, schedule values at known
steps, microbatch accumulation equal to one big batch, and parameter labels that freeze."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from t2t import optim
from t2t.nn import axes
from t2t.partitioning import param_path

# ----------------------------------------------------------------------------------------------
# Adafactor against the formulas (Shazeer and Stern 2018, Algorithms 4 and 5; T5 settings)
# ----------------------------------------------------------------------------------------------


class NumpyAdafactor:
    """T5's Adafactor written from the paper's equations, in float64.

    Factored second moments use row and column *sums* (R = rows of G^2 summed over columns,
    C = columns summed over rows, V = R C / sum(R)) rather than the means optax uses.
    """

    def __init__(self, params, eps1=1e-30, eps2=1e-3, clip=1.0, decay=0.8, min_factor=128):
        self.eps1, self.eps2, self.clip = eps1, eps2, clip
        self.decay, self.min_factor = decay, min_factor
        self.stats = {}
        for name, x in params.items():
            if self._factored(x.shape):
                self.stats[name] = (np.zeros(x.shape[0]), np.zeros(x.shape[1]))
            else:
                self.stats[name] = np.zeros(x.shape)
        self.clipped = 0

    def _factored(self, shape):
        return len(shape) == 2 and min(shape) >= self.min_factor

    def step(self, t, params, grads, lr):
        beta2 = 1.0 - (t + 1) ** (-self.decay)
        new = {}
        for name, x in params.items():
            g2 = grads[name] ** 2 + self.eps1
            if self._factored(x.shape):
                r, c = self.stats[name]
                r = beta2 * r + (1 - beta2) * g2.sum(axis=1)
                c = beta2 * c + (1 - beta2) * g2.sum(axis=0)
                self.stats[name] = (r, c)
                v = np.outer(r, c) / r.sum()
            else:
                v = beta2 * self.stats[name] + (1 - beta2) * g2
                self.stats[name] = v
            u = grads[name] / np.sqrt(v)
            rms_u = np.sqrt(np.mean(u**2))
            if rms_u > self.clip:
                self.clipped += 1
            u = u / max(1.0, rms_u / self.clip)
            step_size = lr * max(self.eps2, np.sqrt(np.mean(x**2)))
            new[name] = x - step_size * u
        return new


def test_adafactor_matches_numpy_reference_over_several_steps():
    rng = np.random.default_rng(0)
    params = {
        "factored": rng.normal(0, 0.5, (128, 160)),  # both dims >= 128
        "unfactored": rng.normal(0, 0.5, (96, 200)),  # second-largest dim 96 < 128
        "tiny_vector": rng.normal(0, 1e-5, (40,)),  # RMS < 1e-3: the step uses epsilon2
    }
    num_steps = 6
    grads = [
        {k: rng.normal(0, 1.0, v.shape) * (25.0 if t == 3 else 1.0) for k, v in params.items()}
        for t in range(num_steps)
    ]
    # Make the factored gradient's rows uneven so the factored estimate differs from the full one.
    for g in grads:
        g["factored"] *= np.linspace(0.1, 3.0, 128)[:, None]
    schedule = optim.inverse_sqrt(warmup_steps=3)
    tx = optim.adafactor(schedule)

    ref = NumpyAdafactor(params)
    expected = dict(params)
    for t in range(num_steps):
        expected = ref.step(t, expected, grads[t], lr=1.0 / math.sqrt(max(t, 3)))
    assert ref.clipped > 0, "the reference run must exercise update clipping"

    state_params = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), params)
    opt_state = tx.init(state_params)
    update = jax.jit(tx.update)
    for t in range(num_steps):
        g = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), grads[t])
        updates, opt_state = update(g, opt_state, state_params)
        state_params = optax.apply_updates(state_params, updates)

    for name in params:
        np.testing.assert_allclose(state_params[name], expected[name], rtol=2e-5, atol=1e-6)
        assert not np.allclose(state_params[name], params[name])


def test_adafactor_factors_only_params_with_two_large_dims():
    tx = optim.adafactor(0.01)
    params = {"big": jnp.zeros((128, 256)), "narrow": jnp.zeros((127, 256)), "vec": jnp.zeros(512)}
    factored_state = tx.init(params)[0]
    assert factored_state.v_row["big"].shape == (128,)
    assert factored_state.v_col["big"].shape == (256,)
    assert factored_state.v["big"].shape == (1,)
    assert factored_state.v["narrow"].shape == (127, 256)
    assert factored_state.v["vec"].shape == (512,)


# ----------------------------------------------------------------------------------------------
# Schedules
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "step, expected",
    [(0, 0.01), (1, 0.01), (5_000, 0.01), (10_000, 0.01), (40_000, 0.005), (1_000_000, 0.001)],
)
def test_inverse_sqrt_is_t5_pretraining_rate(step, expected):
    assert float(optim.inverse_sqrt()(step)) == pytest.approx(expected, rel=1e-6)


def test_inverse_sqrt_warmup_is_configurable():
    schedule = optim.inverse_sqrt(warmup_steps=100, scale=2.0)
    assert float(schedule(50)) == pytest.approx(0.2)
    assert float(schedule(400)) == pytest.approx(0.1)
    with pytest.raises(ValueError, match="warmup_steps"):
        optim.inverse_sqrt(warmup_steps=0)


def test_constant_is_fine_tuning_rate():
    schedule = optim.constant()
    assert float(schedule(0)) == pytest.approx(1e-3)
    assert float(schedule(262_144)) == pytest.approx(1e-3)


@pytest.mark.parametrize(
    "step, linear, cosine",
    [
        (0, 0.0, 0.0),
        (5, 0.5, 0.5),
        (10, 1.0, 1.0),
        (35, 0.75, (1 + math.cos(math.pi / 4)) / 2),
        (60, 0.5, 0.5),
        (110, 0.0, 0.0),
        (200, 0.0, 0.0),
    ],
)
def test_warmup_then_decay(step, linear, cosine):
    assert float(optim.warmup_linear_decay(1.0, 10, 110)(step)) == pytest.approx(linear, abs=1e-6)
    assert float(optim.warmup_cosine_decay(1.0, 10, 110)(step)) == pytest.approx(cosine, abs=1e-6)


def test_slanted_triangular_follows_howard_and_ruder():
    peak, total, cut_frac, ratio = 0.01, 1000, 0.1, 32
    cut = math.floor(total * cut_frac)

    def formula(t):  # ULMFiT, equation (3)
        p = t / cut if t < cut else 1 - (t - cut) / (cut * (1 / cut_frac - 1))
        return peak * (1 + p * (ratio - 1)) / ratio

    schedule = optim.slanted_triangular(peak, total, cut_frac, ratio)
    for t in [0, 1, 50, 99, 100, 101, 550, 999, 1000]:
        assert float(schedule(t)) == pytest.approx(formula(t), rel=1e-5), t
    assert float(schedule(100)) == pytest.approx(peak)
    assert float(schedule(0)) == pytest.approx(peak / ratio)


def test_schedule_argument_errors():
    with pytest.raises(ValueError, match="warmup_steps=20, total_steps=10"):
        optim.warmup_linear_decay(1.0, 20, 10)
    with pytest.raises(ValueError, match="cut_frac"):
        optim.slanted_triangular(1.0, 5, cut_frac=0.1)


# ----------------------------------------------------------------------------------------------
# Gradient accumulation
# ----------------------------------------------------------------------------------------------

B, T, D, V = 8, 5, 6, 7


def make_loss_fn(normalizer):
    """A token-level softmax regression with weights, normalized like t2t.losses does."""

    def loss_fn(params, batch, rng):
        del rng
        logits = jnp.einsum("BTD,DV->BTV", batch["x"], params["w"]) + params["b"]
        token_loss = -jnp.take_along_axis(
            jax.nn.log_softmax(logits), batch["y"][..., None], axis=-1
        )[..., 0]  # [B, T]
        weights = batch["weights"]
        total = jnp.sum(token_loss * weights)
        aux = {"num_tokens": jnp.sum(weights).astype(jnp.int32), "loss_sum": total}
        if normalizer == "num_real_target_tokens":
            denominator = jnp.sum(weights)
            aux[optim.LOSS_DENOMINATOR] = denominator
        elif normalizer == "num_total_target_tokens":
            denominator = jnp.asarray(weights.size, jnp.float32)
            aux[optim.LOSS_DENOMINATOR] = denominator
        else:  # a constant factor: each microbatch's loss is its share of the batch loss
            denominator = 233.0
        return total / denominator, aux

    return loss_fn


@pytest.fixture(scope="module")
def regression_batch():
    rng = np.random.default_rng(1)
    lengths = np.array([5, 1, 3, 5, 2, 4, 0, 5])  # uneven padding: microbatch token counts differ
    batch = {
        "x": jnp.asarray(rng.normal(size=(B, T, D)), jnp.float32),
        "y": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32),
        "weights": jnp.asarray(np.arange(T)[None, :] < lengths[:, None], jnp.float32),
    }
    params = {
        "w": jnp.asarray(rng.normal(size=(D, V)), jnp.float32),
        "b": jnp.asarray(rng.normal(size=(V,)), jnp.float32),
    }
    return params, batch


@pytest.mark.parametrize(
    "normalizer", ["num_real_target_tokens", "num_total_target_tokens", "constant"]
)
def test_microbatches_equal_one_big_batch(regression_batch, normalizer):
    params, batch = regression_batch
    loss_fn = make_loss_fn(normalizer)
    rng = jax.random.key(0)
    run = jax.jit(optim.accumulate_gradients, static_argnums=(0, 4))
    loss_1, aux_1, grads_1 = run(loss_fn, params, batch, rng, 1)
    loss_4, aux_4, grads_4 = run(loss_fn, params, batch, rng, 4)

    np.testing.assert_allclose(loss_4, loss_1, rtol=1e-6)
    for name in params:
        np.testing.assert_allclose(grads_4[name], grads_1[name], rtol=1e-5, atol=1e-7)
    assert int(aux_4["num_tokens"]) == int(aux_1["num_tokens"]) == 25
    np.testing.assert_allclose(aux_4["loss_sum"], aux_1["loss_sum"], rtol=1e-6)

    tx = optim.adafactor(0.01, min_dim_size_to_factor=2)
    state = tx.init(params)
    update_1, _ = tx.update(grads_1, state, params)
    update_4, _ = tx.update(grads_4, state, params)
    for name in params:
        np.testing.assert_allclose(update_4[name], update_1[name], rtol=1e-5, atol=1e-8)


def test_naive_mean_of_microbatch_losses_would_differ(regression_batch):
    """Guards the test above: uneven token counts make the weighting matter."""
    params, batch = regression_batch
    loss_fn = jax.jit(make_loss_fn("num_real_target_tokens"))
    full, _ = loss_fn(params, batch, None)
    parts = [loss_fn(params, jax.tree.map(lambda x: x[j::4], batch), None)[0] for j in range(4)]
    assert abs(float(np.mean(parts)) - float(full)) > 1e-3


def test_accumulation_over_nnx_state_without_rng():
    """The trainer's case: parameters as an nnx.State of Variables, deterministic passes."""
    graphdef, params = nnx.split(TwoStacks(nnx.Rngs(0)))
    x = jnp.asarray(np.random.default_rng(2).normal(size=(6, 4)), jnp.float32)

    def loss_fn(params, batch, rng):
        assert rng is None
        model = nnx.merge(graphdef, params)
        h = (batch["x"] * model.encoder.scale) @ model.encoder.kernel  # [B, 3]
        per_example = jnp.sum(h**2, axis=-1)
        return jnp.sum(per_example) / 6.0, {"count": jnp.ones((), jnp.int32) * h.shape[0]}

    loss_1, aux_1, grads_1 = optim.accumulate_gradients(loss_fn, params, {"x": x}, None, 1)
    loss_3, aux_3, grads_3 = optim.accumulate_gradients(loss_fn, params, {"x": x}, None, 3)
    np.testing.assert_allclose(loss_3, loss_1, rtol=1e-6)
    assert int(aux_3["count"]) == int(aux_1["count"]) == 6
    for leaf_1, leaf_3 in zip(jax.tree.leaves(grads_1), jax.tree.leaves(grads_3)):
        np.testing.assert_allclose(leaf_3, leaf_1, rtol=1e-5, atol=1e-6)
    assert jax.tree.structure(grads_3) == jax.tree.structure(params)


def test_microbatch_split_is_strided_and_checked():
    batch = {"x": jnp.arange(6)}
    assert optim._split_microbatches(batch, 3)["x"].tolist() == [[0, 3], [1, 4], [2, 5]]
    with pytest.raises(ValueError, match="batch size 6, not divisible into 4"):
        optim._split_microbatches(batch, 4)


# ----------------------------------------------------------------------------------------------
# Parameter labels
# ----------------------------------------------------------------------------------------------


class Block(nnx.Module):
    def __init__(self, rngs):
        self.kernel = nnx.Param(
            jax.random.normal(rngs.params(), (4, 3)),
            sharding_names=(axes.EMBED, axes.MLP),
            eager_sharding=False,
        )
        self.scale = nnx.Param(jnp.ones(4), sharding_names=(axes.EMBED,), eager_sharding=False)


class TwoStacks(nnx.Module):
    def __init__(self, rngs):
        self.encoder = Block(rngs)
        self.decoder = Block(rngs)


def toy_loss(params, graphdef):
    model = nnx.merge(graphdef, params)
    x = jnp.arange(4.0)
    return (
        jnp.sum((x * model.encoder.scale) @ model.encoder.kernel) ** 2
        + jnp.sum((x * model.decoder.scale) @ model.decoder.kernel) ** 2
    )


def train(tx, params, graphdef, steps=2):
    state = tx.init(params)
    for _ in range(steps):
        grads = jax.grad(toy_loss)(params, graphdef)
        updates, state = tx.update(grads, state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_param_labels_by_regex_and_logical_axes():
    _, params = nnx.split(TwoStacks(nnx.Rngs(0)))
    rules = [
        (r"^encoder/", "frozen"),
        (lambda path, names: names == (axes.EMBED,), "norms"),
    ]
    labels = optim.param_labels(params, rules)
    flat = {param_path(p): v for p, v in jax.tree_util.tree_flatten_with_path(labels)[0]}
    assert flat == {
        "decoder/kernel": "trainable",
        "decoder/scale": "norms",
        "encoder/kernel": "frozen",
        "encoder/scale": "frozen",
    }


def test_freeze_keeps_frozen_params_and_trains_the_rest():
    graphdef, params = nnx.split(TwoStacks(nnx.Rngs(0)))
    tx = optim.freeze(optim.adafactor(0.1), [r"^encoder/"])
    new_params, state = train(tx, params, graphdef)
    for name in ("kernel", "scale"):
        before, after = params["encoder"][name].value, new_params["encoder"][name].value
        np.testing.assert_array_equal(after, before)
        before, after = params["decoder"][name].value, new_params["decoder"][name].value
        assert not np.allclose(after, before)
    # Frozen parameters carry no optimizer statistics.
    adafactor_state = state.inner_states[optim.TRAINABLE].inner_state[0]
    assert jax.tree.leaves(adafactor_state.v["encoder"]) == []
    assert len(jax.tree.leaves(adafactor_state.v["decoder"])) == 2


def test_labels_follow_parameters_added_later():
    """Adapters: a parameter added after the rules were written is labelled by them."""
    model = TwoStacks(nnx.Rngs(0))
    model.decoder.adapter = nnx.Param(
        jnp.zeros(3), sharding_names=(axes.MLP,), eager_sharding=False
    )
    graphdef, params = nnx.split(model)

    def loss(params, graphdef):
        m = nnx.merge(graphdef, params)
        return toy_loss(params, graphdef) + jnp.sum((m.decoder.adapter - 1.0) ** 2)

    tx = optim.label_transforms(
        {"adapter": optax.sgd(0.1), "frozen": optax.set_to_zero()},
        [(r"/adapter$", "adapter")],
        default="frozen",
    )
    state = tx.init(params)
    grads = jax.grad(loss)(params, graphdef)
    updates, state = tx.update(grads, state, params)
    new = optax.apply_updates(params, updates)
    np.testing.assert_allclose(new["decoder"]["adapter"].value, 0.2 * np.ones(3))
    np.testing.assert_array_equal(new["decoder"]["kernel"].value, params["decoder"]["kernel"].value)


def test_label_transforms_names_missing_labels():
    with pytest.raises(ValueError, match=r"\['frozen'\] have no transformation"):
        optim.label_transforms({"trainable": optax.sgd(0.1)}, [(r"^encoder/", "frozen")])


def test_importing_the_optimizer_loads_no_network():
    """`t2t.optim` reads parameter paths through the leaf `t2t.pytrees`, not the partitioner, so
    importing it loads neither the network nor the partitioning package."""
    import subprocess
    import sys

    code = (
        "import sys, t2t.optim; "
        "print(sorted(m for m in ('t2t.nn', 't2t.partitioning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]"
