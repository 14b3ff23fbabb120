"""Wall time that leaves out the time the process was stopped.

A run's wall time is what a study plans from (`t2t.studies.plan`), but while a process is
stopped by SIGSTOP (a shell's Ctrl-Z, a scheduler's or an operator's pause, a debugger) the
monotonic clock keeps running: a stage paused for 16 minutes reads as 1,385 s instead of 400 s
and every estimate made from it is 3x off. Suspending the machine is no problem (Linux's
monotonic clock stops then); a stopped process is.

`Stopwatch` watches from a thread that wakes every `tick` seconds (1): a wake-up more than
`threshold` seconds (30) late in which the process used less CPU time than the wall time that
passed was spent stopped, less the CPU time the process did use (it ran some of that interval
before the stop and after the resume). A late wake-up of a busy process (a C call holding the
GIL, XLA on every core) has CPU time at least its length and counts nothing. Whatever else
keeps the watcher from waking while the process uses no CPU (a core held by others, a read or a
lock waited on while holding the GIL) would count too, which is why the threshold is long: such
waits last seconds, the pauses this is for last minutes (a study stopped while the test suite
runs), and a stop shorter than the threshold is not counted.
"""

from __future__ import annotations

import threading
import time


def stopped_seconds(gap: float, cpu: float, tick: float, threshold: float) -> float:
    """Seconds of one watch interval spent stopped: `gap` wall seconds between two wake-ups of a
    watcher that sleeps `tick`, in which the process used `cpu` seconds of CPU (all threads)."""
    if gap <= tick + threshold:
        return 0.0
    return max(0.0, gap - tick - cpu)


class Stopwatch:
    """`elapsed()`: wall seconds since start; `stopped()`: the part of them the process was
    stopped. Use as a context manager (the watching thread runs inside the block) or call
    `start` and `stop`."""

    def __init__(self, tick: float = 1.0, threshold: float = 30.0):
        self.tick, self.threshold = tick, threshold
        self._stopped = 0.0
        self._started = self._ended = None
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="t2t-stopwatch", daemon=True)
        self._lock = threading.Lock()

    def start(self) -> Stopwatch:
        self._started = time.monotonic()
        self._thread.start()
        return self

    def stop(self) -> None:
        self._halt.set()
        self._thread.join()
        self._ended = time.monotonic()

    def __enter__(self) -> Stopwatch:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def elapsed(self) -> float:
        """Wall seconds from start to stop (or to now while running)."""
        return (self._ended or time.monotonic()) - self._started

    def stopped(self) -> float:
        """Of `elapsed()`, the seconds the process was stopped (as the module docstring says)."""
        with self._lock:
            return self._stopped

    def _watch(self) -> None:
        wall, cpu = time.monotonic(), time.process_time()
        while True:
            halted = self._halt.wait(self.tick)  # the last interval counts too
            now, now_cpu = time.monotonic(), time.process_time()
            seconds = stopped_seconds(now - wall, now_cpu - cpu, self.tick, self.threshold)
            with self._lock:
                self._stopped += seconds
            if halted:
                return
            wall, cpu = now, now_cpu
