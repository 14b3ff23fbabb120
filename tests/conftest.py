"""Test-session set-up shared by every test module.

Eight host CPU devices are requested before JAX initializes, so sharding tests can build real
meshes (2x4, 8x1) on a machine without accelerators. Tests that do not shard run on device 0.
The built-in corpus is built once per session, shared by the workers, in a temporary directory.
"""

import collections
import importlib
import importlib.util
import json
import os
import shutil
import tempfile

import pytest

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
# LLVM's optimizations off in the CPU code XLA generates: the suite's networks are so small that
# compiling costs more than running (on 2 cores the stacking, trainer and training-run files
# took 253 s of CPU instead of 323 s). XLA's own passes over the program, its buffers and its
# cost analysis are untouched; only the machine code is less optimized. Every process a test
# starts inherits it. `make demo` and the benchmarks compile as users do.
_CODEGEN_FLAG = "--xla_backend_optimization_level=0"  # unless XLA_FLAGS sets the level
for _flag, _unless in ((_DEVICE_FLAG, _DEVICE_FLAG), (_CODEGEN_FLAG, _CODEGEN_FLAG[:-2])):
    if _unless not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

# One persistent XLA compilation cache per test session, shared by the xdist workers and by the
# training runs tests start as subprocesses (they inherit the environment): the tiny models'
# train and eval steps then compile once per session instead of once per process (the suite
# starts a few hundred such processes). The controller, which imports this file before it
# starts the workers, makes the directory; it is new each session and removed at its end, so
# no executable outlives the code that compiled it. A size limit turns on JAX's file lock around
# reads and writes, so a worker never reads an entry another one is still writing.
_CACHE_OWNER = "JAX_COMPILATION_CACHE_DIR" not in os.environ
if _CACHE_OWNER:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="t2t-tests-xla-cache-")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")
    if importlib.util.find_spec("filelock") is not None:
        os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))


# The built-in corpus, likewise once per test session: the controller names the directory, the
# first worker to need it builds it (about 12 s of CPU) under a lock, the others read it.
if "T2T_TEST_CORPUS_DIR" not in os.environ:
    os.environ["T2T_TEST_CORPUS_DIR"] = tempfile.mkdtemp(prefix="t2t-tests-corpus-")
    _CORPUS_OWNER = True
else:
    _CORPUS_OWNER = False


@pytest.fixture(scope="session")
def builtin_corpus():
    """The real built-in corpus (text, supervised tasks, vocabulary) in the session's cache dir,
    with the benchmark and the unfiltered corpus built beside it (once, not once per worker)."""
    import fcntl

    from t2t.data.builtin import benchmark, cache, unfiltered

    root = os.environ["T2T_TEST_CORPUS_DIR"]
    with open(os.path.join(root, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        corpus = cache.get_or_build(root)
        benchmark.get_or_build(corpus)
        unfiltered.get_or_build(corpus)
        return corpus


@pytest.fixture(scope="session")
def straight_micro_run(builtin_tasks):
    """The suite's shrunk run (tests/micro_run.py), 9 steps uninterrupted on a local disk,
    trained once per session and shared by the workers: a reference to copy, never to change."""
    import pathlib

    return pathlib.Path(micro_run().straight(os.environ["T2T_TEST_CORPUS_DIR"]))


def micro_run():
    """tests/micro_run.py (test modules import it as `from .. import micro_run`)."""
    import sys

    module = sys.modules.get("tests.micro_run")
    if module is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "micro_run.py")
        spec = importlib.util.spec_from_file_location("tests.micro_run", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["tests.micro_run"] = module
    return module


@pytest.fixture(scope="session")
def builtin_vocabulary(builtin_corpus):
    from t2t.data import vocab

    return vocab.load_vocabulary(builtin_corpus.vocabulary_path)


@pytest.fixture(scope="session")
def builtin_tasks(builtin_corpus):
    """Registers the built-in tasks on the session's corpus; returns their names."""
    root = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    os.environ["T2T_CACHE_DIR"] = root  # the tasks read (here: find) the corpus in this cache
    module = importlib.import_module("t2t.data.tasks.builtin")
    return module.register(root)


@pytest.fixture(autouse=True)
def _default_vocabulary_back_to_the_environment():
    """A run that used a checkpoint's own tokenizer (`t2t.runs.use_carried_vocabulary`) changes
    the process-wide default vocabulary; each test starts from `$T2T_VOCABULARY` again."""
    yield
    from t2t.data import vocab

    vocab.set_default_vocabulary(None)


# Seconds each test file took in the last recorded run on 2 cores (setup, call and teardown of
# its tests), written by `make test-durations` (`--record-durations=tests/durations.json`), not
# by hand. Collecting the longest files first lets `-n 4 --dist loadfile` start them early, so
# the workers finish close together instead of one running a long file alone at the end.
_DURATIONS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "durations.json")


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        metavar="PATH",
        help="write each test file's total seconds to PATH (JSON) at the end of the session",
    )


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0].replace(os.sep, "/")


def file_durations(path: str = _DURATIONS) -> dict[str, float]:
    """{test file: seconds} of the last recorded run; empty when none was recorded."""
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)["seconds"]


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)
    seconds = file_durations()

    def weight(item):
        path = os.path.relpath(str(item.path), root)
        return -seconds.get(path.replace(os.sep, "/"), 0.0)

    items.sort(key=weight)  # stable: the order within a file is kept


class _DurationRecorder:
    """Adds up each test file's setup, call and teardown times (on the xdist controller, which
    sees every worker's reports) and writes them when the session ends."""

    def __init__(self, path: str):
        self.path, self.seconds = path, collections.defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[_file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session, exitstatus):
        ranked = dict(sorted(self.seconds.items(), key=lambda kv: -kv[1]))
        with open(self.path, "w") as f:
            json.dump(
                {
                    "command": "make test-durations",
                    "seconds": {name: round(value, 1) for name, value in ranked.items()},
                },
                f,
                indent=1,
            )
            f.write("\n")


def pytest_configure(config):
    path = config.getoption("--record-durations")
    if path and not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        config.pluginmanager.register(_DurationRecorder(path), "t2t-duration-recorder")


def pytest_unconfigure(config):
    if _CACHE_OWNER and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["JAX_COMPILATION_CACHE_DIR"], ignore_errors=True)
    if _CORPUS_OWNER and not hasattr(config, "workerinput"):
        shutil.rmtree(os.environ["T2T_TEST_CORPUS_DIR"], ignore_errors=True)
