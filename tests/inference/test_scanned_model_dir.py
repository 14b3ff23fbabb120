"""A model directory trained with scanned layers is an ordinary model directory: inference,
averaging, HF export and fine-tuning from it give what its unscanned twin gives."""

import json
import os

import jax
import numpy as np
from flax import nnx
from safetensors.numpy import load_file

from t2t import inference, nn, partitioning, release
from t2t.checkpoints import averaging
from t2t.trainer import sources

from .conftest import write_model_dir

TEXTS = ["Return the absolute value of a number.", "if x == 1: return y"]


def twin_dirs(root, config, params_by_step, vocabulary_file):
    """The same parameters saved unscanned and scanned."""
    scanned = config.replace(scan_layers=True)
    flat_dir = write_model_dir(root / "flat", config, params_by_step, vocabulary_file)
    scanned_dir = write_model_dir(
        root / "scanned",
        scanned,
        {step: nn.to_layout(p, scanned) for step, p in params_by_step.items()},
        vocabulary_file,
    )
    return flat_dir, scanned_dir


def test_scanned_model_dir_infers_averages_and_exports_like_its_twin(
    tmp_path, config, params_a, params_b, vocabulary_file
):
    flat_dir, scanned_dir = twin_dirs(
        tmp_path, config, {10: params_a, 20: params_b}, vocabulary_file
    )
    with open(os.path.join(scanned_dir, "model_config.json")) as f:
        assert json.load(f)["scan_layers"] is True
    inputs = tmp_path / "inputs.jsonl"
    inputs.write_text("".join(json.dumps({"inputs": t}) + "\n" for t in TEXTS))
    outputs = {}
    for name, model_dir in (("flat", flat_dir), ("scanned", scanned_dir)):
        out = tmp_path / f"{name}.jsonl"
        inference.infer(
            str(out),
            model_dir=model_dir,
            input_file=str(inputs),
            batch_size=2,
            max_decode_length=6,
            checkpoints=["10", "20"],
        )  # an ensemble too
        outputs[name] = out.read_text()
    assert outputs["scanned"] == outputs["flat"] and outputs["flat"].count("prediction") == 2

    flat_mean = averaging.average_checkpoints(flat_dir, last=2).params
    scanned_mean = averaging.average_checkpoints(scanned_dir, last=2).params
    assert "layers" in scanned_mean["encoder"]
    for got, want in zip(
        jax.tree.leaves(nn.to_layout(scanned_mean, config)), jax.tree.leaves(flat_mean), strict=True
    ):
        np.testing.assert_array_equal(got, want)

    exported = {}
    for name, model_dir in (("flat", flat_dir), ("scanned", scanned_dir)):
        path = release.export(model_dir, str(tmp_path / f"release_{name}"))
        exported[name] = load_file(os.path.join(path, "model.safetensors"))
    assert exported["scanned"].keys() == exported["flat"].keys()
    for key, value in exported["flat"].items():
        np.testing.assert_array_equal(exported["scanned"][key], value, err_msg=key)


def test_fine_tuning_converts_a_checkpoint_of_the_other_layout(
    tmp_path, config, params_a, vocabulary_file
):
    _, scanned_dir = twin_dirs(tmp_path, config, {10: params_a}, vocabulary_file)
    partitioner = partitioning.make_partitioner(2, 4, mode="fsdp")
    _, abstract = partitioner.abstract_model(lambda: nn.build(config, nnx.Rngs(params=0)))
    params, description = sources.load_params(
        scanned_dir, config, abstract, partitioner=partitioner
    )
    assert description["step"] == 10
    for got, want, target in zip(
        jax.tree.leaves(params), jax.tree.leaves(params_a), jax.tree.leaves(abstract), strict=True
    ):
        np.testing.assert_array_equal(got, want)
        assert got.sharding == target.sharding
