"""Cross-entropy with z-loss and the loss normalizing factors, against direct numpy formulas."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import losses


def numpy_token_losses(logits, targets, z_loss):
    logits = logits.astype(np.float64)
    log_z = np.log(np.sum(np.exp(logits), -1))
    target_logits = np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    return log_z - target_logits + z_loss * log_z**2, z_loss * log_z**2


@pytest.fixture(scope="module")
def batch():
    rng = np.random.RandomState(0)
    logits = (rng.randn(3, 5, 11) * 4).astype(np.float32)
    targets = rng.randint(1, 11, (3, 5))
    targets[1, 3:] = 0
    targets[2, 1:] = 0
    return logits, targets


def test_worked_example_from_the_docstring():
    logits = jnp.array([[[0.0, np.log(3.0)], [0.0, np.log(3.0)]]])
    targets = jnp.array([[1, 1]])
    loss, z = losses.cross_entropy_with_z_loss(logits, targets, z_loss=1e-4)
    np.testing.assert_allclose(z, [[1e-4 * np.log(4) ** 2] * 2], rtol=1e-6)
    np.testing.assert_allclose(loss[0, 0], np.log(4 / 3) + 1e-4 * np.log(4) ** 2, rtol=1e-6)
    np.testing.assert_allclose(loss[0, 0], 0.2877 + 1.922e-4, rtol=1e-4)
    total, _ = losses.compute_weighted_loss(
        logits, targets, jnp.array([[1.0, 0.0]]), loss_normalizing_factor="num_total_target_tokens"
    )
    np.testing.assert_allclose(total, (0.2877 + 1.922e-4) / 2, rtol=1e-4)


def test_token_losses_match_numpy(batch):
    logits, targets = batch
    loss, z = losses.cross_entropy_with_z_loss(jnp.asarray(logits), jnp.asarray(targets), 1e-4)
    expected_loss, expected_z = numpy_token_losses(logits, targets, 1e-4)
    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    np.testing.assert_allclose(z, expected_z, rtol=1e-5)
    plain, zero = losses.cross_entropy_with_z_loss(jnp.asarray(logits), jnp.asarray(targets))
    np.testing.assert_allclose(plain, expected_loss - expected_z, rtol=1e-5)
    assert not np.any(zero)


def test_bfloat16_logits_are_computed_in_float32(batch):
    logits, targets = batch
    loss, _ = losses.cross_entropy_with_z_loss(jnp.asarray(logits, jnp.bfloat16), targets, 1e-4)
    assert loss.dtype == jnp.float32
    rounded = np.asarray(jnp.asarray(logits, jnp.bfloat16), np.float32)
    np.testing.assert_allclose(loss, numpy_token_losses(rounded, targets, 1e-4)[0], rtol=1e-5)


@pytest.mark.parametrize(
    "mode", [None, 233472.0, "num_real_target_tokens", "num_total_target_tokens"]
)
def test_normalizing_modes(batch, mode):
    logits, targets = batch
    weights = (targets > 0).astype(np.float32)
    token_loss, token_z = numpy_token_losses(logits, targets, 1e-4)
    divisor = {
        None: 1.0,
        233472.0: 233472.0,
        "num_real_target_tokens": weights.sum(),
        "num_total_target_tokens": 15.0,
    }[mode]
    loss, aux = losses.compute_weighted_loss(
        jnp.asarray(logits), jnp.asarray(targets), z_loss=1e-4, loss_normalizing_factor=mode
    )
    np.testing.assert_allclose(loss, np.sum(token_loss * weights) / divisor, rtol=1e-5)
    np.testing.assert_allclose(aux["z_loss_sum"], np.sum(token_z * weights), rtol=1e-5)
    np.testing.assert_allclose(
        aux["cross_ent_sum"], np.sum((token_loss - token_z) * weights), rtol=1e-5
    )
    assert float(aux["weight_sum"]) == weights.sum() == 9
    # Only a batch-dependent factor is reported (it adds up over microbatches; constants do not).
    if isinstance(mode, str):
        assert float(aux[losses.LOSS_DENOMINATOR]) == pytest.approx(divisor)
    else:
        assert losses.LOSS_DENOMINATOR not in aux


@pytest.mark.parametrize(
    "mode", [None, 233472.0, "num_real_target_tokens", "num_total_target_tokens"]
)
def test_aux_sums_add_up_over_row_splits(batch, mode):
    """The aux of two halves of a batch sum to the aux of the batch; the loss follows from them."""
    logits, targets = batch
    whole_loss, whole = losses.compute_weighted_loss(logits, targets, loss_normalizing_factor=mode)
    parts = [
        losses.compute_weighted_loss(logits[rows], targets[rows], loss_normalizing_factor=mode)
        for rows in (slice(0, 1), slice(1, 3))
    ]
    for key, value in whole.items():
        np.testing.assert_allclose(sum(float(aux[key]) for _, aux in parts), value, rtol=1e-5)
    divisor = whole.get(losses.LOSS_DENOMINATOR, mode or 1.0)
    np.testing.assert_allclose(
        (whole["cross_ent_sum"] + whole["z_loss_sum"]) / divisor, whole_loss, rtol=1e-6
    )


def test_no_real_target_token_gives_zero_loss_not_nan(batch):
    logits, targets = batch
    loss, aux = losses.compute_weighted_loss(
        logits,
        targets,
        np.zeros(targets.shape, np.float32),
        loss_normalizing_factor="num_real_target_tokens",
    )
    assert float(loss) == 0.0 and float(aux[losses.LOSS_DENOMINATOR]) == 0.0


def test_explicit_weights_are_used(batch):
    logits, targets = batch
    weights = np.random.RandomState(1).rand(3, 5).astype(np.float32)
    loss, _ = losses.compute_weighted_loss(
        jnp.asarray(logits), jnp.asarray(targets), jnp.asarray(weights), z_loss=0.0
    )
    expected = np.sum(numpy_token_losses(logits, targets, 0.0)[0] * weights)
    np.testing.assert_allclose(loss, expected, rtol=1e-5)


def test_gradient_equals_one_hot_reference(batch):
    logits, targets = batch
    weights = (targets > 0).astype(np.float32)

    def one_hot_reference(logits):
        one_hot = jax.nn.one_hot(targets, logits.shape[-1])
        log_z = jax.nn.logsumexp(logits, -1)
        cross_entropy = -jnp.sum(one_hot * jax.nn.log_softmax(logits), -1)
        return jnp.sum((cross_entropy + 1e-4 * log_z**2) * weights) / weights.sum()

    def ours(logits):
        return losses.compute_weighted_loss(
            logits,
            jnp.asarray(targets),
            z_loss=1e-4,
            loss_normalizing_factor="num_real_target_tokens",
        )[0]

    np.testing.assert_allclose(
        jax.grad(ours)(jnp.asarray(logits)),
        jax.grad(one_hot_reference)(jnp.asarray(logits)),
        atol=1e-6,
    )


def _stored_label_arrays(loss, logits) -> list:
    """[B, T, V] arrays of the compiled gradient's top level (stored in memory) that are not
    floats: a one-hot, or a label comparison kept between kernels."""
    from t2t.aot import hlo

    text = jax.jit(jax.grad(loss)).lower(jnp.asarray(logits)).compile().as_text()
    module = hlo.parse_module(text)
    dims = "[" + ",".join(map(str, logits.shape)) + "]"
    return [
        i
        for i in module.computations[module.entry].instructions
        if dims in i.shape and not i.shape.startswith(("f32", "bf16", "f16", "f64", "("))
    ]


def _scatters(loss, logits) -> list:
    """The scatter equations of the gradient's jaxpr, nested jaxprs included."""
    jaxpr = jax.make_jaxpr(jax.grad(loss))(jnp.asarray(logits)).jaxpr
    return [e for e in _equations(jaxpr) if "scatter" in e.primitive.name]


