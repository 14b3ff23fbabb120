"""Checkpoints other frameworks wrote, read by t2t: each fixture of ../shared/checkpoints (written
by Google, T5X's own Checkpointer and Orbax manager, and mesh-tensorflow 0.1.21) reproduces the
logits its writer's network computed; the config comes from the files or the shapes; the slots
map by meaning; every malformed input is refused naming what is wrong."""

import os
import shutil

import jax
import numpy as np
import pytest
from flax import nnx, serialization

from t2t import nn as t2t_nn
from t2t.checkpoints import mtf, released, stored, t5x
from t2t.checkpoints.hf import abstract_state

SHARED = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "checkpoints")
WITH_LOGITS = ("t5x_legacy_google", "t5x_legacy_tensorstore", "t5x_orbax", "mtf_v10", "mtf_v11")
# Float32 sources, and bfloat16 ones upcast exactly: the writer's float32 network to rounding.
TOLERANCE = 1e-5


def fixture(name: str) -> str:
    path = os.path.realpath(os.path.join(SHARED, name))
    if not os.path.isdir(path):
        pytest.skip(f"the shared checkpoint fixtures are not beside the project ({path})")
    return path


def copy_of(name: str, tmp_path) -> str:
    """A writable copy of a fixture (the shared ones are read-only)."""
    target = tmp_path / name
    shutil.copytree(fixture(name), target)
    for root, dirs, names in os.walk(target):
        for entry in dirs + names:
            os.chmod(os.path.join(root, entry), 0o755)
    return str(target)


def on_device(config):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), abstract_state(config)
    )


def reference_gap(config, params, name: str) -> tuple[float, float]:
    """(largest |logit - reference|, share of equal argmaxes) at the real target positions."""
    graphdef, _ = nnx.split(nnx.eval_shape(lambda: t2t_nn.build(config, nnx.Rngs(0))))
    model = nnx.merge(graphdef, params)
    ref = np.load(os.path.join(fixture(name), "reference.npz"))
    enc, dec, tgt = ref["encoder_input_ids"], ref["decoder_input_ids"], ref["decoder_target_ids"]
    logits = np.asarray(model(enc, dec, (enc > 0).astype(np.int32), (tgt > 0).astype(np.int32)))
    real = tgt > 0
    gap = float(np.abs(logits - ref["logits"])[real].max())
    return gap, float((logits.argmax(-1) == ref["logits"].argmax(-1))[real].mean())


def load(path: str, **overrides):
    opened = released.open_checkpoint(path, dropout_rate=0.0, **overrides)
    abstract = on_device(opened.config)
    return opened, stored.place(stored.match(opened.params, abstract, opened.path), abstract)


@pytest.mark.parametrize("name", WITH_LOGITS)
def test_each_fixture_reproduces_the_logits_its_writer_computed(name):
    opened, params = load(fixture(name))
    gap, agree = reference_gap(opened.config, params, name)
    assert gap < TOLERANCE and agree == 1.0
    expected = {"t5x_orbax": "t5x_orbax", "mtf_v10": "mtf", "mtf_v11": "mtf"}.get(name, "t5x")
    assert opened.format == expected


def test_the_network_comes_from_the_shapes_and_the_rest_is_said():
    opened = released.open_checkpoint(fixture("t5x_legacy_tensorstore"))
    c = opened.config
    assert (c.vocab_size, c.d_model, c.num_heads, c.d_kv, c.d_ff) == (512, 32, 4, 12, 80)
    assert (c.num_encoder_layers, c.num_decoder_layers, c.logits_via_embedding) == (2, 2, False)
    assert opened.step == 2 and len(opened.params) == 52 and len(opened.slots) == 52
    assert opened.assumed == {
        "mlp_activations": ("gelu", "linear"),
        "relative_attention_max_distance": 128,
        "layer_norm_epsilon": 1e-6,
    }
    assert "taken from the T5 defaults" in opened.describe()
    ul2 = released.open_checkpoint(opened.path, mlp_activations=("silu", "linear"))
    assert ul2.config.mlp_activations == ("silu", "linear")
    assert "mlp_activations" not in ul2.assumed
    with pytest.raises(ValueError, match=r"does not fit .* whose MLP is gated"):
        released.open_checkpoint(opened.path, mlp_activations=("relu",))
    tied = released.open_checkpoint(fixture("mtf_v10")).config
    assert tied.logits_via_embedding and tied.mlp_activations == ("relu",)
    assert (tied.vocab_size, tied.d_model, tied.num_heads, tied.d_kv) == (128, 16, 2, 8)


