"""The file-system layer (`t2t.files`) on a local disk and in the emulator's bucket, the
one-writer lock on gs:// (`ObjectRunLock`), and a bucket that cannot be used: an exit 2 with a
message within seconds, before any storage client starts retrying."""

import json
import os
import subprocess
import sys
import threading

import pytest

from t2t import cli, files
from t2t.checkpoints import lock


@pytest.fixture(params=["local", "gcs"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "root")
    request.getfixturevalue("gcs")
    return request.getfixturevalue("bucket_dir")


def test_the_layer_reads_writes_lists_copies_and_moves_alike_on_both(root):
    assert not files.exists(root) and files.glob(files.join(root, "*")) == []
    files.makedirs(files.join(root, "a", "b"))
    files.write_text(files.join(root, "a", "b", "one.txt"), "one")
    files.write_bytes(files.join(root, "a", "two.bin"), b"\x00\x01")
    files.write_text(files.join(root, "a", "two.bin"), "replaced")  # a whole-file write
    assert files.read_text(files.join(root, "a", "two.bin")) == "replaced"
    assert files.listdir(files.join(root, "a")) == ["b", "two.bin"]
    assert files.isdir(files.join(root, "a", "b")) and not files.isdir(
        files.join(root, "a", "two.bin")
    )
    assert files.files_under(root) == ["a/b/one.txt", "a/two.bin"]
    assert files.glob(files.join(root, "a", "*.bin")) == [files.join(root, "a", "two.bin")]
    assert files.size(files.join(root, "a", "b", "one.txt")) == 3

    files.copytree(files.join(root, "a"), files.join(root, "c"))
    files.move(files.join(root, "c"), files.join(root, "d"))
    assert files.files_under(files.join(root, "d")) == ["b/one.txt", "two.bin"]
    assert not files.exists(files.join(root, "c"))
    with files.atomic_writer(files.join(root, "d", "lines.jsonl")) as f:
        f.write('{"x": 1}\n')
    with files.open_file(files.join(root, "d", "lines.jsonl")) as f:
        assert json.loads(f.readline()) == {"x": 1}
    with pytest.raises(RuntimeError):  # a failed write leaves the old contents
        with files.atomic_writer(files.join(root, "d", "lines.jsonl")) as f:
            f.write("half")
            raise RuntimeError
    assert files.read_text(files.join(root, "d", "lines.jsonl")) == '{"x": 1}\n'

    with files.local_copy(files.join(root, "d")) as local:
        assert open(os.path.join(local, "b", "one.txt")).read() == "one"
    with files.staged_directory(files.join(root, "e")) as local:
        with open(os.path.join(local, "made.txt"), "w") as f:
            f.write("by a library that writes local files")
    assert files.read_text(files.join(root, "e", "made.txt")).startswith("by a library")

    with pytest.raises(FileNotFoundError, match="missing.txt"):
        files.read_text(files.join(root, "missing.txt"))
    files.remove(files.join(root, "missing.txt"))  # nothing to delete: no error
    files.rmtree(root)
    assert not files.exists(root)


def test_paths_keep_their_scheme():
    assert files.normalize("gs://b/x/../y//z/") == "gs://b/y/z"
    assert files.absolute("gs://b/run") == "gs://b/run"
    assert files.parent("gs://b/run/") == "gs://b" and files.basename("gs://b/run/") == "run"
    assert files.join("gs://b", "x", "y") == "gs://b/x/y"
    assert files.absolute("runs/demo") == os.path.join(os.getcwd(), "runs", "demo")
    assert files.split_bucket("gs://b/a/c/") == ("b", "a/c")
    with pytest.raises(files.StorageError, match="gs:// .* only, not s3://"):
        files.split_bucket("s3://b/x")


def test_a_second_lock_is_refused_and_a_stale_one_taken_over_once(gcs, bucket_dir, capsys):
    first = lock.ObjectRunLock(bucket_dir, heartbeat_seconds=0.2, stale_seconds=1.0)
    first.holder["host"] = "host-a"
    first.acquire()
    second = lock.ObjectRunLock(bucket_dir, heartbeat_seconds=0.2, stale_seconds=1.0)
    with pytest.raises(lock.RunLockedError, match="Another run is training in .* on host host-a"):
        second.acquire()
    beat = first._generation
    first._stop.wait(0.6)
    assert first._generation != beat  # the heartbeat rewrote it
    first._stop.set()  # host-a dies: no more heartbeats, no release
    first._thread.join()
    while True:  # the heartbeat goes stale after 1 s; until then the lock is held
        try:
            second.acquire()
            break
        except lock.RunLockedError:
            first._stop.wait(0.1)
    assert "Taking over the stale lock" in capsys.readouterr().err
    assert first._refresh() is False  # host-a, were it alive, finds the lock is not its own
    second.release()
    assert not files.exists(f"{bucket_dir}/{lock.LOCK_FILE}")


def test_of_two_runs_racing_for_a_free_lock_exactly_one_wins(gcs, bucket_dir):
    outcomes = []

    def take(name):
        held = lock.ObjectRunLock(bucket_dir)
        held.holder["host"] = name  # two machines
        try:
            held.acquire()
            outcomes.append(("won", held))
        except lock.RunLockedError:
            outcomes.append(("lost", held))

    racers = [threading.Thread(target=take, args=(f"host-{i}",)) for i in range(4)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join()
    assert sorted(kind for kind, _ in outcomes) == ["lost", "lost", "lost", "won"]
    for kind, held in outcomes:
        if kind == "won":
            held.release()


def test_a_create_whose_answer_was_lost_is_adopted_not_refused(gcs, bucket_dir):
    """The store applies the create, then the connection drops: the client's retry gets 412.
    The record is this lock's own (its token), so the run holds it instead of refusing."""
    gcs.set_faults(1.0, kinds=("reset-after",), operations=("write",), limit=1)
    try:
        held = lock.ObjectRunLock(bucket_dir)
        held.acquire()
    finally:
        gcs.set_faults(0)
    assert sum(gcs.stats()["faults"].values()) == 1
    assert held._held and held._generation is not None
    held.release()
    assert not files.exists(f"{bucket_dir}/{lock.LOCK_FILE}")


def _t2t(argv, env, cwd):
    return subprocess.run(
        [sys.executable, "-m", "t2t.cli", *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,  # a guard: the check must answer in seconds, not minutes of retries
    )


def test_a_bucket_that_cannot_be_used_is_a_message_and_exit_2(gcs, tmp_path, capsys):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    argv = ["check", "gs://t2t-tests/run"]
    bare = {
        k: v
        for k, v in os.environ.items()
        if k not in gcs.env and "GOOGLE" not in k and k != "CLOUDSDK_CONFIG"
    }
    bare.update(PYTHONPATH=repo, HOME=str(tmp_path), GCE_METADATA_HOST="127.0.0.1:9")
    no_credentials = _t2t(argv, bare, tmp_path)
    assert no_credentials.returncode == 2, no_credentials.stderr[-2000:]
    assert "No Google Cloud credentials on this machine" in no_credentials.stderr
    assert "gcloud auth application-default login" in no_credentials.stderr
    assert "Traceback" not in no_credentials.stderr

    unreachable = _t2t(argv, {**bare, "STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"}, tmp_path)
    assert unreachable.returncode == 2
    assert "cannot reach Google Cloud Storage" in unreachable.stderr
    assert "Traceback" not in unreachable.stderr

    assert cli.main(["check", "gs://no-such-bucket/run"]) == 2  # through the emulator
    err = capsys.readouterr().err
    assert "the bucket gs://no-such-bucket does not exist" in err and "Traceback" not in err


def test_a_store_failure_the_clients_gave_up_on_is_a_message_not_a_bug(
    gcs, bucket_dir, tmp_path, train_argv, monkeypatch, capsys
):
    """What TensorFlow raises after its 10 retries (minutes of backoff; not waited for here):
    t2t says the store failed and that nothing reported saved was lost, exit 2."""
    import tensorflow as tf

    from t2t.trainer import loop

    def store_gives_up(trainer, num_steps):
        raise tf.errors.UnavailableError(
            None,
            None,
            "{{function_node __wrapped__SaveV2_dtypes_2_device_/job:localhost}} All 10 retry "
            "attempts failed. The last failure: Error executing an HTTP request: HTTP response "
            f"code 503 when uploading {bucket_dir}/run/checkpoints/3/data_iterator",
        )

    monkeypatch.setattr(loop.Trainer, "train", store_gives_up)
    assert cli.main(train_argv(f"{bucket_dir}/run", 3)) == 2
    err = capsys.readouterr().err
    assert "t2t train: error: the object store failed: All 10 retry attempts failed." in err
    assert "Every checkpoint reported saved is intact" in err
    assert "Traceback" not in err and "bug in t2t" not in err
    assert files.store_failure(ValueError("a shape mismatch")) is None