def _equations(jaxpr):
    """Every equation of `jaxpr` and of the jaxprs its equations hold (jit, cond, scan, ...)."""
    for equation in jaxpr.eqns:
        yield equation
        for value in equation.params.values():
            for inner in value if isinstance(value, (list, tuple)) else (value,):
                inner = getattr(inner, "jaxpr", inner)  # a ClosedJaxpr's Jaxpr
                if hasattr(inner, "eqns"):
                    yield from _equations(inner)


def test_no_one_hot_tensor_and_no_scatter_in_the_loss_or_its_gradient(batch):
    """Labels stay integers: the target's logit is selected by a comparison that XLA fuses into
    the reductions (never stored), and the backward pass scatters nothing (a gathered target
    logit's gradient is a scatter into a zeroed [B, T, V] array)."""
    logits, targets = batch

    def loss(logits):
        return losses.compute_weighted_loss(logits, jnp.asarray(targets))[0]

    assert _stored_label_arrays(loss, logits) == []
    assert _scatters(loss, logits) == []


def test_the_checks_see_a_gathered_target_logit_and_a_nested_one_hot(batch):
    logits, targets = batch

    def gathered(logits):
        picked = jnp.take_along_axis(
            jax.nn.log_softmax(logits), jnp.asarray(targets)[..., None], -1
        )
        return -picked.sum()

    assert _scatters(gathered, logits)
    # jax.nn.one_hot is a jit of its own: the jaxpr walk enters it.
    one_hot = jax.make_jaxpr(jax.nn.one_hot, static_argnums=1)(jnp.asarray(targets), 11).jaxpr
    assert any(e.primitive.name == "eq" for e in _equations(one_hot))
    assert not any(e.primitive.name == "eq" for e in one_hot.eqns)  # the top level alone


