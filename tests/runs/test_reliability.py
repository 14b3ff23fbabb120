"""Reliability of `t2t` runs end to end: damaged checkpoints, preemption, one writer, and bad
input answered with a message and exit 2 (never a traceback).

The runs are the suite's shrunk run (tests/micro_run.py): real data, gin, checkpoints. Its
straight 9-step run is the reference every interrupted or damaged run must end identical to.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from t2t import cli
from t2t.checkpoints import lock
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.trainer import loop, reporting

from .. import micro_run

DEMO = "gin/experiments/tiny_builtin_demo.gin"


def _argv(model_dir, steps, *extra):
    return micro_run.argv(model_dir, steps, *extra)


def _losses(model_dir):
    return dict(reporting.read_scalars(os.path.join(model_dir, "train"))["loss"])


def _params(model_dir, step=None):
    import jax

    loaded = model_dir_lib.ModelDir(model_dir).load(step)
    return [np.asarray(x) for x in jax.tree.leaves(loaded.params)]


def _assert_same_run(got_dir, expected_dir):
    got, expected = _losses(got_dir), _losses(expected_dir)
    assert sorted(got) == sorted(expected) == list(range(1, 10))
    assert [got[s] for s in range(1, 10)] == [expected[s] for s in range(1, 10)]
    for x, y in zip(_params(got_dir), _params(expected_dir), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, straight_micro_run):
    """`straight`: 9 steps uninterrupted (the session's); `six`: the same run as if stopped
    after step 6 (its checkpoints 3 and 6; the logged steps 7-9 are superseded when it
    resumes)."""
    root = tmp_path_factory.mktemp("reliability")
    shutil.copytree(straight_micro_run, root / "straight")
    shutil.copytree(root / "straight", root / "six")
    shutil.rmtree(root / "six" / "checkpoints" / "9")
    assert model_dir_lib.ModelDir(root / "six").steps() == [3, 6]
    return root


def _flip_a_bit(step_dir):
    files = [
        os.path.join(r, n)
        for r, _, names in os.walk(step_dir / "params")
        if os.path.basename(r) == "d"
        for n in names
    ]
    path = max(files, key=os.path.getsize)
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x40
    open(path, "wb").write(data)


def test_a_flipped_bit_is_found_and_skipped_by_check_infer_and_resume(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    _flip_a_bit(run / "checkpoints" / "6")
    capsys.readouterr()

    assert cli.main(["check", str(run)]) == 1
    out = capsys.readouterr().out
    assert "step 3: ok" in out and "step 6: damaged" in out
    assert "params: 1 array differs from its checksums" in out

    examples = tmp_path / "in.jsonl"
    examples.write_text('{"inputs": "def main():"}\n{"inputs": "import os"}\n')
    infer = ["infer", f"--model_dir={run}", f"--input_file={examples}"]
    assert cli.main([*infer, f"--output_file={tmp_path / 'latest.jsonl'}"]) == 0
    err = capsys.readouterr().err
    assert "step 6" in err and "damaged (params)" in err and "Using step 3" in err
    assert cli.main([*infer, "--step=3", f"--output_file={tmp_path / 'three.jsonl'}"]) == 0
    assert (tmp_path / "latest.jsonl").read_text() == (tmp_path / "three.jsonl").read_text()
    assert cli.main([*infer, "--step=6", f"--output_file={tmp_path / 'six.jsonl'}"]) == 2
    err = capsys.readouterr().err
    assert "t2t infer: error: The checkpoint of step 6" in err and "Traceback" not in err

    assert (
        cli.main(
            [
                "eval",
                f"--model_dir={run}",
                "--tasks=builtin_package",
                "--num_examples=4",
                "--batch_size=4",
                f"--output_file={tmp_path / 'eval.json'}",
            ]
        )
        == 0
    )
    assert "Using step 3" in capsys.readouterr().err
    assert list(json.loads((tmp_path / "eval.json").read_text())["steps"]) == ["3"]

    assert cli.main(_argv(run, 9)) == 0  # resumes from step 3, the newest intact checkpoint
    err = capsys.readouterr().err
    assert "Moved it to" in err and "Resuming from step 3" in err
    assert os.path.isdir(run / "damaged_checkpoints" / "6")
    _assert_same_run(run, runs / "straight")


def test_a_directory_whose_checkpoints_are_all_damaged_never_starts_over_silently(
    runs, tmp_path, capsys
):
    """Issue 33: the first run set every damaged checkpoint aside and exited 2, and a retry (a
    wrapper, a preempted job's restart) then trained from step 0 without a word. Now every
    retry is refused the same way until --start_over asks for step 0, which then trains the
    straight run's steps exactly."""
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    for step in (3, 6):
        _flip_a_bit(run / "checkpoints" / str(step))
    capsys.readouterr()
    for attempt in range(2):  # the first run, then a retry of the same command
        assert cli.main(_argv(run, 9)) == 2
        err = capsys.readouterr().err
        assert "--start_over" in err and "Traceback" not in err, err
        assert "step 0" in err
        assert model_dir_lib.ModelDir(run).steps() == []  # nothing trained, nothing saved
    assert sorted(os.listdir(run / "damaged_checkpoints")) == ["3", "6"]
    assert cli.main([*_argv(run, 9), "--start_over"]) == 0
    assert model_dir_lib.ModelDir(run).steps()[-1] == 9
    for x, y in zip(_params(run), _params(runs / "straight"), strict=True):
        np.testing.assert_array_equal(x, y)


def test_no_command_writes_over_one_of_its_inputs(runs, tmp_path, capsys):
    """Issue 33: `infer --output_file` equal to `--input_file` replaced the examples with the
    predictions and exited 0. Every command that writes now refuses an output that is one of its
    inputs, contains one, or lies in a model directory's checkpoints or run files (exit 2, the
    input untouched)."""
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    examples = tmp_path / "in.jsonl"
    examples.write_text('{"inputs": "def main():"}\n')
    config_gin = (run / "config.gin").read_text()
    tfds = tmp_path / "data" / "tfds"
    tfds.mkdir(parents=True)
    refused = {
        "infer over its input file": [
            "infer",
            f"--model_dir={run}",
            f"--input_file={examples}",
            f"--output_file={examples}",
        ],
        "eval over the run's config.gin": [
            "eval",
            f"--model_dir={run}",
            "--tasks=builtin_package",
            f"--output_file={run / 'config.gin'}",
        ],
        "average into a directory holding the run": [
            "average",
            f"--model_dir={run}",
            f"--output_dir={tmp_path}",
        ],
        "average into the run's checkpoints": [
            "average",
            f"--model_dir={run}",
            f"--output_dir={run / 'checkpoints' / 'avg'}",
        ],
        "export into a directory holding the run": [
            "export",
            f"--model_dir={run}",
            f"--output_dir={tmp_path}",
        ],
        "cache over its TFDS data": [
            "cache",
            "--task=glue_cola",
            f"--tfds_data_dir={tfds}",
            f"--output_cache_dir={tmp_path / 'data'}",
        ],
    }
    capsys.readouterr()
    for case, argv in refused.items():
        assert cli.main(argv) == 2, case
        err = capsys.readouterr().err
        assert "destroy what the command reads" in err and "Traceback" not in err, (case, err)
    assert examples.read_text() == '{"inputs": "def main():"}\n'
    assert (run / "config.gin").read_text() == config_gin
    assert model_dir_lib.ModelDir(run).steps() == [3, 6]


def test_eval_all_steps_skips_a_damaged_step_and_average_names_steps(runs, tmp_path, capsys):
    """Issue 33: `eval --all_steps` aborted at a damaged step, and `average` refused one without
    saying how to choose others. Now eval skips it, says so and records it; average names
    --steps and the other saved steps."""
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    _flip_a_bit(run / "checkpoints" / "3")
    capsys.readouterr()
    out = tmp_path / "eval.json"
    argv = [
        "eval",
        f"--model_dir={run}",
        "--tasks=builtin_package",
        "--num_examples=4",
        "--batch_size=4",
        "--all_steps",
        f"--output_file={out}",
    ]
    assert cli.main(argv) == 0
    assert "Skipped step 3: its checkpoint is damaged (params" in capsys.readouterr().err
    results = json.loads(out.read_text())
    assert list(results["steps"]) == ["6"] and list(results["skipped_damaged"]) == ["3"]
    average = ["average", f"--model_dir={run}", f"--output_dir={tmp_path / 'avg'}", "--last=2"]
    assert cli.main(average) == 2
    err = capsys.readouterr().err
    assert "name them with --steps (the other saved steps: [6]" in err and "Traceback" not in err


def test_sigterm_saves_the_current_step_and_the_resumed_run_is_identical(
    runs, tmp_path, capsys, monkeypatch
):
    from t2t.data import pipeline

    run = tmp_path / "run"
    calls = {"n": 0}
    original = pipeline.InputPipeline.__next__

    def next_then_sigterm(self):  # SIGTERM while batch 5 is read, as a scheduler would send it
        calls["n"] += 1
        if calls["n"] == 5:
            os.kill(os.getpid(), signal.SIGTERM)
        return original(self)

    monkeypatch.setattr(pipeline.InputPipeline, "__next__", next_then_sigterm)
    assert cli.main(_argv(run, 9)) == loop.PREEMPTED_EXIT_CODE
    out, err = capsys.readouterr()
    assert "SIGTERM received: saving a checkpoint after this step" in err
    assert f"t2t train: stopped by SIGTERM at step 5; its checkpoint is saved in {run}" in err
    assert "step 5: checkpoint saved" in out and "Traceback" not in err
    assert model_dir_lib.ModelDir(run).steps() == [3, 5]
    assert signal.getsignal(signal.SIGTERM) is not None  # handlers are put back
    monkeypatch.undo()
    assert cli.main(_argv(run, 9)) == 0
    _assert_same_run(run, runs / "straight")
    # The fault-injection harness (benchmarks/fault_injection.py) judges runs the same way.
    harness = _harness()
    verdict = harness.same(harness.outcome(str(run)), harness.outcome(str(runs / "straight")))
    assert verdict["exact"], verdict
    shutil.rmtree(run / "checkpoints" / "9")
    assert not harness.same(harness.outcome(str(run)), harness.outcome(str(runs / "straight")))[
        "exact"
    ]
    assert harness.check(str(run)) == {5: "ok", 6: "ok"}  # the last three were kept


def test_a_second_ctrl_c_stops_at_once(tmp_path, capsys, monkeypatch):
    from t2t.data import pipeline

    calls = {"n": 0}
    original = pipeline.InputPipeline.__next__

    def next_then_two_sigints(self):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)  # the first asks for a save at the step's end
            os.kill(os.getpid(), signal.SIGINT)  # the second: stop now
        return original(self)

    monkeypatch.setattr(pipeline.InputPipeline, "__next__", next_then_two_sigints)
    assert cli.main(_argv(tmp_path / "run", 9)) == 130
    err = capsys.readouterr().err
    assert "SIGINT received" in err and "t2t train: interrupted; nothing was saved" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err


def test_a_second_ctrl_c_while_the_checkpoint_commits_leaves_it_intact(
    tmp_path, capsys, monkeypatch
):
    from t2t.checkpoints import manager
    from t2t.data import pipeline

    calls = {"batches": 0, "saves": 0, "waits": 0}
    original_next = pipeline.InputPipeline.__next__
    original_save = manager.CheckpointManager.save
    original_wait = manager.CheckpointManager.wait_until_finished

    def next_then_sigint(self):
        calls["batches"] += 1
        if calls["batches"] == 4:
            os.kill(os.getpid(), signal.SIGINT)  # save after this step, then stop
        return original_next(self)

    def second_sigint_inside_the_save(self, *args, **kwargs):
        calls["saves"] += 1
        if calls["saves"] == 2:  # the stop's save (the first is step 3's): its start
            os.kill(os.getpid(), signal.SIGINT)
        return original_save(self, *args, **kwargs)

    def third_sigint_while_waiting(self):
        calls["waits"] += 1
        if calls["waits"] == 1:  # the wait for the stop's checkpoint to commit
            os.kill(os.getpid(), signal.SIGINT)
        return original_wait(self)

    monkeypatch.setattr(pipeline.InputPipeline, "__next__", next_then_sigint)
    monkeypatch.setattr(manager.CheckpointManager, "save", second_sigint_inside_the_save)
    run = tmp_path / "run"
    assert cli.main(_argv(run, 9)) == 130
    err = capsys.readouterr().err
    assert "t2t train: interrupted; nothing was saved" in err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    # Issue 51: the save under way was abandoned (a 4.orbax-checkpoint-tmp left behind). Now it
    # is finished, then the run stops.
    assert model_dir_lib.ModelDir(run).steps() == [3, 4]
    assert not [n for n in os.listdir(run / "checkpoints") if "tmp" in n]
    statuses = {s: status for s, (status, _) in model_dir_lib.ModelDir(run).check().items()}
    assert set(statuses.values()) == {"ok"}

    # A second Ctrl-C in the wait for the commit: the wait is cut, the commit still awaited.
    monkeypatch.setattr(manager.CheckpointManager, "save", original_save)
    monkeypatch.setattr(
        manager.CheckpointManager, "wait_until_finished", third_sigint_while_waiting
    )
    calls["batches"] = 0
    again = tmp_path / "again"
    assert cli.main(_argv(again, 9)) == 130
    assert model_dir_lib.ModelDir(again).steps() == [3, 4]
    assert not [n for n in os.listdir(again / "checkpoints") if "tmp" in n]


def _harness():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "fault_injection", os.path.join("benchmarks", "fault_injection.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    argv = module.command("/tmp/x", 9, 3)
    assert argv[1:4] == ["-m", "t2t.cli", "train"]
    assert cli.build_parser().parse_args(cli.split_gin_bindings(argv[3:])[0]).command == "train"
    return module


HOLDER = textwrap.dedent("""
    import sys
    from t2t.checkpoints import lock
    held = lock.RunLock(sys.argv[1])
    held.acquire()  # what `t2t train` takes first
    print("held", flush=True)
    sys.stdin.read()
""")


def test_a_second_train_on_a_busy_directory_stops_at_once_naming_the_first(tmp_path, capsys):
    run = tmp_path / "run"
    first = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(run)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        assert first.stdout.readline().strip() == "held"
        assert cli.main(_argv(run, 3)) == 2
        err = capsys.readouterr().err
        assert f"Another run is training in {run}: process {first.pid} on host" in err
        assert "give this run a new MODEL_DIR" in err
        assert not (run / "checkpoints").exists()  # stopped before building anything
    finally:
        first.kill()
        first.wait()
    assert json.loads((run / lock.LOCK_FILE).read_text())["pid"] == first.pid  # left behind
    assert cli.main(_argv(run, 3)) == 0  # its holder is gone: the stale lock is taken over
    assert "Taking over the stale lock" in capsys.readouterr().err
    assert not (run / lock.LOCK_FILE).exists()


# -- bad input: exit 2 and a message -----------------------------------------------------------


def _fails(argv, capsys, *expected):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "In call to configurable" not in err, err
    for text in expected:
        assert text in err, err
    return err


def test_resuming_with_another_network_or_batch_is_refused(runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    _fails(
        _argv(run, 9, "--gin.t2t.nn.get_preset.d_model=64"),
        capsys,
        "belongs to another network",
        "decoder/decoder_norm/scale: (32,) in the checkpoint, (64,) here",
        "INIT_CHECKPOINT",
    )
    _fails(
        _argv(run, 9, "--gin.BATCH_SIZE=16"),
        capsys,
        "were trained with batch_size 8; this run has 16",
        "resume with BATCH_SIZE=8",
    )
    assert model_dir_lib.ModelDir(run).steps() == [3, 6]  # nothing was written


def test_an_embedding_smaller_than_the_vocabulary_is_refused_before_any_step(tmp_path, capsys):
    # Without the check, ids past the embedding's last row read NaN and the run stopped at its
    # first step blaming the learning rate.
    run = tmp_path / "run"
    _fails(
        _argv(run, 3, "--gin.t2t.nn.get_preset.vocab_size=1024"),
        capsys,
        "Task builtin_span_corruption's 'inputs' vocabulary has 2048 ids but the model's "
        "embedding only 1024 rows",
        "t2t.nn.get_preset.vocab_size",
    )
    assert os.listdir(run) == []  # nothing was written (the lock made the directory)
    # A network taken from a checkpoint is fixed: the fix is the checkpoint's vocabulary.
    from types import SimpleNamespace

    from t2t.errors import UserError
    from t2t.runs import train_run
    from t2t.trainer.options import DataOptions, EvalOptions

    data = DataOptions(
        mixture_or_task="builtin_span_corruption", task_feature_lengths={"targets": 8}
    )
    evaluation = EvalOptions(tasks=["builtin_span_corruption"])
    checkpoint = "gs://bucket/small_run"
    with pytest.raises(UserError, match="comes from gs://bucket/small_run: train on tasks"):
        train_run._check_vocabularies(SimpleNamespace(vocab_size=512), data, evaluation, checkpoint)
    train_run._check_vocabularies(SimpleNamespace(vocab_size=2048), data, evaluation, checkpoint)


def test_counts_gin_syntax_and_unwritable_directories_are_messages(tmp_path, capsys):
    run = tmp_path / "run"
    for value in ("0", "-3"):
        _fails(
            _argv(run, value),
            capsys,
            "t2t.runs.train.train_steps (the gin macro "
            f"TRAIN_STEPS) must be a positive int; got {value}",
        )
    _fails(_argv(run, "'forty'"), capsys, "must be a positive int; got 'forty' (str)")
    _fails(
        _argv(run, 9, "--gin.t2t.runs.LoopOptions.log_every=0"),
        capsys,
        "t2t.runs.LoopOptions.log_every must be a positive int; got 0",
    )
    _fails(  # a negative rate climbs the loss with nothing saying why
        _argv(run, 9, "--gin.t2t.runs.train.learning_rate=-1e-3"),
        capsys,
        "t2t.runs.train.learning_rate must be a positive number or a schedule; got -0.001",
    )
    _fails(
        _argv(run, 9, "--gin.t2t.optim.inverse_sqrt.scale=-1.0"),
        capsys,
        "is a schedule whose rate at step 0 is -0.0316",
        "must be finite and non-negative",
    )
    unbalanced = tmp_path / "unbalanced.gin"
    unbalanced.write_text(
        f"include '{DEMO.removeprefix('gin/')}'\nt2t.runs.LoopOptions.log_every = (10\n"
    )
    _fails(
        ["train", f"--gin_file={unbalanced}"],
        capsys,
        f"gin could not parse {unbalanced}",
        "never closed",
    )
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    _fails(_argv(a_file / "run", 3), capsys, f"Cannot create the model directory {a_file / 'run'}")
    assert not run.exists()


def test_export_refuses_non_empty_and_model_directories_and_writes_uniform_modes(
    runs, tmp_path, capsys
):
    source = runs / "straight"
    release = tmp_path / "release"
    release.mkdir()
    (release / "notes.txt").write_text("mine")
    export = ["export", f"--model_dir={source}"]
    _fails([*export, f"--output_dir={release}"], capsys, "is not empty", "--overwrite")
    _fails([*export, f"--output_dir={source / 'release'}"], capsys, "is inside the model directory")
    assert not (source / "release").exists()
    assert cli.main([*export, f"--output_dir={release}", "--overwrite"]) == 0
    assert (release / "notes.txt").read_text() == "mine"
    modes = {
        name: os.stat(release / name).st_mode & 0o777
        for name in os.listdir(release)
        if name != "notes.txt"
    }
    assert len(set(modes.values())) == 1, modes
    assert {"model.safetensors", "spiece.model", "config.json"} <= set(modes)


def test_inputs_that_are_not_text_and_overlong_inputs(runs, tmp_path, capsys):
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b'{"inputs": "ok"}\n\xff\xfe\x8f not text\n')
    _fails(
        [
            "infer",
            f"--model_dir={runs / 'straight'}",
            f"--input_file={binary}",
            f"--output_file={tmp_path / 'out.jsonl'}",
        ],
        capsys,
        f"{binary}:2 is not UTF-8 text",
    )
    _fails(
        ["vocab", f"--output={tmp_path / 'v.model'}", f"--source={binary}", "--num_pieces=50"],
        capsys,
        f"{binary} is not UTF-8 text",
    )
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text("{not json")
    (hf / "model.safetensors").write_bytes(b"")
    _fails(
        _argv(tmp_path / "from_hf", 3, f"--gin.t2t.runs.train.init_checkpoint='{hf}'"),
        capsys,
        f"{hf / 'config.json'} is not valid JSON",
    )
    # 100k characters of input: cut to the length the model trained with, and said so.
    long = tmp_path / "long.jsonl"
    long.write_text(
        json.dumps({"inputs": "import os " * 10_000})
        + "\n"
        + json.dumps({"inputs": "import os"})
        + "\n"
    )
    assert (
        cli.main(
            [
                "infer",
                f"--model_dir={runs / 'straight'}",
                f"--input_file={long}",
                f"--output_file={tmp_path / 'long_out.jsonl'}",
            ]
        )
        == 0
    )
    assert (
        "1 of 2 examples' texts were longer than the feature lengths (inputs 64 tokens"
        in capsys.readouterr().err
    )
    assert len((tmp_path / "long_out.jsonl").read_text().splitlines()) == 2


def test_another_input_pipeline_is_refused_without_calling_the_checkpoint_damaged(
    runs, tmp_path, capsys
):
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    # Unpacked batches are another tf.data graph: the saved position cannot be restored into it.
    assert cli.main(_argv(run, 9, "--gin.t2t.runs.DataOptions.pack=False")) == 2
    err = capsys.readouterr().err
    assert "The checkpoint of step 6" in err and "is intact" in err and "Nothing was moved" in err
    assert not (run / "damaged_checkpoints").exists()
    assert cli.main(_argv(run, 7)) == 0  # the run's own pipeline resumes from it
    assert "trained steps 6 -> 7" in capsys.readouterr().out


def test_the_command_line_asks_jax_for_threefry_as_one_gpu_kernel(tmp_path, monkeypatch, capsys):
    # Set before JAX starts in a t2t process (a GPU's parameter init compiles ~90 s faster);
    # a value the user chose stays.
    monkeypatch.delenv("JAX_THREEFRY_GPU_KERNEL_LOWERING", raising=False)
    assert cli.main(["check", str(tmp_path / "missing")]) == 2
    assert os.environ["JAX_THREEFRY_GPU_KERNEL_LOWERING"] == "1"
    monkeypatch.setenv("JAX_THREEFRY_GPU_KERNEL_LOWERING", "0")
    cli.main(["check", str(tmp_path / "missing")])
    assert os.environ["JAX_THREEFRY_GPU_KERNEL_LOWERING"] == "0"


LIMITED = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
    limit = int(sys.argv[1])
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    from t2t import cli
    sys.exit(cli.main(sys.argv[2:]))
""")


def test_a_save_without_room_is_a_message_and_the_run_resumes_once_there_is_room(runs, tmp_path):
    """Issue 51: a save past the file-size limit (`ulimit -f`) printed about 200 lines of
    traceback calling itself a bug in t2t. Now: which save, why, what is kept, exit 2; a full
    disk (ENOSPC) and a quota are said the same way."""
    run = tmp_path / "run"
    shutil.copytree(runs / "six", run)
    limited = subprocess.run(  # checkpoint files of this network exceed 300 kB, the rest not
        [sys.executable, "-c", LIMITED, "300000", *_argv(run, 9)],
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert limited.returncode == 2, limited.stderr[-3000:]
    assert (
        f"Saving the checkpoint of step 9 in {run}/checkpoints failed: a file grew past this "
        "process's file-size limit (ulimit -f)"
    ) in limited.stderr
    assert "the checkpoints saved before it are intact (steps [3, 6])" in limited.stderr
    assert "Traceback" not in limited.stderr and "bug in t2t" not in limited.stderr
    assert model_dir_lib.ModelDir(run).steps() == [3, 6]
    assert cli.main(_argv(run, 9)) == 0  # room again: resumes from 6, as if nothing happened
    _assert_same_run(run, runs / "straight")


def test_a_full_disk_and_a_quota_are_told_apart_from_other_errors():
    from t2t import files

    assert files.out_of_room(OSError(28, "No space left on device")) == "the disk is full"
    assert files.out_of_room(OSError(122, "Disk quota exceeded")) == "the disk quota is used up"
    wrapped = RuntimeError("tensorstore: Error writing local file: File too large")
    try:
        raise ValueError("the save failed") from wrapped
    except ValueError as error:
        assert "file-size limit" in files.out_of_room(error)
    assert files.out_of_room(OSError(2, "No such file or directory")) is None


def test_a_vocabulary_file_that_is_not_a_sentencepiece_model_is_a_message(runs, tmp_path, capsys):
    """Issue 51: infer with a text file as --vocabulary_file exited 1 with protobuf's traceback
    and 'This is a bug in t2t'."""
    not_a_model = tmp_path / "words.txt"
    not_a_model.write_text("hello\nworld\n")
    examples = tmp_path / "in.jsonl"
    examples.write_text('{"inputs": "def main():"}\n')
    common = [f"--model_dir={runs / 'straight'}", f"--vocabulary_file={not_a_model}"]
    for argv in (
        ["infer", *common, f"--input_file={examples}", f"--output_file={tmp_path / 'o.jsonl'}"],
        ["export", *common, f"--output_dir={tmp_path / 'release'}"],
    ):
        assert cli.main(argv) == 2
        err = capsys.readouterr().err
        assert f"--vocabulary_file {not_a_model} is not a SentencePiece model" in err, err
        assert "Traceback" not in err
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "release").exists()
