"""Every path a user gives, on a local disk or an object store (gs://), read and written one way.

Model directories, checkpoints to start from, releases, chain and study directories, eval and
infer outputs, vocabularies, data and cache directories may each be local or in a bucket. This
module is the one way t2t touches them: etils.epath underneath (what Orbax uses; for gs:// it
goes through TensorFlow's file system, which tf.data and seqio read with too), with the few
operations t2t needs spelled out where an object store differs from a disk:

- a path keeps its scheme (`os.path.normpath("gs://b/x")` is the local path "gs:/b/x");
- a whole-file write is atomic on both (a local file is written beside and renamed over; an
  object is one upload, visible only when complete);
- `move` of a directory is a rename on a disk and copy-then-delete on a store, where it is
  neither atomic nor free (callers make it safe to repeat; see `set_aside` in
  `t2t.checkpoints.manager`);
- the store's failures (retries exhausted, no credentials, no such bucket) arrive as
  `StorageError`, an `OSError` whose message names the path and what was being done, instead
  of TensorFlow's `OpError`.

Python's `open`, `os.*`, `glob` and `shutil` touch only files t2t makes for itself (temporary
files); a test (`tests/test_files.py`) keeps it so.

    files.write_text(files.join(model_dir, "config.gin"), text)
    if files.exists(path): ...
"""

from __future__ import annotations

import contextlib
import functools
import os
import posixpath
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import Union

from etils import epath

PathLike = Union[str, os.PathLike]


class StorageError(OSError):
    """An object store failed an operation (after its client's own retries)."""


def _tf_errors():
    tf = sys.modules.get("tensorflow")
    return tf.errors if tf is not None else None


def _raise_translated(error: Exception, p: PathLike, operation: str) -> None:
    """Raises TensorFlow's file-system `error` as the OSError it means, naming `p`; returns for
    any other error (the caller re-raises it)."""
    errors = _tf_errors()
    if errors is None or not isinstance(error, errors.OpError):
        return
    detail = (str(error).strip().splitlines() or [type(error).__name__])[0]
    if isinstance(error, errors.NotFoundError):
        raise FileNotFoundError(f"{p}: {operation}: not found ({detail})") from None
    if isinstance(error, errors.PermissionDeniedError):
        raise PermissionError(f"{p}: {operation}: permission denied ({detail})") from None
    raise StorageError(f"{p}: {operation} failed: {detail}") from None


def _translated(operation: str):
    """Decorates a function of a path so that TensorFlow's errors arrive as OSErrors."""

    def decorate(function):
        @functools.wraps(function)
        def run(p, *args, **kwargs):
            try:
                return function(p, *args, **kwargs)
            except OSError:
                raise
            except Exception as error:  # noqa: BLE001 (only TensorFlow's OpError is translated)
                _raise_translated(error, p, operation)
                raise

        return run

    return decorate


# -- names ---------------------------------------------------------------------------------------


def is_remote(path: PathLike) -> bool:
    """Whether `path` names an object store (`gs://...`), not a local file."""
    return "://" in os.fspath(path)


def path(p: PathLike) -> epath.Path:
    """`p` as an `epath.Path` (local or gs://)."""
    return epath.Path(os.fspath(p))


def join(base: PathLike, *parts: str) -> str:
    """`base/part/...`, keeping a scheme's `//`."""
    base = os.fspath(base)
    if is_remote(base):  # an object name has no "." or "//" in it: "gs://b/./x" is not "gs://b/x"
        return normalize(posixpath.join(base, *parts))
    return os.path.join(base, *parts)


def normalize(p: PathLike) -> str:
    """`p` without redundant separators, `.` or `..` (`os.path.normpath`, keeping a scheme)."""
    p = os.fspath(p)
    if is_remote(p):
        scheme, _, rest = p.partition("://")
        return f"{scheme}://{posixpath.normpath(rest)}" if rest.strip("/") else p
    return os.path.normpath(p)


def absolute(p: PathLike) -> str:
    """A local path made absolute (Orbax's writers refuse relative ones); a remote one
    normalized."""
    p = os.fspath(p)
    return normalize(p) if is_remote(p) else os.path.abspath(os.path.expanduser(p))


def real(p: PathLike) -> str:
    """The canonical form of `p`, for comparing paths: a local one absolute with links
    resolved (`os.path.realpath`), a remote one normalized."""
    p = os.fspath(p)
    return normalize(p) if is_remote(p) else os.path.realpath(os.path.expanduser(p))


def parent(p: PathLike) -> str:
    """The directory holding `p`."""
    p = os.fspath(p).rstrip("/") or os.fspath(p)
    return posixpath.dirname(p) if is_remote(p) else os.path.dirname(p)


