"""The real network sharded on a 2x4 CPU mesh: activation constraints by logical name reach the
lowered program, tensor parallelism all-reduces once per sublayer, FSDP gathers weights instead
of reshuffling activations, and a sharded train step equals the single-device one."""

import collections
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from t2t import models, optim, partitioning
from t2t import nn as tn
from t2t.aot import analysis, hlo, programs
from t2t.nn import axes, sharding
from t2t.trainer import steps

VOCAB = 512  # a size no other dimension has: a full-vocabulary collective would show it
LENGTHS = {"inputs": 32, "targets": 8}
BATCH = 8


def config(layers=2, **overrides):
    return tn.get_preset(
        "tiny",
        vocab_size=VOCAB,
        d_model=64,
        d_ff=96,
        d_kv=16,
        num_heads=4,
        num_encoder_layers=layers,
        num_decoder_layers=layers,
        dropout_rate=0.0,
        **overrides,
    )


def forward_program(mode, layers, mesh=(2, 4)):
    """The compiled teacher-forced loss of a `layers`-deep model, and its lowered text."""
    model = models.model_for(config(layers))
    partitioner = partitioning.make_partitioner(*mesh, mode=mode)
    params, _ = programs.abstract_state(model, optim.adafactor(0.01), partitioner)
    batch = programs._abstract_batch(
        partitioner, programs.batch_shapes("encoder_decoder", LENGTHS, BATCH)
    )
    with partitioner.context():
        lowered = jax.jit(lambda p, b: model.loss_fn(p, b, None)[0]).lower(params, batch)
    return lowered.compile(), lowered.as_text()


def census(compiled):
    return collections.Counter(
        {k: v["count"] for k, v in analysis.collective_census(compiled.as_text()).items()}
    )


def result_dimensions(compiled, kinds):
    """Every dimension of every result of the given kinds of collectives."""
    dims = set()
    for kind, shape in analysis.collectives(compiled.as_text()):
        if kind in kinds:
            for array in hlo.arrays(shape):
                dims |= set(array.dims)
    return dims


@pytest.mark.parametrize("mode", ["tensor_parallel", "fsdp"])
def test_activation_constraints_reach_the_lowered_program(mode):
    _, text = forward_program(mode, 2)
    constraints = re.findall(
        r"sdy.sharding_constraint %\S+ <@mesh, (\[[^>]*\])> : "
        r"tensor<([\dx]+)x\w+>",
        text,
    )
    by_shape = collections.defaultdict(set)
    for spec, shape in constraints:
        by_shape[shape].add(spec.replace(" ", ""))
    # queries [B, L, N, H]: batch over data, heads over model
    assert by_shape["8x32x4x16"] == {'[{"data"},{},{"model"},{}]'}
    # MLP hidden [B, L, F] and logits [B, T, V]: units and vocabulary over model
    assert by_shape["8x32x96"] == {'[{"data"},{},{"model"}]'}
    assert '[{"data"},{},{"model"}]' in by_shape[f"8x8x{VOCAB}"]
    # the residual stream [B, L, D]: batch over data, model dimension whole (also under FSDP,
    # where the parameters' embed dimension is split over data)
    assert by_shape["8x32x64"] == {'[{"data"},{},{}]'}
    # weights where they are used: tensor-parallel dimensions split, `embed` whole (under FSDP
    # this is where each weight is gathered): wi [D, F], wo [F, D], the embedding [V, D]
    assert '[{},{"model"}]' in by_shape["64x96"] and '[{"model"},{}]' in by_shape["96x64"]
    assert by_shape[f"{VOCAB}x64"] == {'[{"model"},{}]'}


def test_tensor_parallel_all_reduces_once_per_sublayer():
    """Megatron layout: attention and MLP outputs are summed over the model axis, so the
    forward pass all-reduces twice per encoder layer and three times per decoder layer, and
    nothing ever gathers the sharded vocabulary."""
    two, _ = forward_program("tensor_parallel", 2)
    three, _ = forward_program("tensor_parallel", 3)
    added = census(three) - census(two)
    assert added == collections.Counter({"all-reduce": 5})
    assert census(two)["all-gather"] == 0
    assert VOCAB not in result_dimensions(two, ("all-reduce", "all-gather", "all-to-all"))


