"""`t2t convert`: every fixture written as t2t, HF and T5X checkpoints that compute its writer's
logits; T5X output read back with the plain libraries and laid out as Google's own T5X file;
round trips through T5X and HF bit for bit."""

import json
import os

import jax
import numpy as np
import pytest
from flax import serialization

from t2t import cli
from t2t.checkpoints import hf, released, stored, t5x
from t2t.checkpoints.model_dir import ModelDir

from .test_released import TOLERANCE, WITH_LOGITS, fixture, reference_gap


def convert(source, destination, to, *extra) -> int:
    return cli.main(["convert", str(source), str(destination), f"--to={to}", *extra])


@pytest.mark.parametrize("name", WITH_LOGITS)
def test_every_fixture_converts_to_each_format_with_its_logits(name, tmp_path):
    assert convert(fixture(name), tmp_path / "t2t", "t2t") == 0
    loaded = ModelDir(tmp_path / "t2t").load()
    assert (
        reference_gap(loaded.config.replace(dropout_rate=0.0), loaded.params, name)[0] < TOLERANCE
    )

    assert convert(fixture(name), tmp_path / "hf", "hf") == 0
    config, state = hf.import_hf(tmp_path / "hf", dropout_rate=0.0)
    assert reference_gap(config, state, name)[0] < TOLERANCE

    assert convert(fixture(name), tmp_path / "t5x", "t5x") == 0
    opened = released.open_checkpoint(str(tmp_path / "t5x"), dropout_rate=0.0)
    params = stored.place(
        stored.match(opened.params, hf.abstract_state(opened.config), ""), _on_device(opened.config)
    )
    assert reference_gap(opened.config, params, name)[0] < TOLERANCE


def _on_device(config):
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device), hf.abstract_state(config)
    )


def test_hf_transformers_computes_the_fixtures_logits_from_the_converted_directory(tmp_path):
    import torch
    from transformers import T5ForConditionalGeneration

    for name in ("mtf_v10", "t5x_orbax"):  # tied and scaled ReLU; gated GELU, separate logits
        assert convert(fixture(name), tmp_path / name, "hf") == 0
        model = T5ForConditionalGeneration.from_pretrained(tmp_path / name).eval()
        ref = np.load(os.path.join(fixture(name), "reference.npz"))
        enc, tgt = ref["encoder_input_ids"], ref["decoder_target_ids"]
        with torch.no_grad():
            logits = model(
                input_ids=torch.tensor(enc),
                attention_mask=torch.tensor((enc > 0).astype(np.int64)),
                decoder_input_ids=torch.tensor(ref["decoder_input_ids"]),
            ).logits.numpy()
        assert np.abs(logits - ref["logits"])[tgt > 0].max() < TOLERANCE


def _leaves(tree, prefix=""):
    if isinstance(tree, dict) and not ("kvstore" in tree and "driver" in tree):
        for key, value in tree.items():
            yield from _leaves(value, f"{prefix}{key}/")
    else:
        yield prefix.rstrip("/"), tree


def _read_plainly(step_folder: str) -> dict:
    """A legacy T5X step folder read with flax.serialization and TensorStore, as T5X reads it."""
    import tensorstore as ts

    with open(os.path.join(step_folder, "checkpoint"), "rb") as f:
        contents = serialization.msgpack_restore(f.read())
    values = {}
    for name, leaf in _leaves(contents["optimizer"]):
        if isinstance(leaf, dict):
            assert leaf["kvstore"]["driver"] == "file" and not os.path.isabs(
                leaf["kvstore"]["path"]
            )
            spec = {
                "driver": "zarr",
                "kvstore": {
                    "driver": "file",
                    "path": os.path.join(step_folder, leaf["kvstore"]["path"]),
                },
            }
            values[name] = ts.open(spec).result().read().result()
        else:
            values[name] = np.asarray(leaf)
    return contents["version"], values