def basename(p: PathLike) -> str:
    p = os.fspath(p).rstrip("/") or os.fspath(p)
    return posixpath.basename(p) if is_remote(p) else os.path.basename(p)


# -- queries -------------------------------------------------------------------------------------


@_translated("checking whether it exists")
def exists(p: PathLike) -> bool:
    return path(p).exists()


@_translated("checking whether it is a directory")
def isdir(p: PathLike) -> bool:
    return path(p).is_dir()


@_translated("listing")
def listdir(p: PathLike) -> list[str]:
    """The names in directory `p`, sorted (no trailing slashes)."""
    return sorted({child.name.rstrip("/") for child in path(p).iterdir()} - {""})


@_translated("matching")
def glob(pattern: PathLike) -> list[str]:
    """The paths matching `pattern` (`*` and `?` within one level), sorted."""
    pattern = os.fspath(pattern)
    directory, name = (posixpath if is_remote(pattern) else os.path).split(pattern)
    if not exists(directory):
        return []
    return sorted(os.fspath(p) for p in path(directory).glob(name))


@_translated("reading the size of")
def size(p: PathLike) -> int:
    return path(p).stat().length


@_translated("walking")
def files_under(p: PathLike) -> list[str]:
    """Every file under directory `p`, as paths relative to it (`/`-separated), sorted."""
    root = path(p)
    found = []
    for directory, _, names in root.walk():
        relative = os.fspath(directory)[len(os.fspath(root)) :].strip("/")
        found += [posixpath.join(relative, n) if relative else n for n in names if n]
    return sorted(found)


# -- reading and writing -------------------------------------------------------------------------


@_translated("reading")
def read_bytes(p: PathLike) -> bytes:
    return path(p).read_bytes()


@_translated("reading")
def read_text(p: PathLike) -> str:
    return path(p).read_text()


@_translated("writing")
def write_bytes(p: PathLike, data: bytes) -> None:
    """Writes `p` whole: readers see the old contents or the new, never a part."""
    p = os.fspath(p)
    if is_remote(p):
        path(p).write_bytes(data)  # one object, visible when its upload completes
        return
    directory = os.path.dirname(os.path.abspath(p))
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def write_text(p: PathLike, text: str) -> None:
    """Writes `p` whole (see `write_bytes`)."""
    write_bytes(p, text.encode("utf-8"))


@contextlib.contextmanager
def open_file(p: PathLike, mode: str = "r") -> Iterator:
    """A file object reading `p` ("r" or "rb"), streamed; writes go through `atomic_writer`."""
    if mode not in ("r", "rb"):
        raise ValueError(f"open_file reads ('r', 'rb'); write with atomic_writer, not {mode!r}.")
    try:
        with path(p).open(mode) as f:
            yield f
    except OSError:
        raise
    except Exception as error:  # noqa: BLE001 (only TensorFlow's OpError is translated)
        _raise_translated(error, p, "reading")
        raise


