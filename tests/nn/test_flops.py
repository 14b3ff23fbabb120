"""The FLOPs counter against docs/spec.md section 12 and against the matmuls of the traced network."""

import jax
import jax.numpy as jnp
import pytest
from flax import nnx
from jax.extend import core as jex_core

import t2t.nn as tn
from t2t.nn import flops

# docs/spec.md section 12: training GFLOP per example with 512 input and 114 target tokens.
SPEC_TRAINING_GFLOP = {"t5_small": 106.3, "t5_base": 425.9, "t5_large": 1444.2}


@pytest.mark.parametrize("name", sorted(SPEC_TRAINING_GFLOP))
def test_training_flops_equal_spec_check_values(name):
    gflop = flops.training_flops(tn.get_preset(name), 512, 114) / 1e9
    assert round(gflop, 1) == SPEC_TRAINING_GFLOP[name]


def test_naive_rule_doubles_the_encoder_decoder_count():
    # The spec's warning: 6 * params * (inputs + targets) is ~2x the exact count.
    config = tn.get_preset("t5_small")
    naive = 6 * 60_506_624 * (512 + 114)
    assert 1.9 < naive / flops.training_flops(config, 512, 114) < 2.3


def test_rejects_empty_targets():
    with pytest.raises(ValueError, match="target_length"):
        flops.forward_flops(tn.get_preset("t5_small"), 512, 0)


def _dot_flops(jaxpr) -> int:
    """2 * (output elements) * (contracted size) summed over every dot_general, recursively."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            contracted = 1
            for axis in contract:
                contracted *= lhs[axis]
            size = 1
            for dim in out:
                size *= dim
            total += 2 * size * contracted
    for sub in jex_core.subjaxprs(jaxpr):
        total += _dot_flops(sub)
    return total


def _traced_forward_flops(config, batch, input_length, target_length):
    graphdef, state = nnx.split(nnx.eval_shape(lambda: tn.build(config, nnx.Rngs(0))))

    def forward(state, inputs, targets):
        model = nnx.merge(graphdef, state)
        if config.is_decoder_only:
            return model(jnp.concatenate([inputs, targets], axis=1))
        return model(inputs, targets)

    inputs = jax.ShapeDtypeStruct((batch, input_length), jnp.int32)
    targets = jax.ShapeDtypeStruct((batch, target_length), jnp.int32)
    jaxpr = jax.make_jaxpr(forward)(state, inputs, targets)
    return _dot_flops(jaxpr.jaxpr)


@pytest.mark.parametrize(
    "name,overrides,input_length,target_length",
    [
        ("t5_small", {}, 512, 114),
        ("t5_1_1_small", {}, 96, 40),  # gated GELU, untied logits
        ("tiny", {"num_heads": 3, "d_kv": 24}, 33, 7),  # inner dim != d_model
        ("tiny", {"architecture": "encoder_decoder_shared"}, 20, 9),
        ("tiny", {"architecture": "decoder_only", "num_encoder_layers": 0}, 12, 20),
        ("tiny", {"architecture": "prefix_lm", "num_encoder_layers": 0}, 5, 16),
    ],
)
def test_counter_equals_matmuls_of_the_traced_network(name, overrides, input_length, target_length):
    config = tn.get_preset(name, **overrides)
    traced = _traced_forward_flops(config, 2, input_length, target_length)
    assert traced == 2 * flops.forward_flops(config, input_length, target_length)