def test_fsdp_gathers_weights_and_keeps_activations_split_by_batch():
    two, _ = forward_program("fsdp", 2)
    three, _ = forward_program("fsdp", 3)
    tensor_parallel, _ = forward_program("tensor_parallel", 3)
    added = census(three) - census(two)
    # One more layer pair: its 22 weights gathered, and the same 5 activation all-reduces as
    # tensor parallelism; no activation is ever reshuffled between layouts.
    assert added["all-reduce"] == 5 and added["all-gather"] >= 22
    assert census(three)["all-reduce"] == census(tensor_parallel)["all-reduce"]
    assert census(three)["all-to-all"] == census(three)["collective-permute"] == 0
    assert VOCAB not in result_dimensions(three, ("all-reduce", "all-gather", "all-to-all"))


def train_step_result(partitioner, cfg, batch):
    model = models.model_for(cfg, loss_normalizing_factor="num_real_target_tokens")
    tx = optim.adafactor(0.05)
    module = partitioner.init_model(lambda: tn.build(cfg, nnx.Rngs(params=0)))
    params = nnx.split(module)[1]
    opt_state = partitioner.init_optimizer(tx, params)
    global_batch = partitioner.make_global_batch(batch)
    _, abstract = partitioner.abstract_model(lambda: tn.build(cfg, nnx.Rngs(params=0)))
    jitted = steps.jit_train_step(
        steps.make_train_step(model, tx, num_microbatches=2),
        partitioner,
        abstract,
        partitioner.abstract_optimizer(tx, abstract),
        global_batch,
    )
    with partitioner.context():
        params, opt_state, metrics = jitted(
            params, opt_state, global_batch, jax.random.PRNGKey(0), np.int32(0)
        )
    return float(metrics["loss"]), tn.unstack_layers(nnx.to_pure_dict(params))


@pytest.mark.parametrize("mode, scan", [("tensor_parallel", False), ("fsdp", True)])
def test_sharded_train_step_equals_one_device(mode, scan):
    rng = np.random.default_rng(0)
    batch = {
        name: rng.integers(1, VOCAB, shape).astype(np.int32)
        for name, shape in programs.batch_shapes(
            "encoder_decoder", LENGTHS, BATCH, pack=False
        ).items()
    }
    batch["decoder_loss_weights"] = np.ones_like(batch["decoder_loss_weights"])
    batch["decoder_input_tokens"][:, 0] = 0
    cfg = config(2, scan_layers=scan, remat_policy="full" if scan else "none")
    one = partitioning.make_partitioner(devices=jax.devices()[:1])
    want_loss, want = train_step_result(one, cfg, batch)
    loss, got = train_step_result(partitioning.make_partitioner(2, 4, mode=mode), cfg, batch)
    assert loss == pytest.approx(want_loss, rel=1e-5)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_fsdp_needs_no_more_memory_than_data_parallel():
    cfg = config(2, scan_layers=True)
    shapes = programs.batch_shapes("encoder_decoder", LENGTHS, 16)
    totals = {}
    for mode, mesh in (("data_parallel", (8, 1)), ("fsdp", (8, 1)), ("fsdp", (2, 4))):
        partitioner = partitioning.make_partitioner(*mesh, mode=mode)
        result = programs.compile_train_step(
            models.model_for(cfg), optim.adafactor(0.01), partitioner, shapes, progress=False
        )
        totals[mode, mesh] = analysis.Memory.of(result.compiled)
    data_parallel = totals["data_parallel", (8, 1)]
    for key in (("fsdp", (8, 1)), ("fsdp", (2, 4))):
        assert totals[key].arguments < data_parallel.arguments / 2, key
        assert totals[key].total <= data_parallel.total, key


def test_constrain_is_a_no_op_outside_a_mesh_and_strict_inside():
    x = jnp.ones((4, 6))
    assert sharding.constrain(x, (axes.ACT_BATCH, axes.ACT_EMBED)) is x
    partitioner = partitioning.make_partitioner(2, 4, mode="tensor_parallel")
    with partitioner.context():
        with pytest.raises(ValueError, match="not in the rules table"):
            jax.jit(lambda y: sharding.constrain(y, ("activation_batch", "activation_emb")))(x)
        # 6 is not divisible by the model axis (4): that dimension stays replicated
        y = jax.jit(lambda y: sharding.constrain(y, (axes.ACT_BATCH, axes.ACT_MLP)))(x)
    expected = jax.sharding.NamedSharding(partitioner.mesh, jax.sharding.PartitionSpec("data"))
    assert y.sharding.is_equivalent_to(expected, y.ndim)