@pytest.mark.parametrize(
    "mode, message",
    [("num_tokens", "not a known mode"), (0.0, "positive number"), (-3, "positive number")],
)
def test_bad_normalizing_factor(batch, mode, message):
    logits, targets = batch
    with pytest.raises(ValueError, match=message):
        losses.compute_weighted_loss(logits, targets, loss_normalizing_factor=mode)


def test_shape_mismatch_is_explained(batch):
    logits, targets = batch
    with pytest.raises(ValueError, match=r"logits must be \[B, T, V\]"):
        losses.compute_weighted_loss(logits, targets[:, :4])
    with pytest.raises(ValueError, match="weights"):
        losses.compute_weighted_loss(logits, targets, np.ones((3, 4)))


def numpy_smoothed_losses(logits, targets, smoothing, z_loss):
    """Cross-entropy of the smoothed one-hot targets minus their entropy, with a one-hot."""
    logits = logits.astype(np.float64)
    vocab = logits.shape[-1]
    on, off = 1 - smoothing, smoothing / (vocab - 1)
    soft = np.where(np.arange(vocab) == targets[..., None], on, off)
    log_z = np.log(np.sum(np.exp(logits), -1))
    log_probs = logits - log_z[..., None]
    entropy = -np.sum(soft[0, 0] * np.log(soft[0, 0]))
    return -np.sum(soft * log_probs, -1) - entropy + z_loss * log_z**2


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing_matches_numpy(batch, smoothing):
    logits, targets = batch
    got, _ = losses.cross_entropy_with_z_loss(
        jnp.asarray(logits), jnp.asarray(targets), z_loss=1e-4, label_smoothing=smoothing
    )
    want = numpy_smoothed_losses(logits, targets, smoothing, 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # Predicting the smoothed distribution itself scores 0 (z-loss off).
    vocab = logits.shape[-1]
    perfect = np.log(
        np.where(np.arange(vocab) == targets[..., None], 1 - smoothing, smoothing / (vocab - 1))
    )
    zero, _ = losses.cross_entropy_with_z_loss(
        jnp.asarray(perfect, jnp.float32), jnp.asarray(targets), label_smoothing=smoothing
    )
    np.testing.assert_allclose(zero, 0.0, atol=1e-5)
    with pytest.raises(ValueError, match="label_smoothing"):
        losses.cross_entropy_with_z_loss(
            jnp.asarray(logits), jnp.asarray(targets), label_smoothing=1.0
        )


def test_average_per_sequence_matches_numpy(batch):
    logits, targets = batch
    weights = (targets > 0).astype(np.float32)
    token, _ = numpy_token_losses(logits, targets, 1e-4)
    # Unpacked: the mean over rows of each row's mean token loss.
    want = np.mean([np.sum(token[r] * weights[r]) / np.sum(weights[r]) for r in range(3)])
    got, aux = losses.compute_weighted_loss(
        jnp.asarray(logits),
        jnp.asarray(targets),
        jnp.asarray(weights),
        loss_normalizing_factor="average_per_sequence",
    )
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert float(aux[losses.LOSS_DENOMINATOR]) == pytest.approx(3.0)
    assert float(aux["weight_sum"]) == weights.sum()  # token counts stay token counts
    # Packed: row 0 holds two sequences (segments 1 and 2), row 1 one, row 2 one.
    segments = np.array([[1, 1, 2, 2, 2], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    per_sequence = []
    for r in range(3):
        for s in set(segments[r][weights[r] > 0]):
            mask = (segments[r] == s) * weights[r]
            per_sequence.append(np.sum(token[r] * mask) / np.sum(mask))
    got, aux = losses.compute_weighted_loss(
        jnp.asarray(logits),
        jnp.asarray(targets),
        jnp.asarray(weights),
        loss_normalizing_factor="average_per_sequence",
        segment_ids=jnp.asarray(segments),
    )
    np.testing.assert_allclose(got, np.mean(per_sequence), rtol=1e-5)
    assert float(aux[losses.LOSS_DENOMINATOR]) == pytest.approx(len(per_sequence)) == 4
