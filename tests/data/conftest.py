"""Fixtures shared by the data tests: the built-in corpus, built once per test session."""

import importlib
import os

import pytest

from t2t.data.builtin import cache


@pytest.fixture(scope="session")
def builtin_corpus(tmp_path_factory):
    """The real built-in corpus (text, supervised tasks, vocabulary) in a temporary cache dir."""
    return cache.get_or_build(str(tmp_path_factory.mktemp("t2t_cache")))


@pytest.fixture(scope="session")
def builtin_vocabulary(builtin_corpus):
    from t2t.data import vocab

    return vocab.load_vocabulary(builtin_corpus.vocabulary_path)


@pytest.fixture(scope="session")
def builtin_tasks(builtin_corpus):
    """Registers the built-in tasks on the session's corpus; returns their names."""
    root = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    os.environ["T2T_CACHE_DIR"] = root  # importing the module builds into (here: finds) the cache
    module = importlib.import_module("t2t.data.tasks.builtin")
    return module.register(root)
