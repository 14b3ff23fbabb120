"""Tests of t2t.partitioning on 8 CPU devices: mesh sizes and errors, rules tables, sharded
initialization placing each parameter as the rules say, optimizer-state shardings, global batch
assembly, host shards, and a real two-process `jax.distributed` run on localhost."""

import logging
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import flax.core.spmd
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from t2t import nn, optim, partitioning
from t2t.nn import axes

V, D, F, N, H, R = 256, 128, 256, 4, 16, 32


def param(rngs, shape, names, std=0.02):
    value = std * jax.random.normal(rngs.params(), shape)
    return nnx.Param(value, sharding_names=names, eager_sharding=False)


class Dense(nnx.Module):
    def __init__(self, shape, names, rngs):
        self.kernel = param(rngs, shape, names)


class ToyLayer(nnx.Module):
    """One pre-norm block with the T5X parameter names, shapes and logical axes."""

    def __init__(self, rngs):
        self.pre_attention_layer_norm = nnx.Dict(
            scale=nnx.Param(jnp.ones(D), sharding_names=(axes.EMBED,), eager_sharding=False)
        )
        self.attention = nnx.Dict(
            query=Dense((D, N * H), (axes.EMBED, axes.JOINED_KV), rngs),
            out=Dense((N * H, D), (axes.JOINED_KV, axes.EMBED), rngs),
        )
        self.mlp = nnx.Dict(
            wi=Dense((D, F), (axes.EMBED, axes.MLP), rngs),
            wo=Dense((F, D), (axes.MLP, axes.EMBED), rngs),
        )

    def __call__(self, x):  # [B, L, D]
        y = x * self.pre_attention_layer_norm["scale"]
        q = jnp.einsum("BLD,DK->BLK", y, self.attention["query"].kernel)
        x = x + jnp.einsum("BLK,KD->BLD", jnp.tanh(q), self.attention["out"].kernel)
        h = jax.nn.relu(jnp.einsum("BLD,DF->BLF", x, self.mlp["wi"].kernel))
        return x + jnp.einsum("BLF,FD->BLD", h, self.mlp["wo"].kernel)


class ToyModel(nnx.Module):
    def __init__(self, rngs):
        self.token_embedder = nnx.Dict(embedding=param(rngs, (V, D), (axes.VOCAB, axes.EMBED), 1.0))
        self.encoder = nnx.Dict(
            layers_0=ToyLayer(rngs),
            relpos_bias=nnx.Dict(
                rel_embedding=param(rngs, (N, R), (axes.HEADS, axes.RELPOS_BUCKETS))
            ),
        )

    def __call__(self, tokens):  # [B, L] -> [B, L, V]
        x = self.token_embedder["embedding"][tokens]
        x = self.encoder["layers_0"](x)
        return jnp.einsum("BLD,VD->BLV", x, self.token_embedder["embedding"])


def create_toy():
    return ToyModel(nnx.Rngs(params=0))


