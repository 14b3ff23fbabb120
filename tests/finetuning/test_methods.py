"""Fine-tuning methods on a tiny network: groups select what they name, additions start as the
identity, frozen parameters never move, gradual unfreezing changes exactly the scheduled layers,
layer-wise rates scale each layer's update by the expected power, and LoRA merges exactly.

Optimizer steps use hand-made gradients (all ones) so what changes is decided by the method
alone; both layer layouts (scanned and unrolled) are checked where layers matter.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import t2t.nn as tn
from t2t import optim
from t2t.finetuning import FineTuning, depths_of_config, groups
from t2t.partitioning import make_partitioner
from t2t.trainer import sources

BASE = tn.get_preset(
    "tiny",
    dropout_rate=0.0,
    vocab_size=256,
    d_model=32,
    d_ff=64,
    d_kv=16,
    num_heads=2,
    num_encoder_layers=3,
    num_decoder_layers=3,
)
INPUTS = jnp.array([[5, 6, 7, 8, 1, 0], [9, 10, 1, 0, 0, 0]])
DECODER_INPUTS = jnp.array([[0, 4, 5, 6], [0, 7, 1, 0]])


def params_of(config, seed=0):
    return nnx.state(tn.build(config, nnx.Rngs(params=seed)), nnx.Param)


def flat(params):
    return {
        "/".join(str(k.key) for k in path): np.asarray(leaf)
        for path, leaf in jax.tree_util.tree_flatten_with_path(nnx.to_pure_dict(params))[0]
    }


def logits(config, params, inputs=INPUTS):
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(params=0))))
    return np.asarray(nnx.merge(graphdef, params)(inputs, DECODER_INPUTS))


@pytest.fixture(scope="module")
def base_params():
    return params_of(BASE)


def adapted(config, base_params, reinit=(), prompt_init="random"):
    """`config`'s parameters filled from the base network as a fine-tuning run fills them."""
    partitioner = make_partitioner(1, 1, devices=jax.devices()[:1])
    _, abstract = partitioner.abstract_model(lambda: tn.build(config, nnx.Rngs(params=0)))
    fresh = nnx.to_pure_dict(params_of(config, seed=7))
    source = nnx.to_pure_dict(base_params)
    if config.scan_layers:
        source = tn.stack_layers(source)
    merged, started = sources._fill(fresh, source, list(reinit))
    if config.prompt_length and prompt_init == "vocabulary":
        merged["prompt"]["embedding"], tokens = sources._prompt_from_vocabulary(
            merged["token_embedder"]["embedding"], config.prompt_length, seed=0
        )
        return sources._place(merged, abstract), started, tokens
    return sources._place(merged, abstract), started


# -- groups ---------------------------------------------------------------------------------------


def test_groups_select_what_they_name(base_params):
    masks = dict(
        zip(
            flat(base_params),
            groups.masks_of(
                groups.select(base_params, ["layer_norms", "decoder_layer:-1", "relpos"])
            ),
        )
    )
    chosen = {path for path, mask in masks.items() if mask}
    assert "encoder/layers_1/pre_mlp_layer_norm/scale" in chosen
    assert "decoder/decoder_norm/scale" in chosen and "encoder/encoder_norm/scale" in chosen
    assert "decoder/layers_2/mlp/wo/kernel" in chosen  # the top decoder layer, whole
    assert "decoder/layers_1/mlp/wo/kernel" not in chosen
    assert "encoder/relpos_bias/rel_embedding" in chosen
    assert "token_embedder/embedding" not in chosen
    # A regex is searched in paths; a typo of a group name is an error with a suggestion.
    regex = groups.select(base_params, [r"encoder/layers_0/.*/query"])
    assert groups.count(base_params, regex) == BASE.d_model * BASE.inner_dim
    with pytest.raises(ValueError, match="Did you mean 'adapters'"):
        groups.check_specs(["adapters("], "trainable")


def test_layer_groups_select_slices_of_scanned_layers():
    scanned = params_of(BASE.replace(scan_layers=True))
    masks = dict(zip(flat(scanned), groups.masks_of(groups.select(scanned, ["layer:0"]))))
    np.testing.assert_array_equal(masks["decoder/layers/mlp/wo/kernel"], [True, False, False])
    assert masks["decoder/decoder_norm/scale"] is False  # a stack-level parameter
    unrolled = params_of(BASE)
    count = groups.count(unrolled, groups.select(unrolled, ["layer:0"]))
    assert groups.count(scanned, groups.select(scanned, ["layer:0"])) == count > 0


# -- additions start as the identity --------------------------------------------------------------


