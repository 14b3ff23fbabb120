"""The `t2t` command: a thin dispatcher to importable functions, one subcommand each.

Each subcommand is a function `add_<name>(subparsers)` that declares its flags and binds `handler`,
a small function that imports the module doing the work (so `t2t --help` stays fast) and calls
it: `data_commands` (vocab, cache), `run_commands` (train, chain, study, compile, check),
`decode_commands` (eval, infer, export, convert, average), with the shared gin flags in `gin_flags`. To
add a subcommand, write such a function and list it in SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import sys

from t2t import terminal
from t2t.cli import data_commands, decode_commands, run_commands

SUBCOMMANDS = [
    data_commands.add_vocab,
    data_commands.add_cache,
    run_commands.add_train,
    run_commands.add_chain,
    run_commands.add_study,
    decode_commands.add_eval,
    decode_commands.add_infer,
    decode_commands.add_export,
    decode_commands.add_convert,
    decode_commands.add_average,
    run_commands.add_compile,
    run_commands.add_check,
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="t2t", description="Text-to-text Transformer pretraining in JAX."
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in SUBCOMMANDS:
        add(subparsers)
    return parser


def split_gin_bindings(argv: list[str]) -> tuple[list[str], list[str]]:
    """Separates `--gin.NAME=VALUE` (or `--gin.NAME VALUE`) flags from the others.

    Example: ["train", "--gin.MODEL_DIR='/tmp/x'", "--gin_file=a.gin"] ->
    (["train", "--gin_file=a.gin"], ["MODEL_DIR = '/tmp/x'"]).
    """
    rest, bindings = [], []
    items = iter(argv)
    for item in items:
        if item.startswith("--gin.") and item != "--gin.":
            name, equals, value = item[len("--gin.") :].partition("=")
            if not equals:
                value = next(items, None)
                if value is None:
                    raise SystemExit(f"t2t: error: {item} needs a value (--gin.NAME=VALUE).")
            bindings.append(f"{name} = {value}")
        else:
            rest.append(item)
    return rest, bindings


_TRAINING_COMMANDS = ("train", "chain", "study")
_PREEMPTED_EXIT_CODE = 75  # t2t.trainer.loop.PREEMPTED_EXIT_CODE, without importing it here


@contextlib.contextmanager
def _stop_at_once_on_signals(command: str):
    """SIGTERM or SIGINT outside the training loop (start-up: imports, gin, data; or the end,
    after the last checkpoint is committed) stops the process at once with exit 75: nothing
    unsaved is lost there, and the trainer handles them itself while it trains (it saves, then
    stops). `os._exit`, not an exception: an exception raised into a half-initialized runtime
    (XLA, TensorFlow) can crash the interpreter's shutdown (seen as SIGSEGV under the fault
    injection harness). The previous handlers are put back when the command returns.
    """
    import signal

    def handler(signum, frame):
        from t2t.checkpoints import lock

        lock.release_all()  # the model directory is free again at once
        print(
            f"t2t {command}: stopped by {signal.Signals(signum).name} outside the training "
            "loop (starting up or finishing); every checkpoint reported saved is kept. Run "
            "the same command again to go on.",
            file=sys.stderr,
            flush=True,
        )
        sys.stdout.flush()
        os._exit(_PREEMPTED_EXIT_CODE)

    previous = {
        number: signal.signal(number, handler) for number in (signal.SIGTERM, signal.SIGINT)
    }
    try:
        yield
    finally:
        for number, old in previous.items():
            signal.signal(number, old)


def _preempted() -> tuple[type[BaseException], ...]:
    """`t2t.trainer.loop.Preempted` once the trainer is loaded (`except` evaluates this when
    an exception arrives), so commands that never train do not import it."""
    loop = sys.modules.get("t2t.trainer.loop")
    return (loop.Preempted,) if loop is not None else ()


# A gs:// path in a flag or a gin binding (up to a quote, a comma, a bracket or a space).
_OBJECT_STORE_PATH = re.compile(r"gs://[^\s'\",\]\)}]+")


def _check_object_stores(arguments: list[str]) -> None:
    """Before a command starts: every bucket its flags and bindings name can be reached with
    this machine's credentials, or a StorageError (exit 2) says why within seconds, where the
    storage clients of TensorFlow and TensorStore would retry for minutes."""
    paths = _OBJECT_STORE_PATH.findall(" ".join(arguments))
    if paths:
        from t2t import files

        files.check_reachable(*paths)


def _store_failure(error: Exception) -> str | None:
    """An object store's failure that its client gave up on, in one line (or None)."""
    files = sys.modules.get("t2t.files")
    return None if files is None or isinstance(error, OSError) else files.store_failure(error)