def flat(tree):
    return {partitioning.param_path(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


# ----------------------------------------------------------------------------------------------
# Mesh
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data, model, devices, expected",
    [
        (-1, 1, 8, (8, 1)),
        (-1, 2, 8, (4, 2)),
        (2, -1, 8, (2, 4)),
        (2, 4, 8, (2, 4)),
        (1, 1, 1, (1, 1)),
        (-1, 1, 1, (1, 1)),
        (1, -1, 6, (1, 6)),
    ],
)
def test_resolve_mesh_shape(data, model, devices, expected):
    assert partitioning.resolve_mesh_shape(data, model, devices) == expected


@pytest.mark.parametrize(
    "data, model, devices, message",
    [
        (3, 2, 8, "data=3 x model=2 = 6 devices, but 8 devices are available"),
        (-1, 3, 8, "8 devices are not divisible by model=3"),
        (-1, -1, 8, "At most one mesh axis may be -1"),
        (0, 1, 8, "'data' must be a positive int or -1, got 0"),
    ],
)
def test_mesh_shape_errors_name_the_numbers(data, model, devices, message):
    with pytest.raises(ValueError, match=message):
        partitioning.resolve_mesh_shape(data, model, devices)


def test_make_mesh_uses_every_device_given():
    mesh = partitioning.make_mesh(2, -1)
    assert dict(mesh.shape) == {"data": 2, "model": 4}
    assert sorted(d.id for d in mesh.devices.flat) == list(range(8))
    single = partitioning.make_mesh(devices=jax.devices()[:1])
    assert dict(single.shape) == {"data": 1, "model": 1}
    with pytest.raises(ValueError, match="4 devices are available"):
        partitioning.make_mesh(2, 1, devices=jax.devices()[:4])


# ----------------------------------------------------------------------------------------------
# Rules
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", sorted(partitioning.RULES))
def test_every_table_maps_every_logical_name_once(mode):
    names = [name for name, _ in partitioning.logical_axis_rules(mode)]
    assert sorted(names) == sorted(axes.PARAM_AXES + axes.ACTIVATION_AXES)
    targets = {target for _, target in partitioning.logical_axis_rules(mode)}
    assert targets <= {None, *partitioning.MESH_AXES}


def test_rules_differ_where_the_modes_do():
    dp, tp, fsdp = (
        dict(partitioning.logical_axis_rules(m))
        for m in ("data_parallel", "tensor_parallel", "fsdp")
    )
    assert all(dp[name] is None for name in axes.PARAM_AXES)
    assert (tp[axes.JOINED_KV], tp[axes.MLP], tp[axes.VOCAB], tp[axes.EMBED]) == (
        "model",
        "model",
        "model",
        None,
    )
    assert fsdp[axes.EMBED] == "data" and fsdp[axes.ACT_EMBED] is None
    assert dp[axes.ACT_BATCH] == tp[axes.ACT_BATCH] == fsdp[axes.ACT_BATCH] == "data"


def test_unknown_mode_suggests_the_nearest():
    with pytest.raises(ValueError, match="Did you mean 'fsdp'"):
        partitioning.logical_axis_rules("fsdb")


def test_context_sets_what_activation_constraints_read():
    mesh = partitioning.make_mesh(2, 4)
    partitioner = partitioning.Partitioner(mesh, partitioning.logical_axis_rules("fsdp"))
    seen = {}

    @jax.jit
    def f(x):
        seen["rules"] = flax.core.spmd.get_logical_axis_rules()
        seen["mesh"] = dict(jax.sharding.get_abstract_mesh().shape)
        return x

    with partitioner.context():
        f(jnp.ones(2))
    assert seen == {"rules": partitioner.rules, "mesh": {"data": 2, "model": 4}}
    assert flax.core.spmd.get_logical_axis_rules() == ()
    assert jax.sharding.get_abstract_mesh().empty


# ----------------------------------------------------------------------------------------------
# Sharded initialization
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def eager_params():
    return flat(nnx.state(create_toy(), nnx.Param))


@pytest.fixture(scope="module", params=["tensor_parallel", "fsdp"])
def sharded(request):
    mesh = partitioning.make_mesh(2, 4)
    partitioner = partitioning.Partitioner(mesh, partitioning.logical_axis_rules(request.param))
    model = partitioner.init_model(create_toy)
    return request.param, partitioner, nnx.state(model, nnx.Param)


EXPECTED_SPECS = {
    "tensor_parallel": {
        "token_embedder/embedding": P("model", None),
        "encoder/layers_0/attention/query/kernel": P(None, "model"),
        "encoder/layers_0/attention/out/kernel": P("model", None),
        "encoder/layers_0/mlp/wi/kernel": P(None, "model"),
        "encoder/layers_0/mlp/wo/kernel": P("model", None),
        "encoder/layers_0/pre_attention_layer_norm/scale": P(None),
        "encoder/relpos_bias/rel_embedding": P("model", None),
    },
    "fsdp": {
        "token_embedder/embedding": P("model", "data"),
        "encoder/layers_0/attention/query/kernel": P("data", "model"),
        "encoder/layers_0/attention/out/kernel": P("model", "data"),
        "encoder/layers_0/mlp/wi/kernel": P("data", "model"),
        "encoder/layers_0/mlp/wo/kernel": P("model", "data"),
        "encoder/layers_0/pre_attention_layer_norm/scale": P("data"),
        "encoder/relpos_bias/rel_embedding": P("model", None),
    },
}


def test_sharded_init_places_each_param_as_the_rules_say(sharded, eager_params):
    mode, partitioner, params = sharded
    params = flat(params)
    assert set(params) == set(EXPECTED_SPECS[mode])
    for path, spec in EXPECTED_SPECS[mode].items():
        array = params[path]
        assert array.sharding.spec == spec, path
        # The values are those of an eager, unsharded init with the same seed.
        np.testing.assert_allclose(np.asarray(array), eager_params[path], rtol=1e-6, err_msg=path)
        expected_shard = tuple(
            size // (partitioner.mesh.shape[axis] if axis else 1)
            for size, axis in zip(array.shape, tuple(spec) + (None,) * array.ndim)
        )
        for shard in array.addressable_shards:
            assert shard.data.shape == expected_shard, path


def test_abstract_model_carries_shardings_without_computing(sharded):
    mode, partitioner, params = sharded
    graphdef, abstract = partitioner.abstract_model(create_toy)
    abstract = flat(nnx.state(nnx.merge(graphdef, abstract), nnx.Param))
    for path, x in abstract.items():
        assert isinstance(x, jax.ShapeDtypeStruct)
        assert x.sharding.spec == EXPECTED_SPECS[mode][path]


def test_no_device_holds_a_full_copy_of_a_model_sharded_param(sharded):
    _, _, params = sharded
    for path, array in flat(params).items():
        if "model" in tuple(array.sharding.spec):
            assert all(s.data.size < array.size for s in array.addressable_shards), path


def test_fsdp_holds_less_per_device_than_tensor_parallel():
    mesh = partitioning.make_mesh(2, 4)
    sizes = {}
    for mode in ("data_parallel", "tensor_parallel", "fsdp"):
        partitioner = partitioning.Partitioner(mesh, partitioning.logical_axis_rules(mode))
        abstract = nnx.state(nnx.eval_shape(create_toy), nnx.Param)
        shardings = partitioner.shardings(abstract)
        sizes[mode] = sum(
            s.shard_shape(x.shape)[0] * int(np.prod(s.shard_shape(x.shape)[1:])) * 4
            for x, s in zip(jax.tree.leaves(abstract), jax.tree.leaves(shardings))
        )
    total = sum(int(np.prod(x.shape)) * 4 for x in jax.tree.leaves(abstract))
    assert sizes["data_parallel"] == total
    assert sizes["fsdp"] < sizes["tensor_parallel"] < total


def test_indivisible_dimension_is_replicated_with_a_warning(caplog):
    partitioner = partitioning.Partitioner(
        partitioning.make_mesh(2, 4), partitioning.logical_axis_rules("tensor_parallel")
    )
    with caplog.at_level(logging.WARNING):
        spec = partitioner.spec((axes.VOCAB, axes.EMBED), (10, 8), what="emb")
    assert spec == P(None, None)
    assert "not divisible by mesh axis 'model' (4)" in caplog.text


def test_spec_errors():
    partitioner = partitioning.Partitioner(
        partitioning.make_mesh(2, 4), partitioning.logical_axis_rules("tensor_parallel")
    )
    with pytest.raises(ValueError, match="logical axis 'embd' is not in the rules table"):
        partitioner.spec(("embd",), (8,))
    with pytest.raises(ValueError, match="2 logical axes .* rank-1"):
        partitioner.spec((axes.EMBED, axes.MLP), (8,))
    with pytest.raises(ValueError, match="names no mesh axis"):
        partitioning.Partitioner(partitioner.mesh, ((axes.EMBED, "tensor"),))


def test_real_network_annotations_map_to_the_mesh():
    """The contract with t2t.nn: T5X parameter paths carry the logical axes the rules expect."""
    config = nn.get_preset("tiny", num_encoder_layers=1, num_decoder_layers=1)
    partitioner = partitioning.make_partitioner(2, 4, "fsdp")
    abstract = nnx.state(nnx.eval_shape(lambda: nn.build(config, nnx.Rngs(params=0))), nnx.Param)
    specs = {path: s.spec for path, s in flat(partitioner.shardings(abstract)).items()}
    assert specs["token_embedder/embedding"] == P("model", "data")
    assert specs["encoder/layers_0/attention/query/kernel"] == P("data", "model")
    assert specs["encoder/layers_0/attention/out/kernel"] == P("model", "data")
    assert specs["decoder/layers_0/encoder_decoder_attention/value/kernel"] == P("data", "model")
    assert specs["decoder/layers_0/mlp/wi_0/kernel"] == P("data", "model")
    assert specs["decoder/layers_0/mlp/wo/kernel"] == P("model", "data")
    assert specs["decoder/logits_dense/kernel"] == P("data", "model")
    assert specs["decoder/decoder_norm/scale"] == P("data")
    assert specs["encoder/relpos_bias/rel_embedding"] == P("model", None)

    # Square [128, 128] kernels: the factored statistics keep the axis optax keeps.
    opt_state = jax.eval_shape(optim.adafactor(0.01).init, abstract)
    opt_shardings = flat(partitioner.optimizer_shardings(opt_state, abstract))
    opt_specs = {path: s.spec for path, s in opt_shardings.items()}
    key = "decoder/layers_0/self_attention/key/kernel"
    assert opt_specs[f"0/v_row/{key}"] == P("data")  # mean over the columns keeps `embed`
    assert opt_specs[f"0/v_col/{key}"] == P("model")  # mean over the rows keeps `joined_kv`


# ----------------------------------------------------------------------------------------------
# Optimizer state
# ----------------------------------------------------------------------------------------------


def test_adafactor_state_is_sharded_like_its_params(sharded):
    mode, partitioner, params = sharded
    tx = optim.freeze(optim.adafactor(0.01), [r"relpos_bias"])
    opt_state = partitioner.init_optimizer(tx, params)
    specs = {path: x.sharding.spec for path, x in flat(opt_state).items()}
    factored = opt_state.inner_states["trainable"].inner_state[0]
    v_row, v_col, v = (flat(getattr(factored, k)) for k in ("v_row", "v_col", "v"))
    # The [V, D] = [256, 128] embedding is factored; optax's v_row reduces the largest axis (V)
    # and keeps `embed`, v_col reduces D and keeps `vocab`.
    emb = "token_embedder/embedding"
    assert v_row[emb].shape == (D,) and v_col[emb].shape == (V,)
    assert v_row[emb].sharding.spec == (P("data") if mode == "fsdp" else P(None))
    assert v_col[emb].sharding.spec == P("model")
    # [D, N*H] = [128, 64] query kernel is not factored: full statistics, same sharding.
    query = "encoder/layers_0/attention/query/kernel"
    assert v[query].shape == (D, N * H)
    assert v[query].sharding.spec == EXPECTED_SPECS[mode][query]
    # Frozen params have no statistics; counters and placeholders are replicated.
    assert not any("relpos_bias" in path for path in specs)
    assert v[emb].sharding.spec == P()
    assert factored.count.sharding.spec == P()


def test_sharded_training_step_equals_single_device():
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V, (8, 4)), jnp.int32)
    tx = optim.adafactor(0.01)

    def run(partitioner):
        model = partitioner.init_model(create_toy)
        graphdef, params = nnx.split(model, nnx.Param)
        opt_state = partitioner.init_optimizer(tx, params)
        batch = partitioner.make_global_batch({"tokens": np.asarray(tokens)})

        shardings = (
            partitioner.shardings(params),
            partitioner.optimizer_shardings(opt_state, params),
        )

        @jax.jit(in_shardings=(*shardings, None), out_shardings=shardings)
        def step(params, opt_state, batch):
            def loss_fn(params):
                logits = nnx.merge(graphdef, params)(batch["tokens"])
                return -jnp.mean(jax.nn.log_softmax(logits)[..., 0])

            grads = jax.grad(loss_fn)(params)
            updates, opt_state = tx.update(grads, opt_state, params)
            return optax.apply_updates(params, updates), opt_state

        with partitioner.context():
            for _ in range(2):
                params, opt_state = step(params, opt_state, batch)
        return params

    one = partitioning.make_partitioner(devices=jax.devices()[:1])
    eight = partitioning.make_partitioner(2, 4, "fsdp")
    expected, got = flat(run(one)), flat(run(eight))
    for path in expected:
        assert got[path].sharding.spec == EXPECTED_SPECS["fsdp"][path]
        np.testing.assert_allclose(got[path], expected[path], rtol=1e-5, atol=1e-6, err_msg=path)


