"""What reaches the terminal: error messages, bad input told apart from bugs, and the
libraries' start-up noise kept off the console. Used by `t2t.cli`; imports nothing heavy.
"""

from __future__ import annotations

import os
import re
import sys

from t2t.errors import UserError

# gin appends "In call to configurable 'NAME' (<function ...>)" to errors raised inside a
# configurable; for a user's bad input that line only repeats the command, so it is dropped.
_GIN_CALL_NOTE = re.compile(r"\n  In call to configurable '[^']*' \(.*\)(?: in scope '[^']*')?")


# gin's error for a required parameter nobody bound: "Required bindings for `run` not provided
# in config: ['tasks']".
_GIN_REQUIRED = re.compile(r"Required bindings for `([^`]*)` not provided in config: \[(.*)\]")


def error_message(error: BaseException) -> str:
    """The message of an error for the console, without gin's call-site notes."""
    message = _GIN_CALL_NOTE.sub("", str(error))
    required = _GIN_REQUIRED.search(message)
    if required:
        function, names = required.groups()
        first = names.split(",")[0].strip().strip("'\"")
        message += (
            f". Bind each in a gin file (`{function}.{first} = ...`) or with "
            f"--gin.{function}.{first}=VALUE."
        )
    return message


_T2T_DIR = os.path.dirname(os.path.abspath(__file__))  # local path: own files
# The project's packages, installed side by side: their ValueErrors are its own checks.
_OWN_DIRS = tuple(
    os.path.join(os.path.dirname(_T2T_DIR), name) + os.sep
    for name in ("t2t", "preprocessors", "c4_pipeline")
)
# Libraries whose ValueErrors describe the user's input (a gin binding naming nothing, a flag).
_USER_FACING = ("gin", "argparse")


def is_user_error(error: BaseException) -> bool:
    """Whether an error is bad input (exit 2, a message) rather than a bug (exit 1, the stack).

    Bad input: a `UserError`; an `OSError` (a path, a permission, a full disk); a `ValueError`
    raised by the project's own checks (`t2t`, `preprocessors`, `c4_pipeline`) or by gin. A
    `ValueError` raised inside JAX, NumPy, TensorFlow, Orbax or seqio that t2t did not turn
    into a message is a bug (of t2t's checks at least).
    """
    if isinstance(error, (UserError, OSError)):
        return True
    if isinstance(error, RuntimeError) and _GIN_REQUIRED.search(str(error)):
        return True  # a gin file that leaves a required parameter unbound
    if not isinstance(error, ValueError):
        return False
    tb = error.__traceback__
    last = None
    while tb is not None:
        last = tb.tb_frame.f_code.co_filename
        tb = tb.tb_next
    if last is None:
        return True
    last = os.path.abspath(last)  # local path: own files
    if last.startswith(_OWN_DIRS):
        return True
    module = last.split("site-packages" + os.sep, 1)[-1].split(os.sep, 1)[0]
    return module in _USER_FACING


def quiet_libraries() -> None:
    """Keeps the console to t2t's own output: TensorFlow's, XLA's and libtpu's C++ start-up
    lines (oneDNN, "Could not find cuda drivers", "failed call to cuInit", TPU host probing, the
    tf.data cache warning), and third-party Python warnings (absl, TensorFlow, Beam). Set before
    those libraries load; variables the user set win. `--verbose` (or T2T_VERBOSE=1) skips it.
    """
    import importlib.util
    import logging

    for name, value in (
        ("TF_CPP_MIN_LOG_LEVEL", "3"),
        ("TPU_MIN_LOG_LEVEL", "3"),
        ("TPU_STDERR_LOG_LEVEL", "3"),
        ("GRPC_VERBOSITY", "ERROR"),
    ):
        os.environ.setdefault(name, value)
    # libtpu installed (the `tpu` extra, to compile for TPU topologies) on a machine with no TPU
    # makes JAX probe for one and print libtpu's complaints: keep JAX on the other backends.
    if (
        "JAX_PLATFORMS" not in os.environ
        and importlib.util.find_spec("libtpu") is not None
        and not any(
            os.path.exists(p)  # local path: device files
            for p in ("/dev/accel0", "/dev/vfio/0")
        )
        and "TPU_ACCELERATOR_TYPE" not in os.environ
    ):
        cuda = any(
            importlib.util.find_spec(m) is not None
            for m in ("jax_cuda12_plugin", "jax_cuda13_plugin")
        )
        os.environ["JAX_PLATFORMS"] = "cuda,cpu" if cuda else "cpu"
    for name in ("absl", "tensorflow", "apache_beam", "jax._src.xla_bridge"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().addFilter(_own_warnings_only)
    # TensorFlow's shared libraries log while they load (oneDNN, the CUDA stub), before any log
    # level applies: load them with the process's stderr pointed at /dev/null.
    if "tensorflow" not in sys.modules:
        sys.stderr.flush()
        saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)  # local path: own files
        try:
            os.dup2(devnull, 2)
            import tensorflow  # noqa: F401
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            os.close(devnull)


def _own_warnings_only(record) -> bool:
    """Root-logger records below ERROR pass only when t2t logged them (Beam logs on root)."""
    module = os.path.abspath(record.pathname)  # local path: own files
    return record.levelno >= 40 or module.startswith(_T2T_DIR + os.sep)


def print_traceback(show: bool) -> None:
    """The stack of the error being handled, when `show`."""
    if show:
        import traceback

        traceback.print_exc()
