"""The processes of a multi-host run agreeing, and finding out when one of them is lost.

A multi-host run's processes agree on a few things outside the training step (whether to stop
and save after a SIGTERM, whether process 0 took the model directory's lock, that a damaged
checkpoint was set aside). Device collectives (`process_allgather`, `sync_global_devices`)
cannot time out: a lost peer leaves the others waiting for ever, or (on CPUs) failing with a
transport error that names no process. Here the processes agree through JAX's coordination
service instead (the key-value store process 0 serves since `jax.distributed.initialize`):
each writes its value under a key of the agreement and reads the others' with a timeout, and
a timeout names the processes whose keys never came.

A watchdog thread in every process writes a heartbeat key every `BEAT_SECONDS` and reads the
others'. A peer whose heartbeat has not changed for `LOST_SECONDS` (by this process's clock) is
lost: killed, its machine gone, or hung so hard that its own threads stop. The watchdog then
prints which process was lost, runs the cleanups registered with `on_lost` (the lock module
gives back the model directory's lock) and ends this process
with `LOST_EXIT_CODE`, wherever its main thread is (waiting in a collective of the training
step, in a save, in an agreement). So a process outlives a lost peer by at most
`LOST_SECONDS + BEAT_SECONDS` (35 s), well within JAX's own heartbeat timeout (100 s), after
which the coordination service would end it with a fatal error of its own. A process that
completes its command says so first (`finished`), and is not mistaken for a lost one.

Before every process has joined (`jax.distributed.initialize`) there is no service to beat in:
a process lost then leaves the others waiting until JAX's join timeout (300 s by default,
`$T2T_HOST_JOIN_SECONDS`), which ends them with JAX's message.

The loss of process 0 is the exception: it serves the coordination service, and JAX ends every
other process at once when it goes ("Terminating process because the JAX distributed service
detected fatal errors"; the message names the leader task, process 0), before any watchdog
can speak.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

# A peer is lost after LOST_SECONDS without a new heartbeat ($T2T_HOST_LOST_SECONDS, 30 by
# default; tests shorten it); heartbeats go out six times as often, at most every 5 s.
LOST_SECONDS = float(os.environ.get("T2T_HOST_LOST_SECONDS", "30"))
BEAT_SECONDS = min(5.0, LOST_SECONDS / 6)
AGREEMENT_SECONDS = 600.0  # a peer that is alive but slower than this is reported too
LOST_EXIT_CODE = 76  # a peer was lost; the same command on every host resumes the run
_PREFIX = "t2t"


class HostLostError(RuntimeError):
    """A process of this multi-host run did not arrive at an agreement in time."""

    def __init__(self, what: str, missing: list[int], seconds: float):
        self.missing = missing
        names = ", ".join(str(p) for p in missing)
        super().__init__(
            f"Process{'es' if len(missing) > 1 else ''} {names} of this multi-host run did not "
            f"reach {what} within {seconds:.0f} s: lost (killed, preempted, its machine gone) or "
            "hung; see its log. Run the same command again on every host to resume from the "
            "last checkpoint every process saved."
        )


def _client():
    """JAX's coordination-service client, or None in a single-process run. JAX keeps it in a
    private module (`jax._src.distributed`), where Orbax's multi-host utilities find it too."""
    import jax
    from jax._src import distributed

    if jax.process_count() == 1:
        return None
    return distributed.global_state.client


def agree(name: str, value: str, *, seconds: float = AGREEMENT_SECONDS) -> list[str]:
    """Every process's `value` for an agreement, in process order; `[value]` in a
    single-process run. Every process makes the same agreements in the same order (they are
    numbered); `name` says what is agreed, for the message when a process does not come.

    Raises:
      HostLostError: naming the processes whose value did not come within `seconds`.
    """
    import jax

    client = _client()
    if client is None:
        return [value]
    global _AGREEMENTS
    _AGREEMENTS += 1  # every process makes the same agreements in the same order
    me, count = jax.process_index(), jax.process_count()
    prefix = f"{_PREFIX}/agree/{_AGREEMENTS}"
    client.key_value_set(f"{prefix}/{me}", value, allow_overwrite=True)
    values, missing = [], []
    deadline = time.monotonic() + seconds
    for process in range(count):
        key = f"{prefix}/{process}"
        left = max(1, int((deadline - time.monotonic()) * 1000))
        try:
            values.append(client.blocking_key_value_get(key, left))
        except Exception as error:  # noqa: BLE001 (jax.errors.JaxRuntimeError)
            if "DEADLINE_EXCEEDED" not in str(error):
                raise
            missing.append(process)
            values.append(None)
    if missing:
        raise HostLostError(f"the agreement '{name}'", missing, seconds)
    if _AGREEMENTS > 1:  # every process has read the previous one's keys: ours can go
        _delete(client, f"{_PREFIX}/agree/{_AGREEMENTS - 1}/{me}")
    return values


_AGREEMENTS = 0


def _delete(client, key: str) -> None:
    try:
        client.key_value_delete(key)
    except Exception:  # noqa: BLE001 (gone already)
        pass


def agree_from_first(name: str, value: str | None, *, seconds: float = AGREEMENT_SECONDS) -> str:
    """Process 0's `value` (the others pass None) as every process sees it."""
    return agree(name, value if value is not None else "", seconds=seconds)[0]