def _stop_if_a_host_was_lost(command: str, error: Exception) -> None:
    """In a multi-host run, an error may be the sign of a lost peer (a collective's transport
    failing, an agreement timing out): the process then ends with the message naming the lost
    process and exit 76 (`t2t.hosts`), instead of reporting the symptom as a bug and waiting in
    JAX's shutdown for a peer that is gone."""
    hosts = sys.modules.get("t2t.hosts")
    if hosts is None:
        return
    if isinstance(error, hosts.HostLostError):
        hosts.exit_lost(f"t2t {command}: error: {terminal.error_message(error)}")
    if hosts.looks_like_a_lost_peer(error):
        hosts.wait_for_lost()  # ends the process itself when the watchdog finds a lost peer


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `t2t` console script."""
    # On GPUs, JAX's threefry random numbers as one CUDA kernel instead of unrolled XLA ops: the
    # same numbers, and on an H100 T5.1.1-base's parameter init took 15 s instead of 106 s
    # (benchmarks/README.md, GPU benchmark job 14). Read when JAX starts; no effect elsewhere.
    os.environ.setdefault("JAX_THREEFRY_GPU_KERNEL_LOWERING", "1")
    # TensorFlow only reads data and checkpoints here, it runs no model math; its oneDNN
    # kernels keep a memory pool that grows with the largest tensor a checkpoint reader passes
    # (docs/model.md, "Start from a released checkpoint"). Read when TensorFlow starts.
    os.environ.setdefault("TF_ENABLE_ONEDNN_OPTS", "0")
    _persistent_compilation_cache()
    argv = sys.argv[1:] if argv is None else list(argv)
    show_traceback = "--traceback" in argv or os.environ.get("T2T_TRACEBACK") == "1"
    verbose = "--verbose" in argv or os.environ.get("T2T_VERBOSE") == "1"
    argv = [a for a in argv if a not in ("--traceback", "--verbose")]
    argv, gin_bindings = split_gin_bindings(argv)
    args = build_parser().parse_args(argv)
    refusal = _refusal(args, gin_bindings)
    if refusal:
        print(f"t2t {args.command}: error: {refusal}", file=sys.stderr)
        return 2
    if not verbose:
        terminal.quiet_libraries()
    args.gin_bindings = gin_bindings
    # Each command configures gin anew; one run before it in this process (a notebook, the
    # Python API) left the configuration locked, and a module the command imports before
    # configuring (the study runner) could not register its configurables.
    if "gin" in sys.modules:
        sys.modules["gin"].clear_config()
    signals = (
        _stop_at_once_on_signals(args.command)
        if args.command in _TRAINING_COMMANDS
        else contextlib.nullcontext()
    )
    try:
        _check_object_stores(argv + gin_bindings)
        with signals:  # the trainer takes over while it trains (saves, then stops)
            code = args.handler(args)
    except _preempted() as stopped:  # SIGTERM / SIGINT: a checkpoint was saved, a clean stop
        print(f"t2t {args.command}: {terminal.error_message(stopped)}", file=sys.stderr)
        return _PREEMPTED_EXIT_CODE
    except KeyboardInterrupt:  # a second Ctrl-C
        print(
            f"t2t {args.command}: interrupted; nothing was saved after the last checkpoint "
            "reported saved.",
            file=sys.stderr,
        )
        return 130
    except Exception as error:  # noqa: BLE001 (sorted into bad input and bugs)
        return _failed(args.command, error, show_traceback)
    return code if isinstance(code, int) else 0


def _persistent_compilation_cache() -> None:
    """Keeps each compiled XLA program on disk, so that the next process (a resumed run, the
    next stage of a chain, the next run of a study) loads it instead of compiling it again.

    In `$T2T_COMPILATION_CACHE`, else `$T2T_CACHE_DIR/xla` (`~/.cache/t2t/xla`); `off` turns it
    off, and JAX's own `JAX_COMPILATION_CACHE_DIR` wins over both. Programs that compiled in
    under half a second are not kept. With `filelock` installed a local directory is held to
    4 GiB (least recently used first out) and read and written under its lock; a gs:// one
    (which outlives a preempted VM) is not limited. Read when JAX starts: a process that
    imported JAX before `main` (the Python API) gets no cache unless it sets JAX's options.
    """
    if "JAX_COMPILATION_CACHE_DIR" in os.environ:
        return
    chosen = os.environ.get("T2T_COMPILATION_CACHE", "")
    if chosen.lower() == "off":
        return
    root = os.path.expanduser(os.environ.get("T2T_CACHE_DIR", "~/.cache/t2t"))  # cache_root()
    directory = chosen or os.path.join(root, "xla")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = directory
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
    if "://" in directory:  # a bucket: JAX's size limit takes a lock file only a disk can hold
        os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = "-1"
    elif importlib.util.find_spec("filelock") is not None:
        os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))


def _refusal(args, gin_bindings: list[str]) -> str | None:
    """What is wrong with the command line that needs no library to see (None: nothing)."""
    if getattr(args, "precheck", None) is not None:
        from t2t.errors import UserError

        try:
            args.precheck(args)
        except UserError as error:
            return str(error)
    if gin_bindings and not hasattr(args, "gin_file"):
        return "this command takes no gin bindings"
    return None


def _failed(command: str, error: Exception, show_traceback: bool) -> int:
    """Says what went wrong and returns the exit status: 1 for a diverged run (what was kept,
    what next) and for a bug (with the stack), 2 for bad input and a store that gave up."""
    if isinstance(error, FloatingPointError):  # a diverged run (NonFiniteError)
        terminal.print_traceback(show_traceback)
        print(f"t2t {command}: error: {terminal.error_message(error)}", file=sys.stderr)
        return 1
    _stop_if_a_host_was_lost(command, error)
    failure = _store_failure(error)
    if failure is not None:  # the store gave up: a message, exit 2, nothing lost
        terminal.print_traceback(show_traceback)
        print(
            f"t2t {command}: error: the object store failed: {failure}. Every checkpoint "
            "reported saved is intact (a save the store broke off never counts); run the same "
            "command again to go on.",
            file=sys.stderr,
        )
        return 2
    if terminal.is_user_error(error):  # bad input: a message, not a traceback
        terminal.print_traceback(show_traceback)
        print(f"t2t {command}: error: {terminal.error_message(error)}", file=sys.stderr)
        return 2
    terminal.print_traceback(True)
    print(
        f"t2t {command}: internal error: {type(error).__name__}: "
        f"{terminal.error_message(error)}\nThis is a bug in t2t (or an input it failed to "
        "check); please report it with the command and the stack above.",
        file=sys.stderr,
    )
    return 1


# XLA's CPU client allocates each step's temporary buffer (470 MB for the tiny preset at 32 rows
# of 128 + 128 tokens) from a worker thread, where glibc maps every large block afresh and the
# kernel zeroes it 4 KiB at a time: 114,863 page faults, a quarter of the step on one core. On
# huge pages (transparent, 2 MiB) the same memory costs 401: benchmarks/cpu_huge_pages.py.
HUGE_PAGES = "glibc.malloc.hugetlb=1"  # glibc >= 2.35: madvise(MADV_HUGEPAGE) on its mappings


def _restart_on_huge_pages() -> None:
    """Runs this command again (the same process, `exec`) with glibc's allocator putting its
    large blocks on transparent huge pages, unless GLIBC_TUNABLES is already set (a value of
    one's own, even empty, is kept) or this is not Linux with glibc 2.35 or later. Only the
    console script does this; Python code embedding the CLI calls `main`."""
    import platform

    if sys.platform != "linux" or "GLIBC_TUNABLES" in os.environ or not sys.executable:
        return
    library, version = platform.libc_ver()
    if library != "glibc" or tuple(int(n) for n in version.split(".")[:2]) < (2, 35):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    environment = {**os.environ, "GLIBC_TUNABLES": HUGE_PAGES}
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], environment)


def console() -> None:
    """The `t2t` console script: `main` (in a process whose large allocations are on huge
    pages, `_restart_on_huge_pages`), then an exit during which SIGTERM/SIGINT end the process
    with the command's own status (the interpreter's shutdown after a training run can take
    seconds; a scheduler's SIGTERM then must not turn a finished run into a killed one)."""
    import signal

    _restart_on_huge_pages()
    code = main()

    def exit_now(signum, frame):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, exit_now)
    sys.exit(code)
