"""Released checkpoints in a bucket: T5X (legacy and Orbax) and Mesh TensorFlow fixtures copied
into the emulator's bucket are converted, written back as T5X there, and fine-tuned from."""

import os

import jax
from flax import nnx

from t2t import cli, files
from t2t.checkpoints import hf, released, stored
from t2t.checkpoints.model_dir import ModelDir

from ..checkpoints.test_released import TOLERANCE, fixture, reference_gap
from ..checkpoints.test_released_runs import finetune, small_vocabulary_task  # noqa: F401

NAMES = ("t5x_legacy_tensorstore", "t5x_orbax", "mtf_v11")


def _in_bucket(name, bucket_dir):
    target = f"{bucket_dir}/{name}"
    files.copytree(fixture(name), target)
    return target


def test_each_format_is_read_from_the_bucket_and_t5x_written_to_it(gcs, bucket_dir, clean_dir):
    for name in NAMES:
        source = _in_bucket(name, bucket_dir)
        assert released.detect(source) is not None
        converted = f"{bucket_dir}/{name}_t2t"
        assert cli.main(["convert", source, converted, "--to=t2t"]) == 0
        loaded = ModelDir(converted).load()
        assert (
            reference_gap(loaded.config.replace(dropout_rate=0.0), loaded.params, name)[0]
            < TOLERANCE
        )
    written = f"{bucket_dir}/back_to_t5x"
    assert cli.main(["convert", f"{bucket_dir}/mtf_v11", written, "--to=t5x"]) == 0
    assert files.exists(f"{written}/checkpoint_1/checkpoint")
    opened = released.open_checkpoint(written, dropout_rate=0.0)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
        hf.abstract_state(opened.config),
    )
    params = stored.place(stored.match(opened.params, abstract, written), abstract)
    assert isinstance(params, nnx.State)
    assert reference_gap(opened.config, params, "mtf_v11")[0] < TOLERANCE
    assert not os.listdir(clean_dir)


def test_finetuning_starts_from_a_t5x_checkpoint_in_the_bucket(
    gcs,
    bucket_dir,
    clean_dir,
    small_vocabulary_task,  # noqa: F811 (the fixture imported above)
    capsys,
):
    source = _in_bucket("t5x_legacy_tensorstore", bucket_dir)
    run = f"{bucket_dir}/run"
    assert finetune(run, source, 2) == 0
    assert "trained steps 0 -> 2" in capsys.readouterr().out
    origin = ModelDir(run).metadata()["initialized_from"]
    assert origin["kind"] == "t5x" and origin["path"] == f"{source}/checkpoint_2"


def test_the_emulator_lists_a_key_range_as_gcs_does(gcs, bucket_dir):
    import numpy as np
    import tensorstore as ts

    bucket, prefix = files.split_bucket(bucket_dir)
    files.write_text(f"{bucket_dir}/keep/a", "a")
    spec = {
        "driver": "zarr",
        "kvstore": {"driver": "gcs", "bucket": bucket, "path": f"{prefix}/array/"},
        "metadata": {"shape": [4], "chunks": [4], "dtype": "<f4"},
    }
    ts.open(spec, create=True).result().write(np.ones(4, np.float32)).result()
    # Deleting the array's key range (its prefix) leaves every other object where it was.
    ts.open(spec, create=True, delete_existing=True).result()
    assert files.read_text(f"{bucket_dir}/keep/a") == "a"
