"""The user's path through the CLI: bad input gets exit 2 and a message that says how to fix it
(a failing --import, a task with no seqio cache, a TFDS dataset not prepared, a missing
vocabulary), bugs get exit 1 and their stack, --traceback shows the stack of any error, and
`t2t cache --task` builds a seqio cache that training reads back identically."""

import os

import numpy as np
import pytest
import seqio

from t2t import cli, errors, terminal

DEMO = "gin/experiments/tiny_builtin_demo.gin"

TASK_MODULE = """
import seqio
import tensorflow as tf
from t2t.data import vocab

VOCAB = vocab.load_vocabulary({vocab_path!r})
seqio.TaskRegistry.add(
    {name!r},
    source=seqio.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.from_tensors({{"inputs": "a", "targets": "b"}}),
        splits=["train"]),
    preprocessors=[seqio.preprocessors.tokenize],
    output_features={{"inputs": seqio.Feature(VOCAB), "targets": seqio.Feature(VOCAB)}})
"""


def _train(tmp_path, *extra):
    return cli.main(
        [
            "train",
            f"--gin_file={DEMO}",
            f"--gin.MODEL_DIR='{tmp_path / 'run'}'",
            "--gin.TRAIN_STEPS=1",
            *extra,
        ]
    )


def test_import_from_the_working_directory_then_a_missing_vocabulary(tmp_path, monkeypatch, capsys):
    module = f"user_tasks_{os.getpid()}"
    (tmp_path / f"{module}.py").write_text(
        TASK_MODULE.format(vocab_path=str(tmp_path / "missing.model"), name=module)
    )
    monkeypatch.chdir(tmp_path)  # found without PYTHONPATH=., as `python -m` would
    monkeypatch.setattr("sys.path", [p for p in __import__("sys").path if p not in ("", ".")])
    assert (
        _train(
            tmp_path,
            "--import",
            module,
            f"--gin.t2t.runs.DataOptions.mixture_or_task='{module}'",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert (
        f"Task {module}: the 'inputs' vocabulary {tmp_path / 'missing.model'} does not exist" in err
        and "Traceback" not in err
    )


def test_a_failing_import_is_bad_input(tmp_path, capsys):
    assert _train(tmp_path, "--import", "no_such_module_anywhere") == 2
    err = capsys.readouterr().err
    assert "--import no_such_module_anywhere: ModuleNotFoundError" in err
    assert "working directory or $PYTHONPATH" in err and "Traceback" not in err
    assert _train(tmp_path, "--import", "no_such_module_anywhere", "--traceback") == 2
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_use_cached_without_a_cache_says_how_to_build_it(tmp_path, capsys):
    assert _train(tmp_path, "--gin.t2t.runs.DataOptions.use_cached=True") == 2
    err = capsys.readouterr().err
    assert "Task builtin_span_corruption has no seqio cache" in err
    assert "t2t cache --task builtin_span_corruption --output_cache_dir DIR" in err


def test_tfds_dataset_not_prepared_says_how_to_prepare_it(tmp_path, capsys):
    tfds_dir = tmp_path / "tfds"
    source = seqio.TfdsDataSource("glue/cola:2.0.0", splits=("train", "validation"))
    vocab = seqio.PassThroughVocabulary(10)
    name = "user_path_unprepared_tfds"
    if name not in seqio.TaskRegistry.names():
        seqio.TaskRegistry.add(
            name, source=source, preprocessors=[], output_features={"targets": seqio.Feature(vocab)}
        )
    assert (
        _train(
            tmp_path,
            f"--tfds_data_dir={tfds_dir}",
            f"--gin.t2t.runs.DataOptions.mixture_or_task='{name}'",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert f"reads the TFDS dataset glue/cola:2.0.0, which is not prepared in {tfds_dir}" in err
    assert "tfds build glue/cola --data_dir=DIR" in err and "--tfds_data_dir=DIR" in err
    assert not (tfds_dir / "downloads").exists()  # nothing was downloaded


def test_bugs_are_told_apart_from_bad_input(tmp_path, monkeypatch, capsys):
    from t2t import runs

    monkeypatch.chdir(tmp_path)
    os.mkdir("x")  # a model directory, as far as the CLI's own check goes

    def library_error(**kwargs):
        np.zeros(3).reshape(2, 2)  # a ValueError raised inside NumPy: not a message for users

    monkeypatch.setattr(runs, "export", library_error)
    assert cli.main(["export", "--model_dir=x", "--output_dir=y"]) == 1
    err = capsys.readouterr().err
    assert "internal error: ValueError" in err and "This is a bug in t2t" in err
    assert "Traceback (most recent call last)" in err  # the stack, without asking

    def check_error(**kwargs):
        raise errors.UserError("Expected a model directory, got 'x'.")

    monkeypatch.setattr(runs, "export", check_error)
    assert cli.main(["export", "--model_dir=x", "--output_dir=y"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == "t2t export: error: Expected a model directory, got 'x'."
    assert terminal.is_user_error(OSError("disk full"))
    assert not terminal.is_user_error(KeyError("k"))

    # The project's preprocessors check their arguments too (raised inside seqio's pipeline).
    from preprocessors import noise

    with pytest.raises(ValueError, match="needs a targets length of 22222") as raised:
        noise.random_spans_helper(100000, 0.15, 3.0, targets_length=32)
    assert terminal.is_user_error(raised.value)


@pytest.fixture
def seqio_cache_dirs():
    before = seqio.get_global_cache_dirs()
    yield
    seqio.set_global_cache_dirs(before)


def test_cache_a_builtin_task_then_read_it_back(tmp_path, capsys, seqio_cache_dirs):
    import t2t.data.tasks.builtin  # noqa: F401 (registers the built-in tasks)

    cache_dir = tmp_path / "seqio_cache"
    assert (
        cli.main(
            [
                "cache",
                "--task",
                "builtin_package",
                "--output_cache_dir",
                str(cache_dir),
                "--module",
                "t2t.data.tasks.builtin",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert f"builtin_package: {cache_dir / 'builtin_package'}" in out
    for split in ("train", "validation"):
        assert (cache_dir / "builtin_package" / f"info.{split}.json").exists()
    assert (cache_dir / "builtin_package" / "COMPLETED").exists()
    assert (
        cli.main(["cache", "--task", "builtin_package", "--output_cache_dir", str(cache_dir)]) == 0
    )
    assert "already cached" in capsys.readouterr().out

    task = seqio.get_mixture_or_task("builtin_package")
    lengths = {"inputs": 64, "targets": 8}

    def examples(use_cached):
        dataset = task.get_dataset(
            lengths, split="validation", use_cached=use_cached, shuffle=False, num_epochs=1
        )
        return sorted(
            (tuple(e["inputs"]), tuple(e["targets"])) for e in dataset.as_numpy_iterator()
        )

    seqio.add_global_cache_dirs([str(cache_dir)])
    task._cache_dir = None  # seqio memoizes the lookup
    try:
        cached, fresh = examples(True), examples(False)
    finally:
        task._cache_dir = None
    assert cached == fresh and len(cached) > 10


def test_a_missing_model_dir_is_refused_before_tensorflow_or_jax_load(tmp_path):
    """`t2t eval/infer/export/average --model_dir=<missing>` answer from the arguments alone."""
    import subprocess
    import sys

    missing = tmp_path / "no_such_run"
    code = (
        "import sys\nfrom t2t.cli import main\n"
        f"codes = [main([c, '--model_dir={missing}']) for c in ('eval', 'infer', 'export', 'average')]\n"
        "print(codes, [m for m in ('tensorflow', 'jax', 'seqio') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[2, 2, 2, 2] []", done.stdout + done.stderr
    assert f"--model_dir {missing} is not a directory" in done.stderr