# -- the watchdog --------------------------------------------------------------------------------


class _Watchdog:
    def __init__(self, beat: float, lost: float, on_lost: Callable[[list[int]], None]):
        self.beat, self.lost, self.on_lost = beat, lost, on_lost
        self._stop = threading.Event()
        self.verdict = threading.Event()
        self.missing: list[int] = []
        self._thread = threading.Thread(target=self._run, name="t2t-host-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import jax

        client, me, count = _client(), jax.process_index(), jax.process_count()
        seen: dict[int, tuple[str | None, float]] = {}
        counter = 0
        while not self._stop.is_set():
            counter += 1
            now = time.monotonic()
            try:
                client.key_value_set(f"{_PREFIX}/beat/{me}", str(counter), allow_overwrite=True)
                lost = []
                for process in range(count):
                    if process == me or _try_get(client, f"{_PREFIX}/finished/{process}"):
                        continue
                    value = _try_get(client, f"{_PREFIX}/beat/{process}")
                    if process not in seen or seen[process][0] != value:
                        seen[process] = (value, now)
                    elif now - seen[process][1] > self.lost:
                        lost.append(process)
            except Exception:  # noqa: BLE001 (the service itself is gone: JAX ends us)
                return
            if lost and not self._stop.is_set():
                self.missing = lost
                self.verdict.set()
                self.on_lost(lost)
                return
            self._stop.wait(self.beat)


def _try_get(client, key: str) -> str | None:
    try:
        return client.key_value_try_get(key)
    except Exception as error:  # noqa: BLE001 (NOT_FOUND)
        if "NOT_FOUND" in str(error):
            return None
        raise


_WATCHDOG: _Watchdog | None = None


def watch(on_lost: Callable[[list[int]], None] | None = None) -> None:
    """Starts this process's watchdog (a multi-host run only; once). `on_lost(processes)`
    defaults to `stop_for_lost`."""
    global _WATCHDOG
    if _WATCHDOG is not None or _client() is None:
        return
    _WATCHDOG = _Watchdog(BEAT_SECONDS, LOST_SECONDS, on_lost or stop_for_lost)
    _WATCHDOG.start()


def finished() -> None:
    """Tells the other processes this one has done its work (its silence from now on is not a
    loss), and stops watching. Called when a command completes; a process that stops early
    (an error, a SIGTERM outside the training loop) does not, and its peers, which would wait
    for it in their next collective, end within the watchdog's bound instead."""
    global _WATCHDOG
    if _WATCHDOG is None:
        return
    import jax

    _WATCHDOG.stop()
    _WATCHDOG = None
    client = _client()
    if client is not None:
        try:
            client.key_value_set(f"{_PREFIX}/finished/{jax.process_index()}", "1", True)
        except Exception:  # noqa: BLE001 (the service is gone already)
            pass


# What the runtime says when a collective's or the coordination service's peer is gone.
_TRANSPORT_ERRORS = (
    "Gloo",
    "UNAVAILABLE",
    "DEADLINE_EXCEEDED",
    "Connection reset",
    "Connection closed",
    "Socket closed",
)


def looks_like_a_lost_peer(error: BaseException) -> bool:
    """Whether `error` may come from a lost peer (a transport failure inside the runtime)."""
    return any(marker in str(error) for marker in _TRANSPORT_ERRORS)


def wait_for_lost(seconds: float = LOST_SECONDS + 2 * BEAT_SECONDS) -> list[int]:
    """After an error in a multi-host run: waits up to `seconds` for the watchdog to find a lost
    peer (it then ends the process itself); returns the lost processes, or [] when none was
    found (the error was something else) or nothing is watched."""
    if _WATCHDOG is None:
        return []
    _WATCHDOG.verdict.wait(seconds)
    return list(_WATCHDOG.missing)


def exit_lost(message: str) -> None:
    """Prints `message`, runs the `on_lost` cleanups and ends the process with
    `LOST_EXIT_CODE`, skipping JAX's shutdown barrier (which would wait for the lost peer)."""
    print(message, file=sys.stderr, flush=True)
    for cleanup in _CLEANUPS:
        try:
            cleanup()
        except Exception:  # noqa: BLE001 (exiting anyway)
            pass
    sys.stdout.flush()
    os._exit(LOST_EXIT_CODE)


def stop_for_lost(missing: list[int]) -> None:
    """What a process does when a peer is lost: says which, gives back the model directory's
    lock (process 0 holds it), and exits with `LOST_EXIT_CODE` at once (skipping JAX's
    shutdown barrier, which would wait for the lost peer)."""
    import jax

    names = ", ".join(str(p) for p in missing)
    exit_lost(
        f"\nt2t: process {jax.process_index()} stops: process{'es' if len(missing) > 1 else ''} "
        f"{names} of this multi-host run sent no heartbeat for {LOST_SECONDS:.0f} s (lost: "
        "killed, preempted, its machine gone, or hung). Nothing after the last checkpoint "
        "every process saved is kept; run the same command again on every host to resume "
        "from it."
    )


_CLEANUPS: list[Callable[[], None]] = []


def on_lost(cleanup: Callable[[], None]) -> None:
    """Registers `cleanup` to run before a process exits for a lost peer (the lock module gives
    back the model directory's lock this way)."""
    if cleanup not in _CLEANUPS:
        _CLEANUPS.append(cleanup)
