"""One writer per model directory: the lock `t2t train` holds while it trains.

Two runs writing one model directory would overwrite each other's checkpoints (Orbax replaces a
step that exists), and neither would notice. `t2t train` therefore takes `<model_dir>/train.lock`
first, a small JSON file naming its holder (process id, host, start time, command) and carrying
a heartbeat its holder refreshes every few seconds. A second run finds it held and stops at once
with a message naming the first. A lock whose holder died without releasing it (SIGKILL, a lost
machine) is stale, and the next run takes it over:

- on the same host, as soon as the holder's process id is gone;
- from any host, once the heartbeat is older than `stale_seconds`.

The lock file is created with O_CREAT | O_EXCL, atomic on a local or network file system. On
Google Cloud Storage (gs://) the lock is an object created only if absent (the precondition
`ifGenerationMatch=0`), its heartbeat rewritten only over the generation this run wrote last,
and a stale one deleted only at the generation judged stale (`ObjectRunLock`): the same
semantics and messages, with the store's preconditions in place of the file system's. A
multi-host run takes the lock once, on process 0, and every process learns whether it was
taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

from t2t import files, hosts

LOCK_FILE = "train.lock"
_HELD: set[RunLock] = set()  # the locks this process holds, for `release_all`


class RunLockedError(OSError):
    """The model directory's lock is held by another live run."""