@pytest.mark.parametrize(
    "additions",
    [
        dict(adapter_size=8),
        dict(
            lora_rank=4,
            lora_targets=("query", "key", "value", "out", "wi_0", "wi_1", "wo", "logits_dense"),
        ),
        dict(adapter_size=4, lora_rank=2, scan_layers=True),
    ],
    ids=["adapters", "lora_everywhere", "both_scanned"],
)
def test_adapted_network_starts_with_the_pretrained_logits(base_params, additions):
    config = BASE.replace(**additions)
    params, started = adapted(config, base_params)
    assert started and all(("adapter" in p) or ("lora" in p) for p in started)
    base = BASE.replace(scan_layers=config.scan_layers)  # the same layout: the same program
    np.testing.assert_array_equal(
        logits(config, params), logits(base, tn.to_layout(base_params, base))
    )


def test_a_vocabulary_prompt_is_the_base_model_reading_those_tokens(base_params):
    config = BASE.replace(prompt_length=3)
    params, started, tokens = adapted(config, base_params, prompt_init="vocabulary")
    assert started == ["prompt/embedding"] and len(set(tokens)) == 3
    prompted = jnp.concatenate([jnp.tile(jnp.array(tokens)[None], (2, 1)), INPUTS], axis=1)
    np.testing.assert_allclose(
        logits(config, params), logits(BASE, base_params, prompted), atol=1e-6
    )
    with pytest.raises(ValueError, match="pack=False"):
        model = nnx.merge(
            nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0))))[0], params
        )
        model(INPUTS, DECODER_INPUTS, jnp.ones_like(INPUTS), jnp.ones_like(DECODER_INPUTS))


def test_prompts_need_an_encoder():
    with pytest.raises(ValueError, match="has no encoder"):
        tn.get_preset("tiny", architecture="decoder_only", num_encoder_layers=0, prompt_length=4)


def test_merged_lora_computes_what_the_lora_network_does(base_params):
    config = BASE.replace(
        lora_rank=3, lora_alpha=6.0, lora_targets=("query", "wo"), scan_layers=True
    )
    params, _ = adapted(config, base_params)
    rng = np.random.RandomState(0)
    values = jax.tree_util.tree_map_with_path(  # trained-looking updates: B no longer zero
        lambda path, x: (
            x + 0.3 * rng.randn(*x.shape).astype(np.float32)
            if "lora_b" in jax.tree_util.keystr(path)
            else x
        ),
        nnx.to_pure_dict(params),
    )
    nnx.replace_by_pure_dict(params, values)
    merged, plain = tn.merge_lora(nnx.to_pure_dict(params), config)
    assert plain.lora_rank == 0 and "lora_a" not in str(jax.tree_util.tree_structure(merged))
    state = params_of(plain)
    nnx.replace_by_pure_dict(state, merged)
    lora_logits = logits(config, params)
    assert np.abs(lora_logits - logits(BASE, base_params)).max() > 1e-3  # LoRA changed them
    np.testing.assert_allclose(logits(plain, state), lora_logits, atol=2e-5)


def test_fill_refuses_parameters_it_cannot_find(base_params):
    deeper = BASE.replace(num_decoder_layers=4)
    with pytest.raises(ValueError, match="decoder/layers_3/.*Re-initialize"):
        adapted(deeper, base_params)
    params, started = adapted(deeper, base_params, reinit=["decoder"])
    assert all(p.startswith("decoder/") for p in started)
    values = flat(params)
    base = flat(base_params)
    assert np.array_equal(
        values["encoder/layers_0/mlp/wo/kernel"], base["encoder/layers_0/mlp/wo/kernel"]
    )
    assert not np.array_equal(
        values["decoder/layers_0/mlp/wo/kernel"], base["decoder/layers_0/mlp/wo/kernel"]
    )


# -- what trains ----------------------------------------------------------------------------------


def changed_per_step(ft, config, steps, tx=None):
    """For each step, the set of (path, layer slice) whose values changed in that step."""
    params = params_of(config)
    tx = ft.wrap(tx or optim.adafactor(0.1), depths_of_config(config))
    state = tx.init(params)
    history = []
    for _ in range(steps):
        grads = jax.tree.map(jnp.ones_like, params)
        updates, state = tx.update(grads, state, params)
        new = optax.apply_updates(params, updates)
        before, after = flat(params), flat(new)
        changed = set()
        for path in before:
            diff = before[path] != after[path]
            if "/layers/" in path:  # stacked: which layer slices changed
                changed |= {
                    (path.replace("/layers/", f"/layers_{i}/"), "")
                    for i in range(diff.shape[0])
                    if diff[i].any()
                }
            elif diff.any():
                changed.add((path, ""))
        history.append({p for p, _ in changed})
        params = new
    return history, params_of(config)


