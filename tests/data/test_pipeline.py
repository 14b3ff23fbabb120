"""Input pipeline: numpy batches, determinism, exact save/restore, host sharding."""

import functools

import numpy as np
import pytest
import seqio
import tensorflow as tf

from t2t.data import pipeline
from t2t.data.tasks import text

LENGTHS = {"inputs": 128, "targets": 32}


@seqio.map_over_dataset
def _format_package(example):
    return {"inputs": example["docstring"], "targets": example["package"]}


@seqio.map_over_dataset
def _copy_line(line):
    return {"inputs": tf.strings.join(["copy: ", line]), "targets": line}


@pytest.fixture(scope="module")
def tasks(builtin_corpus, builtin_vocabulary):
    """Two supervised tasks, their mixture, and an LM task on the (small) validation split."""
    for name in ("pipetest_package", "pipetest_copy", "pipetest_lm", "pipetest_mix"):
        seqio.TaskRegistry.remove(name)
        seqio.MixtureRegistry.remove(name)
    seqio.TaskRegistry.add(
        "pipetest_package",
        source=seqio.TextLineDataSource({"train": builtin_corpus.package_path("validation")}),
        preprocessors=[
            functools.partial(text.parse_tsv, field_names=("docstring", "package")),
            _format_package,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(builtin_vocabulary),
    )
    seqio.TaskRegistry.add(
        "pipetest_lm",
        source=seqio.TextLineDataSource({"train": builtin_corpus.corpus_path("validation")}),
        preprocessors=[
            text.line_to_text,
            functools.partial(seqio.preprocessors.rekey, key_map={"targets": "text"}),
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(builtin_vocabulary, has_inputs=False),
    )
    seqio.TaskRegistry.add(
        "pipetest_copy",
        source=seqio.TextLineDataSource({"train": builtin_corpus.corpus_path("validation")}),
        preprocessors=[
            _copy_line,
            seqio.preprocessors.tokenize,
            seqio.preprocessors.append_eos_after_trim,
        ],
        output_features=text.output_features(builtin_vocabulary),
    )
    seqio.MixtureRegistry.add("pipetest_mix", [("pipetest_package", 1.0), ("pipetest_copy", 3.0)])
    return builtin_corpus


def _config(**overrides):
    settings = dict(
        mixture_or_task="pipetest_package",
        task_feature_lengths=LENGTHS,
        global_batch_size=4,
        seed=7,
    )
    settings.update(overrides)
    return pipeline.PipelineConfig(**settings)


def _take(iterator, n):
    return [next(iterator) for _ in range(n)]


def _assert_same(batches_a, batches_b):
    assert len(batches_a) == len(batches_b)
    for a, b in zip(batches_a, batches_b):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_batches_are_numpy_with_model_features(tasks):
    batch = next(pipeline.InputPipeline(_config()))
    assert set(batch) == {
        "encoder_input_tokens",
        "encoder_segment_ids",
        "encoder_positions",
        "decoder_target_tokens",
        "decoder_input_tokens",
        "decoder_loss_weights",
        "decoder_segment_ids",
        "decoder_positions",
    }
    assert batch["encoder_input_tokens"].shape == (4, 128) and batch[
        "decoder_target_tokens"
    ].shape == (4, 32)
    assert all(isinstance(v, np.ndarray) and v.dtype == np.int32 for v in batch.values())
    assert (batch["encoder_segment_ids"].max(axis=1) > 1).any()  # rows are packed
    assert not tf.config.get_visible_devices("GPU")  # TF kept off accelerators


def test_same_seed_same_batches_other_seed_other_batches(tasks):
    config = _config(mixture_or_task="pipetest_mix")
    first = _take(pipeline.InputPipeline(config), 3)
    _assert_same(first, _take(pipeline.InputPipeline(config), 3))
    other = _take(pipeline.InputPipeline(_config(mixture_or_task="pipetest_mix", seed=8)), 3)
    assert any(
        (a["encoder_input_tokens"] != b["encoder_input_tokens"]).any() for a, b in zip(first, other)
    )


@pytest.mark.parametrize(
    "name,architecture", [("builtin_multitask", "encoder_decoder"), ("pipetest_lm", "decoder_only")]
)
def test_restore_continues_exactly(tasks, builtin_tasks, tmp_path, name, architecture):
    config = _config(mixture_or_task=name, architecture=architecture)
    uninterrupted = pipeline.InputPipeline(config)
    _take(uninterrupted, 3)
    uninterrupted.save(str(tmp_path))
    expected = _take(uninterrupted, 4)
    resumed = pipeline.InputPipeline(config)  # a fresh process would build the same pipeline
    resumed.restore(str(tmp_path))
    _assert_same(_take(resumed, 4), expected)
    with pytest.raises(ValueError, match="No data iterator state"):
        resumed.restore(str(tmp_path / "elsewhere"))


def test_no_autotuning_model_and_positions_saved_with_one_restore(tasks, tmp_path):
    """The pipeline runs without tf.data's autotuning model (destroying an iterator waited for
    its thread, up to a minute); an iterator position saved by a pipeline that had it (t2t
    before 2026-11-29) restores into today's and continues with the same batches."""
    config = _config()
    assert pipeline.build_dataset(config).options().autotune.enabled is False
    options = tf.data.Options()
    options.autotune.enabled = True
    autotuned = iter(pipeline.build_dataset(config).with_options(options))
    for _ in range(3):
        next(autotuned)
    tf.train.Checkpoint(iterator=autotuned).write(str(tmp_path / pipeline._CHECKPOINT_NAME))
    expected = [{k: v.numpy() for k, v in next(autotuned).items()} for _ in range(2)]
    resumed = pipeline.InputPipeline(config)
    resumed.restore(str(tmp_path))
    _assert_same(_take(resumed, 2), expected)


def test_two_hosts_partition_the_data(tasks):
    def rows(**overrides):
        config = _config(num_epochs=1, shuffle=False, pack=False, **overrides)
        return [
            tuple(row)
            for batch in pipeline.InputPipeline(config)
            for row in batch["encoder_input_tokens"]
        ]

    everything = rows(global_batch_size=2)
    shard0 = rows(shard_index=0, num_shards=2, global_batch_size=2)
    shard1 = rows(shard_index=1, num_shards=2, global_batch_size=2)
    assert len(everything) == tasks.stats["package_validation"]["examples"]
    assert sorted(shard0 + shard1) == sorted(everything)
    assert abs(len(shard0) - len(shard1)) <= 1 and not set(shard0) & set(shard1)


def test_bad_configs_explain_themselves():
    with pytest.raises(ValueError, match="multiple of the number of shards"):
        _config(global_batch_size=5, num_shards=2)
    with pytest.raises(ValueError, match="shard_index"):
        _config(shard_index=2, num_shards=2)
