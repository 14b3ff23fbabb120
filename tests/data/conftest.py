"""Fixtures shared by the data tests: the built-in corpus, built once per test session."""

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