def expected_paths(config, keep):
    names = set(flat(params_of(config.replace(scan_layers=False))))
    return {n for n in names if keep(n)}


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_frozen_parameters_never_change_and_have_no_state(scan):
    config = BASE.replace(adapter_size=4, scan_layers=scan)
    ft = FineTuning(trainable=["adapters", "layer_norms"])
    history, params = changed_per_step(ft, config, 3)
    want = expected_paths(config, lambda n: "adapter" in n or n.endswith("norm/scale"))
    assert all(step == want for step in history)
    state = ft.wrap(optim.adafactor(0.1), depths_of_config(config)).init(params)
    inner = state.inner_states["frozen"].inner_state
    assert jax.tree.leaves(inner) == []  # set_to_zero keeps nothing
    description = ft.describe(params)
    assert (
        description["trainable_parameters"]
        == groups.count(params, ft.masks(params))
        < 0.2 * description["total_parameters"]
    )


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_gradual_unfreezing_changes_exactly_the_scheduled_layers(scan):
    config = BASE.replace(scan_layers=scan)
    history, _ = changed_per_step(FineTuning(unfreeze_every=2), config, 6)

    def in_top(k):  # the top k layers of each stack, plus what trains throughout
        def keep(name):
            if (
                name.startswith("token_embedder/")
                or "logits_dense" in name
                or (name.endswith("_norm/scale") and "/layers_" not in name)
            ):
                return True
            for stack in ("encoder", "decoder"):
                for i in range(max(3 - k, 0), 3):
                    if name.startswith(f"{stack}/layers_{i}/"):
                        return True
            return k >= 3 and "relpos_bias" in name  # the bottom layer's table

        return keep

    for step, changed in enumerate(history):
        episode = step // 2
        assert changed == expected_paths(config, in_top(episode + 1)), (step, episode)


@pytest.mark.parametrize("scan", [False, True], ids=["unrolled", "scanned"])
def test_layerwise_rates_scale_each_layers_update_by_a_power_of_xi(scan):
    config = BASE.replace(scan_layers=scan)
    params = params_of(config)
    xi, rate = 0.5, 0.1
    tx = FineTuning(layer_decay=xi).wrap(optax.sgd(rate), depths_of_config(config))
    grads = jax.tree.map(jnp.ones_like, params)
    updates, _ = tx.update(grads, tx.init(params), params)
    values = flat(updates)
    for stack in ("encoder", "decoder"):
        for i in range(3):
            if scan:
                update = values[f"{stack}/layers/mlp/wo/kernel"][i]
            else:
                update = values[f"{stack}/layers_{i}/mlp/wo/kernel"]
            np.testing.assert_allclose(update, -rate * xi ** (2 - i), rtol=1e-6)
    np.testing.assert_allclose(values[f"{stack}/relpos_bias/rel_embedding"], -rate * xi**2)
    np.testing.assert_allclose(values["token_embedder/embedding"], -rate)
    np.testing.assert_allclose(values["decoder/decoder_norm/scale"], -rate)


@pytest.mark.parametrize("architecture", ["decoder_only", "prefix_lm", "encoder_decoder_shared"])
def test_additions_start_as_the_identity_in_every_architecture(architecture):
    layers = (
        dict(num_encoder_layers=0, num_decoder_layers=3)
        if architecture in ("decoder_only", "prefix_lm")
        else {}
    )
    base = BASE.replace(architecture=architecture, **layers)
    base_params = params_of(base)
    config = base.replace(adapter_size=4, lora_rank=2, lora_targets=("query", "wo"))
    params, started = adapted(config, base_params)
    assert started
    tokens = jnp.array([[0, 5, 6, 7, 8], [0, 9, 10, 1, 0]])

    def run(cfg, p):
        graphdef, _ = nnx.split(nnx.eval_shape(lambda: tn.build(cfg, nnx.Rngs(params=0))))
        model = nnx.merge(graphdef, p)
        if cfg.is_decoder_only:
            causal = jnp.array([[1, 1, 1, 0, 0], [1, 1, 0, 0, 0]])
            return model(tokens, decoder_causal_attention=causal)
        return model(INPUTS, DECODER_INPUTS)

    np.testing.assert_array_equal(
        np.asarray(run(config, params)), np.asarray(run(base, base_params))
    )


def test_a_spec_that_selects_nothing_is_refused(base_params):
    with pytest.raises(ValueError, match="'adapters' selects no parameter.*adapter_size"):
        FineTuning(trainable=["adapters"]).check(base_params)
    decoder_only = params_of(BASE.replace(architecture="decoder_only", num_encoder_layers=0))
    with pytest.raises(ValueError, match="'encoder' selects no parameter"):
        FineTuning(frozen=["encoder"]).check(decoder_only)
    FineTuning(trainable=["decoder", "layer:-1"]).check(base_params)  # fine