class RunLock:
    """The training lock of one model directory (re-entrant within one process).

    Example:
      with RunLock("/runs/demo"):
          trainer.train(1000)
    """

    def __init__(
        self, model_dir: str, *, heartbeat_seconds: float = 5.0, stale_seconds: float = 60.0
    ):
        self.model_dir = os.fspath(model_dir)
        self.path = os.path.join(self.model_dir, LOCK_FILE)
        self.heartbeat_seconds, self.stale_seconds = heartbeat_seconds, stale_seconds
        self.holder = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "command": " ".join(
                os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv)
            )[:500],
            "token": os.urandom(8).hex(),  # this lock object's, across a lost answer
        }
        self.lost = False  # set when another run took the lock over (our heartbeat stalled)
        self._held = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- taking and giving back ------------------------------------------------------------------

    def acquire(self) -> None:
        """Takes the lock, taking over a stale one; raises RunLockedError when it is held."""
        self._prepare()
        for _ in range(8):  # each round either takes the lock or retires a stale one
            if self._create():
                self._start_heartbeat()
                _HELD.add(self)
                return
            current = self._read()
            if current is not None and current.get("unreadable"):
                current = self._read_settled()
            if current is None:  # vanished (released): look again
                continue
            if current.get("unreadable"):  # still no record after the holder's writing time
                self._retire(current, "the lock file holds no lock record (empty or damaged)")
                continue
            if current.get("token") == self.holder["token"]:  # our own create, answer lost
                self._adopt(current)
                return
            if self._is_ours(current):
                return  # this process already holds it (e.g. a second trainer in one script)
            reason = self._stale_reason(current)
            if reason is None:
                raise RunLockedError(self._held_message(current))
            self._retire(current, reason)
        raise RunLockedError(
            f"Could not take {self.path}: other runs keep taking it. "
            "Make sure only one `t2t train` uses this MODEL_DIR."
        )

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock file if it is still ours."""
        _HELD.discard(self)
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * self.heartbeat_seconds)
            self._thread = None
        if self._held:
            self._delete_if_ours()
            self._held = False

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()

    # -- the file (each primitive is overridden by ObjectRunLock) ---------------------------------

    def _record(self) -> str:
        return json.dumps({**self.holder, "heartbeat": time.time()})

    def _prepare(self) -> None:
        try:
            os.makedirs(self.model_dir, exist_ok=True)  # local path: the disk lock
        except OSError as error:
            raise OSError(
                f"Cannot create the model directory {self.model_dir} "
                f"({error.strerror or error}). Give a MODEL_DIR under a directory "
                "this user can write."
            ) from None

    def _adopt(self, record: dict[str, Any]) -> None:
        """Holds a lock this object created (a file system always says so at once)."""
        del record
        self._held = True
        self._start_heartbeat()
        _HELD.add(self)

    def _delete_if_ours(self) -> None:
        current = self._read()
        if current is not None and self._is_ours(current):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.path)  # local path: the disk lock

    def _refresh(self) -> bool:
        """Writes a new heartbeat; False when the lock is no longer this run's."""
        current = self._read()
        if current is None or not self._is_ours(current):
            return False
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:  # local path: the disk lock
            f.write(self._record())
        os.replace(temporary, self.path)  # local path: the disk lock
        return True

    def _create(self) -> bool:
        try:
            fd = os.open(
                self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644
            )  # local path: the disk lock
        except FileExistsError:
            return False
        except PermissionError as error:
            raise PermissionError(
                f"Cannot write in the model directory {self.model_dir} ({error.strerror}). "
                "Give a MODEL_DIR this user can write, or change its permissions."
            ) from None
        with os.fdopen(fd, "w") as f:
            f.write(self._record())
        self._held = True
        return True

    def _read(self) -> dict[str, Any] | None:
        try:
            with open(self.path) as f:  # local path: the disk lock
                record = json.load(f)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            record = None
        if isinstance(record, dict) and "pid" in record and "heartbeat" in record:
            return record
        # Empty or not a lock record: being written this instant (the holder writes right
        # after creating the file), or damaged (a crash in between, a stray edit).
        return {"unreadable": True}

    def _read_settled(self, seconds: float = 1.0) -> dict[str, Any] | None:
        """The lock record once its holder has had `seconds` to write it (a creator writes
        within milliseconds); still {"unreadable": True} after that."""
        deadline = time.monotonic() + seconds
        current = self._read()
        while current is not None and current.get("unreadable") and time.monotonic() < deadline:
            time.sleep(0.05)
            current = self._read()
        return current

    def _is_ours(self, record: dict[str, Any]) -> bool:
        return record.get("pid") == os.getpid() and record.get("host") == self.holder["host"]

    def _stale_reason(self, record: dict[str, Any]) -> str | None:
        """Why a lock held by someone else is stale, or None when its holder may be alive."""
        age = time.time() - float(record.get("heartbeat") or 0)
        if record.get("host") == self.holder["host"] and isinstance(record.get("pid"), int):
            if not _process_alive(record["pid"]):
                return f"process {record['pid']} on this host is gone"
        if age > self.stale_seconds:
            return f"its last heartbeat was {age:.0f} s ago"
        return None

    def _retire(self, record: dict[str, Any], reason: str) -> None:
        """Moves a stale lock out of the way (unless someone replaced it meanwhile)."""
        retired = f"{self.path}.stale.{os.getpid()}"
        try:
            os.rename(self.path, retired)  # local path: the disk lock
        except FileNotFoundError:
            return
        try:
            with open(retired) as f:  # local path: the disk lock
                moved = json.load(f)
        except (OSError, ValueError):
            moved = None
        if not isinstance(moved, dict):
            moved = None
        if moved is not None and moved.get("heartbeat") != record.get("heartbeat"):
            # A new holder wrote it after we judged it stale: put it back, unless yet another
            # lock appeared in the meantime.
            with contextlib.suppress(FileExistsError):
                os.link(retired, self.path)  # local path: the disk lock
        else:
            print(
                f"Taking over the stale lock of {self.model_dir} ({reason}; it was held by "
                f"{_who(record)}).",
                file=sys.stderr,
                flush=True,
            )
        with contextlib.suppress(FileNotFoundError):
            os.remove(retired)  # local path: the disk lock

    def _held_message(self, record: dict[str, Any]) -> str:
        age = time.time() - float(record.get("heartbeat") or 0)
        return (
            f"Another run is training in {self.model_dir}: {_who(record)}, last heartbeat "
            f"{age:.0f} s ago. Two runs writing one model directory would overwrite each "
            "other's checkpoints. Wait for it to finish or stop it, or give this run a new "
            f"MODEL_DIR. If that process is gone for good (a lost machine), the lock counts as "
            f"stale {self.stale_seconds:.0f} s after its last heartbeat; deleting {self.path} "
            "takes it over at once."
        )

    # -- the heartbeat ---------------------------------------------------------------------------

    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name="t2t-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_seconds):
            try:
                refreshed = self._refresh()
            except Exception as error:  # noqa: BLE001 (the store failed past its retries)
                print(
                    f"WARNING: the lock's heartbeat failed ({error}); trying again.",
                    file=sys.stderr,
                )
                continue
            if not refreshed:
                current = self._read()
                self.lost = True
                print(
                    f"WARNING: the lock of {self.model_dir} is no longer this run's (taken "
                    f"over by {_who(current) if current else 'nobody'}); another run may be "
                    "writing the same checkpoints.",
                    file=sys.stderr,
                    flush=True,
                )
                return


