"""Scanned layers and rematerialization change how the network runs, never what it computes:
identical losses and gradients, exact layout conversion both ways, the same decoded tokens, the
same Adafactor training, and less memory for the backward pass with remat."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import t2t.nn as tn
from t2t import models, optim
from t2t.nn import axes, stacking

VOCAB = 120


def config(architecture="encoder_decoder", **overrides):
    layers = {"num_encoder_layers": 0} if architecture in ("decoder_only", "prefix_lm") else {}
    fields = dict(
        vocab_size=VOCAB,
        d_model=32,
        d_ff=64,
        d_kv=8,
        num_heads=4,
        num_encoder_layers=2,
        num_decoder_layers=2,
        dropout_rate=0.1,
    )
    return tn.get_preset("tiny", architecture=architecture, **{**fields, **layers, **overrides})


def batch(architecture, rows=2, inputs=10, targets=6, seed=0):
    rng = np.random.default_rng(seed)
    out = {
        "decoder_target_tokens": rng.integers(2, VOCAB, (rows, targets)),
        "decoder_loss_weights": np.ones((rows, targets)),
    }
    out["decoder_input_tokens"] = np.pad(out["decoder_target_tokens"][:, :-1], ((0, 0), (1, 0)))
    if architecture.startswith("encoder_decoder"):
        out["encoder_input_tokens"] = rng.integers(2, VOCAB, (rows, inputs))
    if architecture == "prefix_lm":
        out["decoder_causal_attention"] = np.tile(np.arange(targets) < 3, (rows, 1))
    return {
        k: jnp.asarray(v, jnp.float32 if k.endswith("weights") else jnp.int32)
        for k, v in out.items()
    }


def loss_and_grads(cfg, features, seed=0):
    model = models.model_for(cfg)
    params = model.init_params(jax.random.PRNGKey(seed))
    grad_fn = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))
    (loss, _), grads = grad_fn(params, features, jax.random.PRNGKey(7))  # dropout on
    return float(loss), tn.unstack_layers(nnx.to_pure_dict(grads))


@pytest.mark.parametrize(
    "architecture, variants",
    [
        (
            "encoder_decoder",
            (
                (False, "full"),  # scanned without remat: the decoding and Adafactor tests below
                (True, "dots_with_no_batch_dims"),
                (True, "full", True),  # unroll_layers
            ),
        ),
        ("encoder_decoder_shared", ((True, "full"), (True, "none", True))),
        ("decoder_only", ((False, "dots"), (True, "full"))),
        ("prefix_lm", ((True, "full"),)),
    ],
)
def test_scan_and_remat_give_the_same_loss_and_gradients(architecture, variants):
    features = batch(architecture)
    base = config(architecture)
    want_loss, want = loss_and_grads(base, features)
    for scan, remat, *unroll in variants:
        cfg = base.replace(scan_layers=scan, remat_policy=remat, unroll_layers=bool(unroll))
        loss, grads = loss_and_grads(cfg, features)
        assert loss == pytest.approx(want_loss, rel=1e-6), (scan, remat, unroll)
        assert jax.tree.structure(grads) == jax.tree.structure(want)
        for got, expected in zip(jax.tree.leaves(grads), jax.tree.leaves(want), strict=True):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def test_scanned_init_is_the_stacked_unscanned_init():
    flat = models.model_for(config()).init_params(jax.random.PRNGKey(3))
    scanned = models.model_for(config(scan_layers=True)).init_params(jax.random.PRNGKey(3))
    scanned = nnx.to_pure_dict(scanned)
    assert "layers" in scanned["encoder"] and "layers_0" not in scanned["encoder"]
    assert scanned["encoder"]["layers"]["mlp"]["wi_0"]["kernel"].shape == (2, 32, 64)
    expected = tn.stack_layers(nnx.to_pure_dict(flat))
    for got, want in zip(jax.tree.leaves(scanned), jax.tree.leaves(expected), strict=True):
        np.testing.assert_array_equal(got, want)


def test_stacked_parameters_carry_the_layers_axis_first():
    abstract = nnx.eval_shape(lambda: tn.build(config(scan_layers=True), nnx.Rngs(0)))
    kernel = abstract.encoder.layers.attention.query.kernel
    assert kernel.shape == (2, 32, 32)
    assert kernel.get_metadata()["out_sharding"] == (axes.LAYERS, axes.EMBED, axes.JOINED_KV)
    relpos = abstract.encoder.relpos_bias.rel_embedding  # per stack, not per layer
    assert axes.LAYERS not in relpos.get_metadata()["out_sharding"]


def test_layout_conversion_round_trips_exactly():
    params = nnx.to_pure_dict(models.model_for(config()).init_params(jax.random.PRNGKey(1)))
    stacked = tn.stack_layers(params)
    assert set(stacked["decoder"]) == {"layers", "relpos_bias", "decoder_norm", "logits_dense"}
    back = tn.unstack_layers(stacked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(params), strict=True):
        np.testing.assert_array_equal(got, want)
    # Converting what is already in the target layout changes nothing.
    assert tn.unstack_layers(params) == params
    assert jax.tree.leaves(tn.stack_layers(stacked)) == jax.tree.leaves(stacked)


def test_to_layout_converts_states_both_ways_with_logical_axes():
    scanned_config = config(scan_layers=True)
    flat = models.model_for(config()).init_params(jax.random.PRNGKey(2))
    scanned = tn.to_layout(flat, scanned_config)
    leaf = scanned["encoder"]["layers"]["mlp"]["wo"]["kernel"]
    assert leaf.get_metadata()["out_sharding"] == (axes.LAYERS, axes.MLP, axes.EMBED)
    back = tn.to_layout(scanned, config())
    for got, want in zip(jax.tree.leaves(back), jax.tree.leaves(flat), strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("architecture", ["encoder_decoder_shared", "prefix_lm"])
def test_scanned_models_decode_the_same_tokens(architecture):
    flat_config = config(architecture, dropout_rate=0.0)
    flat, scanned = (
        models.model_for(flat_config),
        models.model_for(flat_config.replace(scan_layers=True)),
    )
    params = flat.init_params(jax.random.PRNGKey(4))
    features = batch(architecture, rows=3)
    if architecture == "prefix_lm":
        features = {k: v for k, v in features.items() if k != "decoder_target_tokens"}
    for method in ("greedy", "beam"):
        want = jax.jit(lambda p, b: flat.predict_batch(p, b, method=method, max_decode_length=5))(
            params, features
        )
        got = jax.jit(lambda p, b: scanned.predict_batch(p, b, method=method, max_decode_length=5))(
            tn.to_layout(params, scanned.config), features
        )
        np.testing.assert_array_equal(got, want)
        # Not a degenerate comparison (every row ending at once, one token repeated): at least
        # a full row's worth of real tokens (neither padding 0 nor EOS 1), several distinct.
        real = np.asarray(want)[np.asarray(want) > 1]
        assert real.size >= 5 and len(np.unique(real)) >= 3, (method, want)


def test_adafactor_trains_scanned_layers_as_separate_parameters():
    """Factored moments, update clipping and parameter scaling per layer: three scanned steps
    end where three unscanned steps do."""
    features = batch("encoder_decoder", rows=4)
    flat_config = config(d_model=128, d_ff=256, d_kv=32, dropout_rate=0.0)  # factored (>= 128)
    results = []
    scanned = flat_config.replace(scan_layers=True)
    for cfg in (flat_config, scanned, scanned.replace(unroll_layers=True)):
        model = models.model_for(cfg)
        params = tn.to_layout(models.model_for(flat_config).init_params(jax.random.PRNGKey(5)), cfg)
        tx = optim.adafactor(0.01)
        state = tx.init(params)

        @jax.jit
        def step(params, state):
            grads = jax.grad(lambda p: model.loss_fn(p, features, None)[0])(params)
            updates, state = tx.update(grads, state, params)
            return optax.apply_updates(params, updates), state

        for _ in range(3):
            params, state = step(params, state)
        results.append(tn.unstack_layers(nnx.to_pure_dict(params)))
    for result in results[1:]:
        for got, want in zip(jax.tree.leaves(result), jax.tree.leaves(results[0]), strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_unrolled_scanned_layers_run_without_a_loop():
    """`unroll_layers` keeps the stacked parameters (the layout) and takes the layers' loop out
    of the program: as many loops as the unscanned program has (none of them the layers'), and
    the stacked parameters' gradients concatenated."""
    features = batch("encoder_decoder")
    counts = {}
    for scan, unroll in ((False, False), (True, False), (True, True)):
        model = models.model_for(config(scan_layers=scan, unroll_layers=unroll))
        params = model.abstract_params()
        assert ("layers" in nnx.to_pure_dict(params)["encoder"]) == scan
        text = (
            jax.jit(jax.grad(lambda p: model.loss_fn(p, features, jax.random.PRNGKey(0))[0]))
            .lower(params)
            .as_text()
        )
        counts[scan, unroll] = text.count("stablehlo.while"), text.count("stablehlo.concatenate")
    assert counts[True, True][0] == counts[False, False][0] < counts[True, False][0]
    assert counts[True, True][1] > counts[True, False][1]


def test_per_layer_state_is_plain_adafactor_without_stacked_parameters():
    params = {"w": jnp.ones((4, 4))}
    plain = optax.chain(optax.scale_by_factored_rms(), optax.scale_by_learning_rate(0.1))
    assert jax.tree.structure(optim.per_layer(plain).init(params)) == jax.tree.structure(
        plain.init(params)
    )


def test_remat_keeps_fewer_bytes_for_the_backward_pass():
    """What the forward pass hands the backward pass (the residuals of `jax.vjp`): every remat
    policy keeps less than none. (The compiled program's temporaries on the CPU are no measure
    at this size: their peak lies elsewhere.)"""
    features = batch("encoder_decoder", rows=8, inputs=64, targets=32)
    kept = {}
    for policy in ("none", "dots_with_no_batch_dims", "full"):
        model = models.model_for(
            config(d_model=64, d_ff=256, remat_policy=policy, dropout_rate=0.0)
        )
        params = model.init_params(jax.random.PRNGKey(0))

        @jax.jit
        def residuals(params, model=model):
            return jax.vjp(lambda p: model.loss_fn(p, features, None)[0], params)[1]

        kept[policy] = sum(x.nbytes for x in jax.tree.leaves(residuals(params)))
    assert kept["full"] < kept["dots_with_no_batch_dims"] < kept["none"]


def test_remat_policies_name_jax_policies():
    from t2t.nn import config as config_module

    assert tuple(stacking.REMAT_POLICIES) == config_module.REMAT_POLICIES
    with pytest.raises(ValueError, match="remat_policy must be one of"):
        config(remat_policy="everything")
    with pytest.raises(TypeError, match="scan_layers must be a bool"):
        config(scan_layers=1)


def test_scanned_stack_refuses_step_by_step_use_with_a_hint():
    model = nnx.eval_shape(lambda: tn.build(config(scan_layers=True), nnx.Rngs(0)))
    with pytest.raises(ValueError, match="unscanned layout"):
        model.decoder.unrolled_layers()