def test_googles_mesh_tf_checkpoint_maps_every_name_and_its_gin_agrees_with_the_shapes():
    prefix = mtf.resolve_prefix(fixture("mtf_google_names"))
    arrays, step = mtf.read(prefix, data=False)  # its data shard is not in the fixture
    params, slots = released._split(arrays, prefix)
    assert len(params) + sum(len(s) for s in slots.values()) == 104  # + global_step = 105
    record = mtf.read_operative_config(prefix)
    config, assumed = released.infer_config(params, record, prefix, {})
    assert (config.d_model, config.num_heads, config.d_kv, config.d_ff) == (32, 2, 64, 64)
    assert config.mlp_activations == ("gelu", "linear") and not config.logits_via_embedding
    assert config.vocab_size == 32128 and step == 0
    assert "mlp_activations" not in assumed and "layer_norm_epsilon" not in assumed
    assert set(stored.leaves(abstract_state(config))) and set(params) == {
        "/".join(p) for p, _ in stored.leaves(abstract_state(config))
    }
    with pytest.raises(mtf.MtfFormatError, match=r"model.ckpt-0.data-00001-of-00002 is missing"):
        released.open_checkpoint(fixture("mtf_google_names"))


def test_mesh_tf_factored_slots_are_named_by_what_they_hold():
    # MTF drops the first of two equal dimensions, optax and T5X the last: a square kernel's
    # _slot_vr (indexed by its columns) is optax's v_col.
    assert mtf.slot_name("_slot_vr", (16, 16)) == "v_col"
    assert mtf.slot_name("_slot_vc", (16, 16)) == "v_row"
    assert mtf.slot_name("_slot_vr", (128, 16)) == "v_row"  # [vocab, d_model]
    assert mtf.slot_name("_slot_vc", (16, 32)) == "v_col"  # [d_model, d_ff]
    opened = released.open_checkpoint(fixture("mtf_v10"))
    query = opened.slots["encoder/layers_0/attention/query/kernel"]
    assert query["v_col"].name.endswith("SelfAttention/q_slot_vr")
    embedding = opened.slots["token_embedder/embedding"]
    assert embedding["v_row"].shape == (16,) and embedding["v_col"].shape == (128,)


def test_a_scanned_run_reads_the_layers_stacked_and_slice_by_slice():
    opened = released.open_checkpoint(fixture("t5x_orbax"), dropout_rate=0.0)
    plain = stored.match(opened.params, abstract_state(opened.config), opened.path)
    stacked = stored.stack_layers(plain)
    query = stacked[("encoder", "layers", "attention", "query", "kernel")]
    assert query.shape == (2, 32, 48)
    whole = query.read_all()
    np.testing.assert_array_equal(
        whole[1], plain[("encoder", "layers_1", "attention", "query", "kernel")].read_all()
    )
    np.testing.assert_array_equal(
        query.read((slice(1, 2), slice(8, 16), slice(None)))[0], whole[1, 8:16]
    )
    config = opened.config.replace(scan_layers=True)
    params = stored.place(stacked, on_device(config))
    gap, _ = reference_gap(config, params, "t5x_orbax")
    assert gap < TOLERANCE


# -- what is refused, and how it is said ---------------------------------------------------------


def _rewrite_msgpack(folder: str, edit) -> None:
    path = os.path.join(folder, t5x.MSGPACK_FILE)
    with open(path, "rb") as f:
        contents = serialization.msgpack_restore(f.read())
    edit(contents)
    with open(path, "wb") as f:
        f.write(serialization.msgpack_serialize(contents))