# ----------------------------------------------------------------------------------------------
# Input batches and hosts
# ----------------------------------------------------------------------------------------------


def test_global_batch_round_trips_split_over_data():
    partitioner = partitioning.Partitioner(
        partitioning.make_mesh(2, 4), partitioning.logical_axis_rules("fsdp")
    )
    local = {
        "encoder_input_tokens": np.arange(6 * 5, dtype=np.int32).reshape(6, 5),
        "decoder_loss_weights": np.random.default_rng(0).random((6, 3)).astype(np.float32),
    }
    batch = partitioner.make_global_batch(local)
    assert partitioner.batch_shardings(batch) == {name: x.sharding for name, x in batch.items()}
    for name, x in local.items():
        assert batch[name].sharding.spec == P("data", None)
        np.testing.assert_array_equal(np.asarray(batch[name]), x)
        rows = {tuple(np.asarray(s.data)[:, 0]) for s in batch[name].addressable_shards}
        assert len(rows) == 2  # two data shards of 3 rows, each repeated over the model axis
        assert all(s.data.shape == (3, x.shape[1]) for s in batch[name].addressable_shards)
    with pytest.raises(ValueError, match=r"global batch \(5 per host x 1 hosts = 5\)"):
        partitioner.make_global_batch({"x": np.zeros((5, 2))})
    with pytest.raises(ValueError, match="same leading batch size"):
        partitioner.make_global_batch({"x": np.zeros((4, 2)), "y": np.zeros((2, 2))})


