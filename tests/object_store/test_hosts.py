"""Two `jax.distributed` processes (one CPU device each) training one model directory in the
bucket, as the hosts of a pod slice share one: the straight run's losses equal one process's
reading both shards; a SIGTERM to one host only stops both at the same step with its checkpoint
saved (exit 75); a host SIGKILLed mid-run ends its peer within the watchdog's bound with a
message naming it (exit 76); the rerun on both hosts ends as the straight run, exactly."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from t2t import files, hosts
from t2t.checkpoints import model_dir as model_dir_lib
from t2t.trainer import loop, reporting

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LOST_SECONDS = 12  # the watchdog's bound in these runs ($T2T_HOST_LOST_SECONDS; 30 by default)
HOST = textwrap.dedent("""
    import dataclasses, os, signal, sys
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={sys.argv[1]}"
    os.environ["JAX_PLATFORMS"] = "cpu"
    import numpy as np
    from t2t import cli
    from t2t.data import pipeline

    OneHost = pipeline.InputPipeline

    class TwoHostShards:
        '''One process reading what two hosts read: shard 0's rows, then shard 1's.'''

        def __init__(self, config):
            self.parts = [OneHost(dataclasses.replace(
                config, shard_index=i, num_shards=2)) for i in range(2)]

        def __iter__(self):
            return self

        def __next__(self):
            batches = [next(part) for part in self.parts]
            return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}

    mode, stop_at = sys.argv[2], int(sys.argv[3])
    if mode == "emulate":
        pipeline.InputPipeline = TwoHostShards
    if stop_at:  # this host gets SIGKILL or SIGTERM while it reads batch `stop_at`
        number = signal.SIGKILL if mode == "kill" else signal.SIGTERM
        calls, original = {"n": 0}, pipeline.InputPipeline.__next__

        def next_then_stop(self):
            calls["n"] += 1
            if calls["n"] == stop_at:
                os.kill(os.getpid(), number)
            return original(self)

        pipeline.InputPipeline.__next__ = next_then_stop
    sys.argv = ["t2t", *sys.argv[4:]]
    cli.console()
""")


def _losses(model_dir):
    return dict(reporting.read_scalars(files.join(os.fspath(model_dir), "train"))["loss"])


def _params(model_dir):
    import jax

    loaded = model_dir_lib.ModelDir(os.fspath(model_dir)).load()
    return [np.asarray(x) for x in jax.tree.leaves(loaded.params)]


@pytest.fixture(scope="module")
def two_hosts(gcs, tmp_path_factory, train_argv):
    """`run(model_dir, stops={process: (mode, batch)})`: both hosts of a run, each from its
    own empty directory; returns [(exit code, output)] by process."""

    def run(model_dir, steps, stops=None):
        with socket.socket() as s:
            s.bind(("localhost", 0))
            port = s.getsockname()[1]
        base = {**os.environ, **gcs.env, "PYTHONPATH": REPO}
        base["T2T_HOST_LOST_SECONDS"] = str(LOST_SECONDS)
        for name in ("XLA_FLAGS", "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID"):
            base.pop(name, None)
        argv = train_argv(model_dir, steps, "--gin.EVAL_TASKS=[]")
        processes = []
        for index in range(2):
            mode, batch = (stops or {}).get(index, ("shard", 0))
            processes.append(
                subprocess.Popen(
                    [sys.executable, "-c", HOST, "1", mode, str(batch), *argv],
                    cwd=tmp_path_factory.mktemp(f"host{index}"),
                    env={
                        **base,
                        "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
                        "JAX_NUM_PROCESSES": "2",
                        "JAX_PROCESS_ID": str(index),
                    },
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        results = []
        try:
            for process in processes:
                results.append((process.wait(timeout=600), process.stdout.read()))
        finally:
            for process in processes:
                process.kill()
                process.stdout.close()
        return results

    return run


@pytest.fixture(scope="module")
def straight(two_hosts, gcs, tmp_path_factory, train_argv):
    """6 steps on two hosts in the bucket, uninterrupted; and one process on two devices
    reading both hosts' shards (local)."""
    run = "gs://t2t-tests/two_hosts/straight"
    results = two_hosts(run, 6)
    assert [code for code, _ in results] == [0, 0], "\n".join(o[-3000:] for _, o in results)
    one = tmp_path_factory.mktemp("one") / "run"
    emulated = subprocess.run(
        [
            sys.executable,
            "-c",
            HOST,
            "2",
            "emulate",
            "0",
            *train_argv(one, 6, "--gin.EVAL_TASKS=[]"),
        ],
        env={**os.environ, "PYTHONPATH": REPO},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert emulated.returncode == 0, emulated.stderr[-3000:]
    return run, one, results


def test_two_hosts_write_one_directory_in_the_bucket_with_the_losses_of_one_process(
    straight, listing
):
    run, one, results = straight
    got, expected = _losses(run), _losses(one)
    assert sorted(got) == sorted(expected) == list(range(1, 7))
    np.testing.assert_allclose([got[s] for s in got], [expected[s] for s in got], rtol=1e-5)
    held = listing(run)
    assert loop.LOSS_CURVE_FILE in held and "train.lock" not in held
    assert len([n for n in held if n.startswith("train/events")]) == 1  # process 0 writes it
    assert {"checkpoints/6/data_iterator/process_0.sha256.json"} <= set(held)
    assert {"checkpoints/6/data_iterator/process_1.sha256.json"} <= set(held)
    assert "trained steps 0 -> 6" in results[0][1]


def test_a_sigterm_to_one_host_then_a_killed_host_and_the_rerun_ends_as_the_straight_run(
    two_hosts, straight
):
    run = "gs://t2t-tests/two_hosts/stopped"
    # A SIGTERM to host 1 only, while it reads batch 2: both hosts stop at step 2, saved.
    results = two_hosts(run, 6, stops={1: ("term", 2)})
    assert [code for code, _ in results] == [loop.PREEMPTED_EXIT_CODE] * 2, "\n".join(
        o[-3000:] for _, o in results
    )
    for _, said in results:
        assert "stopped by SIGTERM at step 2" in said
    assert model_dir_lib.ModelDir(run).steps() == [2]

    # Host 1 SIGKILLed while it reads its second batch (step 4): host 0 ends within the
    # watchdog's bound, naming it, and gives the lock back.
    results = two_hosts(run, 6, stops={1: ("kill", 2)})
    (survivor, said), (killed, _) = results
    assert killed == -9
    assert survivor == hosts.LOST_EXIT_CODE, said[-3000:]
    assert "process 1 of this multi-host run sent no heartbeat" in said
    assert "Traceback" not in said and "internal error" not in said
    kept = model_dir_lib.ModelDir(run).steps()  # step 3's save may have been under way
    assert kept in ([2], [2, 3])
    assert not files.exists(f"{run}/train.lock")

    rerun = two_hosts(run, 6)
    assert [code for code, _ in rerun] == [0, 0], "\n".join(o[-3000:] for _, o in rerun)
    assert f"trained steps {kept[-1]} -> 6" in rerun[0][1]
    assert _losses(run) == _losses(straight[0])
    for x, y in zip(_params(run), _params(straight[0]), strict=True):
        np.testing.assert_array_equal(x, y)