def test_the_t5x_writer_lays_out_what_googles_t5x_file_holds(tmp_path):
    assert convert(fixture("t5x_legacy_google"), tmp_path / "out", "t5x", "--dtype=bfloat16") == 0
    version, ours = _read_plainly(str(tmp_path / "out" / "checkpoint_0"))
    _, google = _read_plainly(os.path.join(fixture("t5x_legacy_google"), "checkpoint_0"))
    assert version == 3
    assert sorted(ours) == sorted(google)  # the same train state: target, 4 slots each, step
    for name, value in google.items():
        assert ours[name].shape == value.shape, name
        if name.startswith("target/"):
            assert ours[name].dtype == np.dtype("bfloat16")
            np.testing.assert_array_equal(ours[name], value.astype("bfloat16"))
        else:
            assert ours[name].dtype == value.dtype, name
            np.testing.assert_array_equal(ours[name], value)
    assert ours["state/step"].dtype == np.int32


def test_a_fresh_t5x_state_is_what_t5xs_adafactor_starts_from():
    from t2t.conversion import t5x_slots

    factored = t5x_slots({}, (512, 128))
    assert [factored[s].shape for s in ("v_row", "v_col", "v", "m")] == [(128,), (512,), (1,), (1,)]
    small = t5x_slots({}, (32, 48))  # under min_dim_size_to_factor = 128: the full v
    assert [small[s].shape for s in ("v_row", "v_col", "v", "m")] == [(1,), (1,), (32, 48), (1,)]
    assert all(not np.any(np.asarray(v)) for v in (*factored.values(), *small.values()))


def test_t2t_to_t5x_and_hf_and_back_are_bit_exact_in_float32(tmp_path):
    assert convert(fixture("t5x_orbax"), tmp_path / "run", "t2t") == 0  # float32 parameters
    original = ModelDir(tmp_path / "run").load()
    for to in ("t5x", "hf"):
        assert convert(tmp_path / "run", tmp_path / to, to) == 0
        assert convert(tmp_path / to, tmp_path / f"back_{to}", "t2t") == 0
        again = ModelDir(tmp_path / f"back_{to}").load()
        assert again.config.replace(dropout_rate=0.0) == original.config.replace(dropout_rate=0.0)
        jax.tree.map(
            lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)),
            again.params.to_pure_dict(),
            original.params.to_pure_dict(),
        )
    meta = json.loads((tmp_path / "back_t5x" / "model_config.json").read_text())
    assert meta["d_model"] == 32


def test_a_trained_runs_adafactor_slots_go_to_t5x_as_they_are(straight_micro_run, tmp_path):
    assert convert(straight_micro_run, tmp_path / "t5x", "t5x") == 0
    _, values = _read_plainly(str(tmp_path / "t5x" / "checkpoint_9"))
    source = ModelDir(straight_micro_run)
    assert int(values["state/step"]) == 9
    slots = t5x.read_orbax_item(os.path.join(straight_micro_run, "checkpoints", "9", "opt_state"))
    for name, array in slots.items():
        parts = name.split("/")
        if "v_row" in parts and "kernel" in parts:
            path = "/".join(parts[parts.index("v_row") + 1 : -1])
            np.testing.assert_array_equal(
                values[f"state/param_states/{path}/v_row"], array.read_all()
            )
            break
    else:
        raise AssertionError(f"no factored slot in {sorted(slots)[:4]}")
    assert source.config().vocab_size == values["target/token_embedder/embedding"].shape[0]


def test_what_convert_refuses(tmp_path, capsys):
    assert convert(tmp_path / "nothing", tmp_path / "out", "t2t") == 2
    assert "is no checkpoint t2t reads" in capsys.readouterr().err
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert convert(fixture("mtf_v10"), tmp_path / "full", "t5x") == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert convert(fixture("mtf_google_names"), tmp_path / "o", "t2t") == 2
    assert "data-00001-of-00002 is missing" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_a_t5x_write_that_fails_leaves_no_step_folder(tmp_path, capsys):
    from .test_released import copy_of

    folder = os.path.join(copy_of("t5x_legacy_tensorstore", tmp_path), "checkpoint_2")
    os.remove(os.path.join(folder, "target.encoder.layers_1.mlp.wo.kernel", "0.0"))
    assert convert(folder, tmp_path / "out", "t5x") == 2  # fails half way through the arrays
    assert "target/encoder/layers_1/mlp/wo/kernel: reading it failed" in capsys.readouterr().err
    assert os.listdir(tmp_path / "out") == []  # neither checkpoint_2 nor its staging folder