def test_broken_t5x_checkpoints_are_refused_naming_what_is_wrong(tmp_path, capsys):
    import re

    from t2t import cli

    def refused(path, pattern):  # exit 2, one line saying what is wrong, nothing written
        out = tmp_path / "out"
        assert cli.main(["convert", path, str(out), "--to=t2t"]) == 2
        err = capsys.readouterr().err
        assert re.search(pattern, err) and "Traceback" not in err, err
        assert not out.exists()

    folder = os.path.join(copy_of("t5x_legacy_tensorstore", tmp_path / "a"), "checkpoint_2")
    msgpack = os.path.join(folder, t5x.MSGPACK_FILE)
    with open(msgpack, "rb") as f:
        data = f.read()
    with open(msgpack, "wb") as f:
        f.write(data[: len(data) // 2])
    refused(folder, r"is not a complete T5X msgpack file .* truncated")

    folder = os.path.join(copy_of("t5x_legacy_tensorstore", tmp_path / "b"), "checkpoint_2")
    os.remove(os.path.join(folder, "target.encoder.layers_0.mlp.wo.kernel", "0.0"))
    refused(folder, r"target/encoder/layers_0/mlp/wo/kernel: reading it failed .* chunk")

    folder = os.path.join(copy_of("t5x_legacy_tensorstore", tmp_path / "c"), "checkpoint_2")
    _rewrite_msgpack(folder, lambda c: c.update(version=2))
    refused(folder, r"version 2; t2t reads version 3 .* uint16")

    folder = os.path.join(copy_of("t5x_legacy_google", tmp_path / "d"), "checkpoint_0")

    def add_unknown(contents):
        target = contents["optimizer"]["target"]
        target["encoder"]["layers_0"]["extra"] = {"kernel": np.zeros((8, 8), np.float32)}

    _rewrite_msgpack(folder, add_unknown)
    refused(folder, r"its arrays \[encoder/layers_0/extra/kernel\] are not parameters of the model")

    folder = os.path.join(copy_of("t5x_legacy_google", tmp_path / "e"), "checkpoint_0")
    _rewrite_msgpack(folder, lambda c: c["optimizer"]["target"]["decoder"].pop("decoder_norm"))
    refused(folder, r"the model's parameters \[decoder/decoder_norm/scale\] are not in it")


def test_arrays_that_contradict_the_run_are_named_with_both_shapes():
    opened = released.open_checkpoint(fixture("t5x_legacy_tensorstore"))
    other = abstract_state(opened.config.replace(d_ff=64))
    with pytest.raises(
        ValueError,
        match=r"layers_0/mlp/wi_0/kernel has shape \(32, 80\), but the model's .* is \(32, 64\)",
    ):
        stored.match(opened.params, other, opened.path)


def test_unknown_mesh_tf_variables_are_refused_by_name(tmp_path):
    import tensorflow as tf

    reader = tf.train.load_checkpoint(fixture("mtf_v11"))
    names = sorted(reader.get_variable_to_shape_map())
    tensors = [tf.constant(reader.get_tensor(n)) for n in names]
    names.append("encoder/block_000/layer_001/DenseReluDense/wi_2/kernel")
    tensors.append(tf.zeros((16, 32), tf.bfloat16))
    prefix = str(tmp_path / "model.ckpt-5")
    tf.raw_ops.SaveV2(
        prefix=prefix, tensor_names=names, shape_and_slices=[""] * len(names), tensors=tensors
    )
    with pytest.raises(ValueError, match=r"1 array\(s\) no rule maps .*DenseReluDense/wi_2/kernel"):
        released.open_checkpoint(str(tmp_path))


def test_per_layer_position_biases_are_refused_as_umt5s_layout(tmp_path):
    folder = os.path.join(copy_of("t5x_legacy_google", tmp_path), "checkpoint_0")

    def per_layer(contents):
        target = contents["optimizer"]["target"]["encoder"]
        target["layers_1"]["relpos_bias"] = {"rel_embedding": np.zeros((4, 32), np.float32)}

    _rewrite_msgpack(folder, per_layer)
    with pytest.raises(ValueError, match=r"relative position bias in every layer .* umT5"):
        released.open_checkpoint(folder)


def test_the_depths_of_the_stacks_come_from_the_layers_present(tmp_path):
    # ByT5's encoder is three times as deep as its decoder.
    folder = os.path.join(copy_of("t5x_legacy_google", tmp_path), "checkpoint_0")

    def one_decoder_layer(contents):
        contents["optimizer"]["target"]["decoder"].pop("layers_1")
        contents["optimizer"]["state"]["param_states"]["decoder"].pop("layers_1")

    _rewrite_msgpack(folder, one_decoder_layer)
    config = released.open_checkpoint(folder).config
    assert (config.num_encoder_layers, config.num_decoder_layers) == (2, 1)


def test_the_format_is_told_from_the_files(tmp_path):
    assert released.detect(fixture("t5x_legacy_google")) == released.T5X
    assert (
        released.detect(os.path.join(fixture("t5x_legacy_google"), "checkpoint_0", "checkpoint"))
        == released.T5X
    )
    assert released.detect(fixture("t5x_orbax")) == released.T5X_ORBAX
    assert (
        released.detect(os.path.join(fixture("t5x_orbax"), "checkpoint_2", "state"))
        == released.T5X_ORBAX
    )
    assert released.detect(fixture("mtf_v10")) == released.MTF
    assert released.detect(os.path.join(fixture("mtf_v10"), "model.ckpt-0")) == released.MTF
    assert released.detect(str(tmp_path)) is None
    assert t5x.chunk_shape((32128, 2048), 4) == [1004, 1024]
    assert t5x.chunk_shape((4, 1024, 4096), 4, limit=1 << 20) == [4, 256, 256]
    assert t5x.chunk_shape((32, 48), 2) == [32, 48]


# -- the optimizer state -------------------------------------------------------------------------


def _gradient(k: int, shape) -> np.ndarray:
    """The k-th parameter's gradient of data/t5x_next_step.npz (README.md there)."""
    n = int(np.prod(shape))
    return (
        (0.01 * np.sin(1.7 * np.arange(n, dtype=np.float64) + k)).astype(np.float32).reshape(shape)
    )


@pytest.mark.parametrize("scan", [False, True], ids=["unscanned", "scanned"])
def test_one_step_after_importing_t5xs_state_is_t5xs_own_next_step(scan):
    import optax

    from t2t import optim
    from t2t.trainer import optimizer_state

    opened = released.open_checkpoint(fixture("t5x_legacy_tensorstore"))
    config = opened.config.replace(scan_layers=scan)
    arrays = stored.match(opened.params, abstract_state(opened.config), opened.path)
    gradients = {
        path: stored.in_memory("/".join(path), _gradient(k, arrays[path].shape))
        for k, path in enumerate(sorted(arrays))
    }
    if scan:
        arrays, gradients = stored.stack_layers(arrays), stored.stack_layers(gradients)
    params = stored.place(arrays, on_device(config))
    grads = stored.place(gradients, on_device(config))
    tx = optim.adafactor(0.01, min_dim_size_to_factor=32)  # as the fixture was trained
    state = optimizer_state.import_slots(tx.init(params), opened)
    counts = [
        leaf
        for path, leaf in jax.tree_util.tree_leaves_with_path(state)
        if "count" in jax.tree_util.keystr(path)
    ]
    assert counts and all(int(np.max(c)) == 2 for c in counts)
    updates, _ = tx.update(grads, state, params)
    new = nnx.to_pure_dict(optax.apply_updates(params, updates))
    golden = np.load(os.path.join(os.path.dirname(__file__), "data", "t5x_next_step.npz"))
    assert int(golden["step"]) == 3
    compared = 0
    for key in golden.files:
        if not key.startswith("param/"):
            continue
        path = key[len("param/") :].split("/")
        layer = int(path[1][len("layers_") :]) if scan and path[1].startswith("layers_") else None
        node = new
        for name in [path[0], "layers", *path[2:]] if layer is not None else path:
            node = node[name]
        value = np.asarray(node)[layer] if layer is not None else np.asarray(node)
        np.testing.assert_allclose(value, golden[key], rtol=1e-6, atol=1e-8)
        compared += 1
    assert compared == 5


def test_a_state_t2t_cannot_continue_is_refused(tmp_path):
    from t2t import optim
    from t2t.trainer import optimizer_state

    opened = released.open_checkpoint(fixture("t5x_legacy_tensorstore"))
    params = stored.place(
        stored.match(opened.params, on_device(opened.config), opened.path), on_device(opened.config)
    )
    with pytest.raises(
        ValueError, match=r"factors this parameter differently.*min_dim_size_to_factor"
    ):
        optimizer_state.import_slots(optim.adafactor(0.01).init(params), opened)  # 128: unfactored
    import optax

    with pytest.raises(ValueError, match=r"needs the run's optimizer to be Adafactor"):
        optimizer_state.import_slots(optax.adamw(1e-3).init(params), opened)