@contextlib.contextmanager
def atomic_writer(p: PathLike, mode: str = "w") -> Iterator:
    """A file object ("w" or "wb") whose contents replace `p` whole when the block ends without
    error (a local temporary file renamed over it; one upload on a store); `p` is untouched if
    the block fails."""
    p = os.fspath(p)
    if is_remote(p):  # written locally first: TensorFlow's upload would go out on a failure too
        with tempfile.TemporaryDirectory(prefix="t2t-") as scratch:
            staged = os.path.join(scratch, basename(p))
            with open(staged, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
                yield f
            copy(staged, p)
        return
    directory = os.path.dirname(os.path.abspath(p))
    os.makedirs(directory, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(p)}.", dir=directory)
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(temporary, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


# -- changing ------------------------------------------------------------------------------------


@_translated("creating the directory")
def makedirs(p: PathLike) -> None:
    path(p).mkdir(parents=True, exist_ok=True)


@_translated("deleting")
def remove(p: PathLike) -> None:
    """Deletes file `p`; nothing when it is not there."""
    path(p).unlink(missing_ok=True)


@_translated("deleting the directory")
def rmtree(p: PathLike) -> None:
    """Deletes directory `p` and everything in it; nothing when it is not there."""
    path(p).rmtree(missing_ok=True)


@_translated("copying")
def copy(source: PathLike, target: PathLike) -> None:
    """Copies file `source` to `target`, replacing it whole (readers never see a part), across
    file systems too."""
    source, target = os.fspath(source), os.fspath(target)
    if is_remote(target) and is_remote(source):
        path(source).copy(target, overwrite=True)  # one object, rewritten by the store
        return
    if is_remote(target) or is_remote(source):
        write_bytes(target, read_bytes(source))
        return
    fd, temporary = tempfile.mkstemp(
        prefix=f".{os.path.basename(target)}.", dir=os.path.dirname(os.path.abspath(target))
    )
    os.close(fd)
    try:
        shutil.copyfile(source, temporary)
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(temporary)
        raise


def copytree(source: PathLike, target: PathLike) -> None:
    """Copies directory `source` into `target` file by file (existing files are replaced)."""
    for relative in files_under(source):
        destination = join(target, *relative.split("/"))
        makedirs(parent(destination))
        copy(join(source, *relative.split("/")), destination)


@_translated("moving")
def move(source: PathLike, target: PathLike) -> None:
    """Moves `source` (a file or a directory) to `target`, which must not exist. A rename on a
    disk (atomic); on an object store a copy, then the deletion of `source`, so a move stopped
    midway leaves `source` whole or `target` whole, and repeating it finishes it."""
    source, target = os.fspath(source), os.fspath(target)
    if not is_remote(source) and not is_remote(target):
        os.rename(source, target)
        return
    if isdir(source):
        copytree(source, target)
        rmtree(source)
    else:
        copy(source, target)
        remove(source)


# -- local stand-ins for libraries that take only local paths -------------------------------------


@contextlib.contextmanager
def local_copy(p: PathLike) -> Iterator[str]:
    """A local path holding `p` (a file or a directory): `p` itself when it is local, else a
    temporary copy, removed afterwards."""
    p = os.fspath(p)
    if not is_remote(p):
        yield p
        return
    with tempfile.TemporaryDirectory(prefix="t2t-") as scratch:
        local = os.path.join(scratch, basename(p))
        if isdir(p):
            for relative in files_under(p):
                destination = os.path.join(local, *relative.split("/"))
                os.makedirs(os.path.dirname(destination), exist_ok=True)
                with open(destination, "wb") as f:  # local path: our own temporary file
                    f.write(read_bytes(join(p, *relative.split("/"))))
        else:
            with open(local, "wb") as f:  # local path: our own temporary file
                f.write(read_bytes(p))
        yield local


@contextlib.contextmanager
def staged_directory(p: PathLike) -> Iterator[str]:
    """A local directory to write `p`'s files into: `p` itself when it is local, else a
    temporary directory whose files are uploaded to `p` when the block ends without error."""
    p = os.fspath(p)
    if not is_remote(p):
        os.makedirs(p, exist_ok=True)
        yield p
        return
    with tempfile.TemporaryDirectory(prefix="t2t-") as scratch:
        yield scratch
        for root, _, names in os.walk(scratch):
            for name in names:
                local = os.path.join(root, name)
                relative = os.path.relpath(local, scratch).split(os.sep)
                destination = join(p, *relative)
                makedirs(parent(destination))
                with open(local, "rb") as f:  # local path: our own temporary file
                    write_bytes(destination, f.read())


# -- object stores: the client t2t's own requests use, and a check before a run ------------------


def split_bucket(p: PathLike) -> tuple[str, str]:
    """`gs://bucket/a/b` -> ("bucket", "a/b")."""
    p = os.fspath(p)
    scheme, _, rest = p.partition("://")
    if scheme != "gs":
        raise StorageError(
            f"{p}: t2t reads and writes object stores through gs:// (Google Cloud Storage) "
            f"only, not {scheme}://. Give a gs:// or local path."
        )
    bucket, _, name = rest.partition("/")
    return bucket, name.strip("/")


_CLIENT = None
# Requests t2t makes itself (the lock, the check) give up after these seconds (connect, read);
# the client retries them on 429, 5xx and dropped connections for up to 120 s in all.
TIMEOUT = (10, 60)


def gcs_client():
    """A google-cloud-storage client (one per process): the default credentials, or none for
    an emulator (`STORAGE_EMULATOR_HOST`)."""
    global _CLIENT
    if _CLIENT is None:
        from google.cloud import storage

        try:
            _CLIENT = storage.Client()
        except Exception as error:  # noqa: BLE001 (google.auth's DefaultCredentialsError)
            if type(error).__name__ != "DefaultCredentialsError":
                raise
            raise StorageError(_NO_CREDENTIALS) from None
    return _CLIENT


_NO_CREDENTIALS = (
    "No Google Cloud credentials on this machine, so gs:// paths cannot be read or written. "
    "On a Cloud TPU or GCE VM the VM's service account is used; elsewhere run `gcloud auth "
    "application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account's "
    "key file."
)


def check_reachable(*paths: PathLike | None) -> None:
    """Raises StorageError within seconds when a gs:// path among `paths` cannot be used: no
    credentials, storage not reachable, no such bucket, no permission to list it. Local paths
    and None are skipped. Run before anything else touches the paths: TensorFlow's and
    TensorStore's own clients would retry such failures for minutes."""
    checked = set()
    for p in paths:
        if p is None or not is_remote(p):
            continue
        bucket, name = split_bucket(p)
        if bucket in checked:
            continue
        checked.add(bucket)
        _check_bucket(os.fspath(p), bucket, name)


def _check_bucket(p: str, bucket: str, name: str) -> None:
    import requests
    from google.api_core import exceptions

    client = gcs_client()
    transient = (
        requests.ConnectionError,
        requests.Timeout,
        exceptions.TooManyRequests,
        exceptions.ServerError,
    )
    for attempt in range(3):  # a dropped request now and then is the store's weather
        try:
            list(client.list_blobs(bucket, prefix=name, max_results=1, timeout=(3, 5), retry=None))
            return
        except requests.ConnectTimeout:  # no answer at all in 3 s: no network, not weather
            raise_unusable(p, bucket)
        except transient:
            if attempt == 2:
                raise_unusable(p, bucket)
            time.sleep(1.0 + attempt)
        except Exception:  # noqa: BLE001 (sorted in raise_unusable)
            raise_unusable(p, bucket)


def raise_unusable(p: str, bucket: str) -> None:
    """Raises the StorageError (or PermissionError) that says why `bucket` cannot be used, for
    the exception being handled."""
    import requests
    from google.api_core import exceptions

    try:
        raise
    except exceptions.NotFound:
        raise StorageError(
            f"{p}: the bucket gs://{bucket} does not exist (or this account cannot see it). "
            "Create it (`gcloud storage buckets create gs://BUCKET`) or fix the path."
        ) from None
    except exceptions.Forbidden as error:
        raise PermissionError(
            f"{p}: this account may not list gs://{bucket} ({error.message}). Grant it "
            "roles/storage.objectAdmin on the bucket, or use another bucket."
        ) from None
    except exceptions.Unauthorized as error:
        raise StorageError(
            f"{p}: the credentials were refused ({error.message}). " + _NO_CREDENTIALS
        ) from None
    except (requests.ConnectionError, requests.Timeout) as error:
        raise StorageError(
            f"{p}: cannot reach Google Cloud Storage ({type(error).__name__}: "
            f"{str(error)[:200]}). Check this machine's network (and STORAGE_EMULATOR_HOST "
            "when an emulator is meant)."
        ) from None
    except (exceptions.TooManyRequests, exceptions.ServerError) as error:
        raise StorageError(
            f"{p}: Google Cloud Storage keeps failing ({error.code}: {error.message}); try "
            "again later."
        ) from None
    except Exception as error:  # noqa: BLE001 (google.auth's refresh errors)
        if "RefreshError" in type(error).__name__ or "TransportError" in type(error).__name__:
            raise StorageError(
                f"{p}: the credentials could not be used ({error}). " + _NO_CREDENTIALS
            ) from None
        raise


# What TensorFlow's, TensorStore's and Orbax's errors say when the store failed them (after
# their own retries), as opposed to a bug.
_STORE_FAILURES = (
    "Error executing an HTTP request",
    "retry attempts failed",
    "when uploading gs://",
    "when reading gs://",
    "when reading metadata of gs://",
    "storage.googleapis.com",
    "www.googleapis.com",
)


def store_failure(error: BaseException) -> str | None:
    """When `error` (or an error it was raised from) is an object store's failure that its
    client gave up on, that failure in one line; None otherwise."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error)
        if any(marker in text for marker in _STORE_FAILURES):
            line = re.sub(r"\{\{function_node[^}]*\}\}\s*", "", text.strip()).splitlines()[0]
            return line[:400]
        error = error.__cause__ or error.__context__
    return None


# A write the file system refused for room: errno, and the words of TensorFlow and TensorStore.
_NO_ROOM = {
    28: "the disk is full",  # ENOSPC
    27: "a file grew past this process's file-size limit (ulimit -f)",  # EFBIG
    122: "the disk quota is used up",  # EDQUOT
}
_NO_ROOM_WORDS = {
    "No space left on device": 28,
    "File too large": 27,
    "Disk quota exceeded": 122,
}


def out_of_room(error: BaseException) -> str | None:
    """Why a write failed for want of room (a full disk, the file-size limit, a quota), when
    that is what `error` (or an error it came from) says; None otherwise."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in _NO_ROOM:
            return _NO_ROOM[error.errno]
        for words, number in _NO_ROOM_WORDS.items():
            if words in str(error):
                return _NO_ROOM[number]
        error = error.__cause__ or error.__context__
    return None