class ObjectRunLock(RunLock):
    """`RunLock` on Google Cloud Storage: an object created only if absent.

    Every change is conditional on the object's generation (GCS preconditions), which stands in
    for the file system's atomic create and rename: the lock is created with
    `ifGenerationMatch=0` (a second creator gets 412), each heartbeat rewrites it only over
    the generation this run wrote last (a run whose lock was taken over finds out at its next
    beat), and a stale lock is deleted only at the generation that was judged stale (a lock
    renewed meanwhile stays). An answer lost on the way back (the store applied the create
    but the connection dropped) is recognised by the record's token and adopted.
    """

    def __init__(self, model_dir: str, **kwargs):
        super().__init__(model_dir, **kwargs)
        self.model_dir = files.normalize(self.model_dir)
        self.path = files.join(self.model_dir, LOCK_FILE)
        bucket, name = files.split_bucket(self.path)
        self._blob_name = name
        self._bucket_name = bucket
        self._generation: int | None = None

    def _blob(self):
        return files.gcs_client().bucket(self._bucket_name).blob(self._blob_name)

    def _prepare(self) -> None:
        files.check_reachable(self.model_dir)  # no directories to make on a store

    def _create(self) -> bool:
        from google.api_core import exceptions

        blob = self._blob()
        try:
            blob.upload_from_string(self._record(), if_generation_match=0, timeout=files.TIMEOUT)
        except exceptions.PreconditionFailed:
            return False
        except exceptions.Forbidden as error:
            raise PermissionError(
                f"Cannot write in the model directory {self.model_dir} ({error.message}). "
                "Give a MODEL_DIR in a bucket this account can write."
            ) from None
        self._generation = blob.generation
        self._held = True
        return True

    def _read(self) -> dict[str, Any] | None:
        from google.api_core import exceptions

        for _ in range(8):
            blob = self._blob().bucket.get_blob(self._blob_name, timeout=files.TIMEOUT)
            if blob is None:
                return None
            try:
                data = blob.download_as_bytes(
                    if_generation_match=blob.generation, timeout=files.TIMEOUT
                )
            except (exceptions.NotFound, exceptions.PreconditionFailed):
                continue  # replaced or deleted between the two requests: look again
            try:
                record = json.loads(data)
            except ValueError:
                record = None
            if isinstance(record, dict) and "pid" in record and "heartbeat" in record:
                return {**record, "generation": blob.generation}
            return {"unreadable": True, "generation": blob.generation}
        return None

    def _adopt(self, record: dict[str, Any]) -> None:
        self._generation = record["generation"]
        super()._adopt(record)

    def _retire(self, record: dict[str, Any], reason: str) -> None:
        from google.api_core import exceptions

        try:
            self._blob().delete(if_generation_match=record["generation"], timeout=files.TIMEOUT)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return  # released, renewed or taken meanwhile: judged again on the next round
        print(
            f"Taking over the stale lock of {self.model_dir} ({reason}; it was held by "
            f"{_who(record)}).",
            file=sys.stderr,
            flush=True,
        )

    def _refresh(self) -> bool:
        from google.api_core import exceptions

        blob = self._blob()
        try:
            blob.upload_from_string(
                self._record(), if_generation_match=self._generation, timeout=files.TIMEOUT
            )
        except exceptions.PreconditionFailed:
            current = self._read()  # our own rewrite, its answer lost, or another holder
            if current is None or current.get("token") != self.holder["token"]:
                return False
            self._generation = current["generation"]
            return True
        self._generation = blob.generation
        return True

    def _delete_if_ours(self) -> None:
        from google.api_core import exceptions

        if self._generation is None:
            return
        with contextlib.suppress(exceptions.NotFound, exceptions.PreconditionFailed):
            self._blob().delete(if_generation_match=self._generation, timeout=files.TIMEOUT)


def release_all() -> None:
    """Deletes every lock file this process holds (before an immediate exit)."""
    for held in list(_HELD):
        _HELD.discard(held)
        with contextlib.suppress(Exception):
            held._delete_if_ours()


def _who(record: dict[str, Any]) -> str:
    if record.get("unreadable"):
        return "no one it names (the file held no lock record)"
    command = str(record.get("command") or "")
    if len(command) > 100:
        command = command[:97] + "..."
    command = f" running `{command}`" if command else ""
    started = f", started {record['started']}" if record.get("started") else ""
    return f"process {record.get('pid')} on host {record.get('host')}{started}{command}"


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def hold(model_dir: str, **kwargs):
    """Holds `model_dir`'s training lock for the `with` body; in a multi-host run process 0
    takes it and every process raises if it could not."""
    import jax

    kind = ObjectRunLock if files.is_remote(model_dir) else RunLock
    if jax.process_count() == 1:
        with kind(model_dir, **kwargs) as lock:
            yield lock
        return
    lock, error, raised = None, None, None
    if jax.process_index() == 0:
        lock = kind(model_dir, **kwargs)
        try:
            lock.acquire()
            error = ""
        except Exception as failed:  # noqa: BLE001 (every process must hear of it)
            error, raised = str(failed) or type(failed).__name__, failed
    said = hosts.agree_from_first(f"the lock of {model_dir}", error)
    if said:
        if raised is not None:
            raise raised
        raise RunLockedError(said)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


hosts.on_lost(release_all)  # a process stopping for a lost peer gives the directory back
