"""`t2t.stopwatch`: a process stopped with SIGSTOP has that time counted as stopped, a busy one
(a late wake-up with the CPU time to show for it) none."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from t2t.stopwatch import stopped_seconds

CHILD = """
import json, sys
from t2t.stopwatch import Stopwatch
with Stopwatch(tick=0.1, threshold=0.5) as watch:
    print("ready", flush=True)
    sys.stdin.readline()
print(json.dumps({"elapsed": watch.elapsed(), "stopped": watch.stopped()}), flush=True)
"""


@pytest.mark.parametrize(
    "gap, cpu, expected",
    [
        (0.6, 0.0, 0.0),  # on time (tick 0.5): nothing stopped
        (2.4, 0.0, 0.0),  # late, but within the threshold (2 s)
        (100.5, 0.3, 99.7),  # stopped: the interval less its tick and the CPU it did use
        (30.0, 31.0, 0.0),  # late because busy (a call holding the GIL, XLA on two cores)
        (10.5, 4.0, 6.0),  # busy for 4 s of it, stopped for the rest
    ],
)
def test_stopped_seconds(gap, cpu, expected):
    assert stopped_seconds(gap, cpu, tick=0.5, threshold=2.0) == pytest.approx(expected)


def test_a_stopped_process_counts_the_stop():
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2.0)  # the stop being measured, not a wait for the child
        os.kill(child.pid, signal.SIGCONT)
        child.stdin.write("\n")
        child.stdin.flush()
        result = json.loads(child.stdout.readline())
    finally:
        child.kill()
        child.wait()
    assert result["elapsed"] >= 2.0
    # 2 s stopped, less up to one tick (0.1 s) the watcher slept before the stop.
    assert 1.85 <= result["stopped"] <= 2.05
    assert result["elapsed"] - result["stopped"] < 1.0  # the rest: the child waiting on stdin