@pytest.mark.parametrize(
    "grid, process, expected",
    [
        ([[0, 0, 0, 0], [1, 1, 1, 1]], 1, (1, 2)),  # 2 hosts x 4 devices, 2x4 mesh
        ([[0, 0], [0, 0], [1, 1], [1, 1]], 0, (0, 2)),  # 4x2 mesh
        ([[0, 0, 0, 0, 1, 1, 1, 1]], 1, (0, 1)),  # model axis across hosts: same data
        ([[0], [1], [0], [1]], 1, (1, 2)),  # interleaved rows still give disjoint shards
        ([[0, 1], [2, 3]], 3, (1, 2)),  # 4 hosts, model pairs: hosts 2 and 3 share a shard
    ],
)
def test_data_shard_of_process(grid, process, expected):
    assert partitioning.data_shard_of_process(np.array(grid), process) == expected


def test_data_shard_rejects_overlapping_hosts():
    with pytest.raises(ValueError, match="disjoint, equal shards"):
        partitioning.data_shard_of_process(np.array([[0, 0], [0, 1], [1, 1]]), 0)


def test_single_process_reads_the_whole_batch():
    partitioner = partitioning.make_partitioner(2, 4, "fsdp")
    assert partitioner.data_shard() == (0, 1)
    assert partitioning.make_partitioner(8, 1).data_shard() == (0, 1)
    info = partitioner.data_shard_info()  # the seqio.ShardInfo a data pipeline takes
    assert (type(info).__name__, info.index, info.num_shards) == ("ShardInfo", 0, 1)


