"""Data, chains and studies in the bucket (the GCS emulator): `t2t cache` writes a seqio cache
there that reads back as the task itself; the C4 pipeline reads WET files from and writes its
shards to the bucket, two Beam worker processes writing what one process writes; a micro study
keeps every stage, chain record and report in the bucket."""

import collections
import importlib.util
import json
import os

import pytest
import seqio

from t2t import cli, files

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load(name, path):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def seqio_cache_dirs():
    before = seqio.get_global_cache_dirs()
    yield
    seqio.set_global_cache_dirs(before)


def test_a_seqio_cache_written_to_the_bucket_reads_back_as_the_task(
    gcs, bucket_dir, clean_dir, listing, capsys, seqio_cache_dirs, train_argv
):
    cache_dir = f"{bucket_dir}/seqio_cache"
    argv = ["cache", "--task", "builtin_package", "--output_cache_dir", cache_dir]
    both = [*argv, "--task", "builtin_span_corruption", "--module", "t2t.data.tasks.builtin"]
    assert cli.main(both) == 0
    out = capsys.readouterr().out
    assert f"builtin_package: {cache_dir}/builtin_package" in out
    # What the command says to do next, as docs/cloud.md does it: train on the cache.
    assert f"--seqio_cache_dir={cache_dir} --gin.t2t.runs.DataOptions.use_cached=True" in out
    run = f"{bucket_dir}/run"
    cached = ["--gin.t2t.runs.DataOptions.use_cached=True", f"--seqio_cache_dir={cache_dir}"]
    assert cli.main(train_argv(run, 2, *cached)) == 0
    assert "trained steps 0 -> 2" in capsys.readouterr().out
    held = set(listing(f"{cache_dir}/builtin_package"))
    assert {"COMPLETED", "info.train.json", "info.validation.json"} <= held
    assert cli.main(argv) == 0 and "already cached" in capsys.readouterr().out

    task = seqio.get_mixture_or_task("builtin_package")

    def examples(use_cached):
        dataset = task.get_dataset(
            {"inputs": 64, "targets": 8},
            split="validation",
            use_cached=use_cached,
            shuffle=False,
            num_epochs=1,
        )
        return sorted(
            (tuple(e["inputs"]), tuple(e["targets"])) for e in dataset.as_numpy_iterator()
        )

    seqio.add_global_cache_dirs([cache_dir])
    task._cache_dir = None  # seqio memoizes the lookup
    try:
        cached, fresh = examples(True), examples(False)
        read_from = task.cache_dir  # the directory seqio found the cache in
    finally:
        task._cache_dir = None
    if cached != fresh:  # say how they differ (once seen in a full suite run, never alone)
        only_cached = collections.Counter(cached) - collections.Counter(fresh)
        only_fresh = collections.Counter(fresh) - collections.Counter(cached)
        pytest.fail(
            f"{len(cached)} cached examples (read from {read_from}, global cache dirs "
            f"{seqio.get_global_cache_dirs()}) against {len(fresh)} from the task: "
            f"{sum(only_cached.values())} only in the cache, {sum(only_fresh.values())} only "
            f"in the task; {cache_dir}/builtin_package holds "
            f"{sorted(listing(f'{cache_dir}/builtin_package'))}"
        )
    assert len(cached) > 10
    assert os.listdir(clean_dir) == []


def test_the_c4_pipeline_reads_and_writes_the_bucket_two_workers_as_one(
    gcs, bucket_dir, clean_dir, tmp_path, listing
):
    import tensorflow as tf

    from c4_pipeline import __main__ as c4_cli

    fixture = _load("c4_fixture", "tests/c4_pipeline/conftest.py")
    for path in fixture.write_fixture(tmp_path):
        files.copy(path, f"{bucket_dir}/wet/{os.path.basename(path)}")
    files.write_text(f"{bucket_dir}/wet/badwords.txt", "\n".join(fixture.BADWORDS) + "\n")
    common = [
        f"--wet_paths={bucket_dir}/wet/*.warc.wet*",
        f"--badwords_file={bucket_dir}/wet/badwords.txt",
        "--num_shards=2",
        "--runner=DirectRunner",
    ]
    two = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert c4_cli.main([*common, f"--output_dir={bucket_dir}/one"]) == 0
    assert c4_cli.main([*common, *two, f"--output_dir={bucket_dir}/two"]) == 0

    def written(directory):
        shards = sorted(n for n in listing(directory) if n.startswith("c4-"))
        records = sorted(
            record
            for shard in shards
            for record in tf.data.TFRecordDataset(f"{directory}/{shard}").as_numpy_iterator()
        )
        return shards, records, json.loads(files.read_text(f"{directory}/stats.json"))

    one, two_workers = written(f"{bucket_dir}/one"), written(f"{bucket_dir}/two")
    assert one[0] == ["c4-train.tfrecord-00000-of-00002", "c4-train.tfrecord-00001-of-00002"]
    assert one == two_workers and len(one[1]) == 2
    assert os.listdir(clean_dir) == []


