"""Test-session set-up shared by every test module.

Eight host CPU devices are requested before JAX initializes, so sharding tests can build real
meshes (2x4, 8x1) on a machine without accelerators. Tests that do not shard run on device 0.
The built-in corpus is built once per session (worker) into a temporary cache directory.
"""

import importlib
import os

import pytest

_DEVICE_FLAG = "--xla_force_host_platform_device_count=8"
if _DEVICE_FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _DEVICE_FLAG).strip()
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("JAX_PLATFORMS", "cpu")


@pytest.fixture(scope="session")
def builtin_corpus(tmp_path_factory):
    """The real built-in corpus (text, supervised tasks, vocabulary) in a temporary cache dir."""
    from t2t.data.builtin import cache

    return cache.get_or_build(str(tmp_path_factory.mktemp("t2t_cache")))


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


# Seconds each of the slowest test files takes on 2 cores (`pytest --durations`). Collecting them
# first lets `-n 2 --dist loadfile` start the long files early, so the two workers finish close
# together instead of one running a long file alone at the end.
_SLOW_FILES = {
    "tests/studies/test_study.py": 216,
    "tests/test_runs.py": 215,
    "tests/finetuning/test_runs.py": 200,
    "tests/nn/test_stacking.py": 198,
    "tests/test_reliability.py": 165,
    "tests/nn/test_attention_ops.py": 150,
    "tests/finetuning/test_chain.py": 144,
    "tests/test_sharding.py": 99,
    "tests/test_trainer.py": 93,
    "tests/test_aot.py": 76,
    "tests/data/test_tasks.py": 44,
    "tests/test_wheel.py": 41,
}


def pytest_collection_modifyitems(config, items):
    root = str(config.rootpath)

    def weight(item):
        path = os.path.relpath(str(item.path), root)
        return -_SLOW_FILES.get(path.replace(os.sep, "/"), 0)

    items.sort(key=weight)  # stable: the order within a file is kept
