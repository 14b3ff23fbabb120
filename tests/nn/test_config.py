"""TransformerConfig validation, presets, and parameter counts of every preset (no memory)."""

import jax
import numpy as np
import pytest
from flax import nnx

import t2t.nn as tn

# docs/spec.md section 1: exact parameter counts (vocab 32128; v1.0 tied, v1.1 untied logits).
SPEC_PARAM_COUNTS = {
    "t5_small": 60_506_624,
    "t5_base": 222_903_552,
    "t5_large": 737_668_096,
    "t5_3b": 2_851_598_336,
    "t5_11b": 11_307_321_344,
    "t5_1_1_small": 76_961_152,
    "t5_1_1_base": 247_577_856,
    "t5_1_1_large": 783_150_080,
    "t5_1_1_xl": 2_849_757_184,
    "t5_1_1_xxl": 11_135_332_352,
}


def _abstract_params(config):
    model = nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0)))
    return nnx.state(model, nnx.Param)


def _count(state):
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(state))


@pytest.mark.parametrize("name", sorted(SPEC_PARAM_COUNTS))
def test_preset_parameter_count_equals_spec(name):
    assert _count(_abstract_params(tn.get_preset(name))) == SPEC_PARAM_COUNTS[name]


def test_every_preset_has_a_shape_check():
    assert set(tn.PRESETS) == set(SPEC_PARAM_COUNTS) | {"tiny"}


def test_t5_small_shapes():
    state = _abstract_params(tn.get_preset("t5_small")).to_pure_dict()
    assert state["token_embedder"]["embedding"].shape == (32128, 512)
    attention = state["encoder"]["layers_5"]["attention"]
    assert attention["query"]["kernel"].shape == (512, 512)
    assert attention["out"]["kernel"].shape == (512, 512)
    assert state["decoder"]["layers_0"]["mlp"]["wi"]["kernel"].shape == (512, 2048)
    assert state["decoder"]["relpos_bias"]["rel_embedding"].shape == (8, 32)
    assert "logits_dense" not in state["decoder"]
    assert "layers_6" not in state["encoder"]


def test_t5_11b_shapes_without_memory():
    state = _abstract_params(tn.get_preset("t5_11b")).to_pure_dict()
    layer = state["decoder"]["layers_23"]
    assert layer["encoder_decoder_attention"]["key"]["kernel"].shape == (1024, 128 * 128)
    assert layer["mlp"]["wo"]["kernel"].shape == (65536, 1024)
    assert isinstance(layer["mlp"]["wo"]["kernel"], jax.ShapeDtypeStruct)


def test_v1_1_preset_is_gated_and_untied():
    state = _abstract_params(tn.get_preset("t5_1_1_small")).to_pure_dict()
    mlp = state["encoder"]["layers_7"]["mlp"]
    assert set(mlp) == {"wi_0", "wi_1", "wo"}
    assert state["decoder"]["logits_dense"]["kernel"].shape == (512, 32128)


def test_half_the_layers_is_a_config():
    config = tn.get_preset("t5_base", num_encoder_layers=6, num_decoder_layers=6)
    full = _count(_abstract_params(tn.get_preset("t5_base")))
    half = _count(_abstract_params(config))
    embedding = 32128 * 768
    assert half - embedding == pytest.approx((full - embedding) / 2, rel=1e-3)


def test_shared_encoder_decoder_counts_shared_weights_once():
    base = tn.get_preset("t5_small")
    shared = base.replace(architecture="encoder_decoder_shared")
    d, f, inner, layers = 512, 2048, 512, 6
    # Per decoder layer, the self-attention (4 kernels), the MLP and two norms are borrowed.
    borrowed = layers * (4 * d * inner + 2 * d * f + 2 * d)
    assert _count(_abstract_params(shared)) == SPEC_PARAM_COUNTS["t5_small"] - borrowed


def test_decoder_only_state_names():
    config = tn.get_preset("tiny", architecture="prefix_lm", num_encoder_layers=0)
    state = _abstract_params(config).to_pure_dict()
    assert set(state) == {"token_embedder", "decoder"}
    assert set(state["decoder"]["layers_1"]) == {
        "pre_self_attention_layer_norm",
        "self_attention",
        "pre_mlp_layer_norm",
        "mlp",
    }


def test_get_preset_overrides_and_unknown_names():
    assert tn.get_preset("tiny", vocab_size=1024).vocab_size == 1024
    with pytest.raises(ValueError, match=r"t5_small"):
        tn.get_preset("t5_smal")
    with pytest.raises(TypeError, match="d_modle"):
        tn.get_preset("tiny", d_modle=3)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=0), "d_model must be a positive int, got 0"),
        (dict(num_heads=2.5), "num_heads must be a positive int"),
        (dict(dropout_rate=1.0), r"dropout_rate must be in \[0, 1\)"),
        (dict(architecture="encoder_only"), "architecture must be one of"),
        (dict(mlp_activations=("swish",)), "mlp_activations must be one of"),
        (dict(dtype="float64"), "dtype must be one of"),
        (dict(architecture="decoder_only"), "Set num_encoder_layers=0"),
        (dict(architecture="encoder_decoder_shared", num_decoder_layers=3), "depths must match"),
        (dict(relative_attention_num_buckets=7), "even int >= 4"),
        (dict(relative_attention_max_distance=16), "max_distance must be an int > "),
        (dict(layer_norm_epsilon=0.0), "layer_norm_epsilon must be > 0"),
    ],
)
def test_invalid_config_says_which_field(overrides, message):
    with pytest.raises(ValueError, match=message):
        tn.get_preset("tiny", **overrides)


def test_config_normalizes_and_is_hashable():
    config = tn.get_preset("tiny", mlp_activations=["gelu", "linear"], dtype=np.dtype("float32"))
    assert config.mlp_activations == ("gelu", "linear") and config.dtype == "float32"
    assert hash(config) == hash(tn.get_preset("tiny"))
    with pytest.raises(Exception):
        config.d_model = 3