def test_a_micro_study_and_its_chains_keep_everything_in_the_bucket(
    gcs, bucket_dir, clean_dir, tmp_path, listing, capsys
):
    """The study's pre-trained arm is a chain (pretrain, then fine-tune from it): its stages,
    its record and the fine-tuning's start are all in the bucket."""
    harness = _load("fault_injection", "benchmarks/fault_injection.py")
    spec = harness.write_spec("study", str(tmp_path), steps=2, checkpoint_every=2)
    study_dir = f"{bucket_dir}/study"
    assert cli.main(harness.command(study_dir, 2, 2, "study", spec)[3:]) == 0
    out = capsys.readouterr().out
    assert f"study written to {study_dir}/study.md" in out
    held = set(listing(study_dir))
    assert {"study.json", "study.md", "study.png", "baselines.json"} <= held
    scores = [n for n in held if n.endswith("/score.json")]
    assert len(scores) == 2  # the fine-tuned arm and the one from scratch
    result = json.loads(files.read_text(f"{study_dir}/study.json"))
    assert result["missing"] == [] and set(result["arms"]) == {"pre-trained", "no pre-training"}

    (record,) = [n for n in held if n.startswith("pre-trained/") and n.endswith("/chain.json")]
    chain_dir = f"{study_dir}/{record.rsplit('/', 1)[0]}"
    stages = json.loads(files.read_text(f"{study_dir}/{record}"))["stages"]
    assert [r["name"] for r in stages] == ["pretrain", "finetune"]
    for r in stages:
        assert files.exists(f"{r['model_dir']}/checkpoints/2/commit_success.txt"), r
        assert files.exists(f"{r['model_dir']}/config.gin"), r
    pretrain, finetune = (r["model_dir"] for r in stages)
    assert finetune == f"{chain_dir}/finetune" and pretrain.startswith(f"{study_dir}/")
    finetuned = json.loads(files.read_text(f"{finetune}/checkpoints/2/metadata/metadata"))
    assert finetuned["initialized_from"]["path"] == pretrain
    assert os.listdir(clean_dir) == []


TASK_MODULE = """
import seqio
import tensorflow_datasets as tfds
from t2t.data import vocab


class T2tLines(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        features = tfds.features.FeaturesDict({{"text": tfds.features.Text()}})
        return tfds.core.DatasetInfo(builder=self, features=features)

    def _split_generators(self, dl_manager):
        return {{"train": self._generate_examples()}}

    def _generate_examples(self):
        for i in range(40):
            yield i, {{"text": f"def function_{{i}}(x): return x + {{i}}"}}


VOCABULARY = vocab.load_vocabulary({vocab_path!r})
seqio.TaskRegistry.add(
    "t2t_lines_copy",
    source=seqio.TfdsDataSource(tfds_name="t2t_lines:1.0.0"),
    preprocessors=[
        lambda ds: seqio.preprocessors.rekey(ds, {{"inputs": "text", "targets": "text"}}),
        seqio.preprocessors.tokenize,
        seqio.preprocessors.append_eos,
    ],
    output_features={{"inputs": seqio.Feature(VOCABULARY), "targets": seqio.Feature(VOCABULARY)}},
)
"""


def test_a_tfds_dataset_prepared_in_the_bucket_trains_a_task(
    gcs, bucket_dir, clean_dir, tmp_path, builtin_corpus, train_argv, capsys, monkeypatch
):
    """A TFDS dataset prepared into the bucket (TFDS writes it, then renames its directory on
    the store) read by a user's task through --tfds_data_dir=gs://..."""
    import importlib

    module = f"lines_task_{os.getpid()}"
    (tmp_path / f"{module}.py").write_text(
        TASK_MODULE.format(vocab_path=builtin_corpus.vocabulary_path)
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data_dir = f"{bucket_dir}/tfds"
    importlib.import_module(module).T2tLines(data_dir=data_dir).download_and_prepare()
    monkeypatch.delenv("TFDS_DATA_DIR", raising=False)
    argv = train_argv(
        f"{bucket_dir}/run",
        2,
        "--import",
        module,
        f"--tfds_data_dir={data_dir}",
        "--gin.MIXTURE_OR_TASK='t2t_lines_copy'",
        "--gin.EVAL_TASKS=[]",
    )
    try:
        assert cli.main(argv) == 0, capsys.readouterr().err[-3000:]
    finally:
        seqio.set_tfds_data_dir_override(None)  # the flag sets it for the process
    assert "trained steps 0 -> 2" in capsys.readouterr().out
    assert os.listdir(clean_dir) == []