def test_initialize_distributed_is_a_no_op_for_one_process(monkeypatch):
    names = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "T2T_DISTRIBUTED")
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert partitioning.initialize_distributed() is False
    monkeypatch.setenv("JAX_NUM_PROCESSES", "1")
    assert partitioning.initialize_distributed(coordinator_address="localhost:1") is False
    monkeypatch.setenv("JAX_NUM_PROCESSES", "two")
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES must be an integer, got 'two'"):
        partitioning.initialize_distributed()
    monkeypatch.delenv("JAX_NUM_PROCESSES")
    monkeypatch.setenv("T2T_DISTRIBUTED", "yes")
    with pytest.raises(ValueError, match="T2T_DISTRIBUTED must be 'auto' or unset"):
        partitioning.initialize_distributed()
    assert not jax.distributed.is_initialized()


WORKER = textwrap.dedent(
    """
    import os, sys
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import jax
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    from t2t import partitioning
    assert partitioning.initialize_distributed()  # from JAX_* environment variables
    import numpy as np
    mesh = partitioning.make_mesh(data=-1, model=1)
    partitioner = partitioning.Partitioner(mesh, partitioning.logical_axis_rules())
    index, num_shards = partitioner.data_shard()  # what data_shard_info() puts in a ShardInfo
    local = {"x": np.arange(4, dtype=np.float32).reshape(2, 2) + 10 * index}
    batch = partitioner.make_global_batch(local)
    total = jax.jit(lambda b: b["x"].sum(), out_shardings=partitioner.replicated)(batch)
    print("RESULT", jax.process_index(), index, num_shards, batch["x"].shape, float(total),
          flush=True)
    jax.distributed.shutdown()
    """
)


def test_two_processes_on_localhost_assemble_one_global_batch(tmp_path):
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    root = str(Path(__file__).resolve().parents[2])
    procs = []
    for pid in range(2):
        env = dict(
            os.environ,
            PYTHONPATH=root,
            JAX_COORDINATOR_ADDRESS=f"localhost:{port}",
            JAX_NUM_PROCESSES="2",
            JAX_PROCESS_ID=str(pid),
        )
        env.pop("XLA_FLAGS", None)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script)],
                env=env,
                cwd=root,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outputs = []
    try:
        for proc in procs:
            out, _ = proc.communicate(timeout=90)
            outputs.append(out)
    finally:
        for proc in procs:
            proc.kill()
    results = sorted(
        line.split()[1:]
        for out in outputs
        for line in out.splitlines()
        if line.startswith("RESULT")
    )
    assert len(results) == 2, "\n".join(outputs)
    # Each process read its own shard; the global [4, 2] batch sums both: 6 + 46.
    assert results == [["0", "0", "2", "(4,", "2)", "52.0"], ["1", "1", "2", "(4,", "2)", "52.0"]]
