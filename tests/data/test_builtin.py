"""The built-in corpus: cleaning examples, split discipline, cache atomicity, no side effects."""

import os
import sys

import pytest

from t2t.data.builtin import benchmark, cache, cleaning, sources, unfiltered


def _lines(path):
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


def test_paragraphs_drop_code_and_markup():
    # Same numbers as the `paragraphs` docstring.
    text = "Return the sum.\n\n    >>> add(1, 2)\n    3\n\nSee :func:`sum` and ``math.fsum``."
    assert cleaning.paragraphs(text) == ["Return the sum.", "See sum and math.fsum."]
    grammar = 'Prose first.\n\n   assignment_stmt ::= (target_list "=")+ (expression)\n'
    assert cleaning.paragraphs(grammar) == ["Prose first."]
    bullets = "Rules:\n\n   * The first rule\n     continues here.\n"
    assert cleaning.paragraphs(bullets) == ["Rules:", "The first rule continues here."]


def test_summary_example():
    body = "Both arguments must be numbers; the result has the type that the usual arithmetic rules give them."
    docstring = sources.Docstring("m", "add", f"Return the sum of a and b.\n\n{body}")
    assert cleaning.summary_example(docstring) == (body, "Return the sum of a and b.")
    assert cleaning.summary_example(sources.Docstring("m", "f", "No body here.")) is None


def test_topic_pairs_keep_every_block_beside_the_cleaned_documents():
    prose = " ".join(["word"] * 12) + "."
    topic = f"{prose}\n\n    >>> f(1)\n    2\n\n{prose} :func:`g`\n\n    x = [1, 2]\n"
    pairs = cleaning.topic_document_pairs(topic, target_words=10)
    assert [d for d, _ in pairs] == cleaning.topic_documents(topic, target_words=10)
    assert pairs == [
        (prose, prose),
        (f"{prose} g", f">>> f(1) 2 {prose} :func:`g` x = [1, 2]"),  # trailing code joins the last
    ]
    assert cleaning.topic_document_pairs("    x = 1\n") == [(None, "x = 1")]


def test_unfiltered_documents_keep_code_and_take_the_cleaned_split():
    prose = "Return the sum of the two numbers given, as the usual arithmetic rules say."
    docstrings = [
        sources.Docstring("m", "add", f"{prose}\n\n    >>> add(1, 2)\n    3"),
        sources.Docstring("m", "f", "x = [1, 2]"),  # no prose: split by its own hash
        sources.Docstring("m", "g", f"{prose}\n\n    >>> add(1, 2)\n    3"),  # a duplicate
    ]
    split = unfiltered.documents([], docstrings)
    raw = f"{prose} >>> add(1, 2) 3"
    assert split[cleaning.split_of(prose)] == [raw] + (
        ["x = [1, 2]"] if cleaning.split_of("x = [1, 2]") == cleaning.split_of(prose) else []
    )
    assert sum(len(documents) for documents in split.values()) == 2


def test_unfiltered_corpus_adds_the_filtered_text_and_leaks_no_validation(builtin_corpus):
    unfiltered.get_or_build(builtin_corpus)
    directory = builtin_corpus.directory
    stats, cleaned = unfiltered.stats(builtin_corpus), builtin_corpus.stats
    train = _lines(unfiltered.corpus_path(directory, "train"))
    assert stats["corpus_train"]["documents"] == len(train) == len(set(train))
    assert stats["corpus_train"]["words"] > 1.1 * cleaned["corpus_train"]["words"]
    assert stats["corpus_train"]["tokens"] > 1.1 * cleaned["corpus_train"]["tokens"]
    assert 0 < stats["corpus_train"]["unknown_tokens"] < 0.05 * stats["corpus_train"]["tokens"]
    assert any(">>>" in d for d in train) and any(":func:`" in d for d in train)
    # The benchmark's validation sentences are in the unfiltered training split no more often
    # than in the cleaned one (where a few recur in other documents): nothing leaks.
    order = benchmark.task_path(directory, "order", "validation")
    benchmark.get_or_build(builtin_corpus)
    sentences = [r.split("\t")[0] for r in _lines(order) if r.endswith("\tacceptable")]
    cleaned_train, unfiltered_train = (
        " ".join(_lines(builtin_corpus.corpus_path("train"))),
        " ".join(train),
    )
    seen = {
        name: sum(s in text for s in sentences)
        for name, text in [("cleaned", cleaned_train), ("unfiltered", unfiltered_train)]
    }
    assert len(sentences) > 200 and seen["unfiltered"] <= seen["cleaned"] < 0.15 * len(sentences)


def test_corpus_numbers_are_consistent(builtin_corpus):
    stats = builtin_corpus.stats
    train, validation = (_lines(builtin_corpus.corpus_path(s)) for s in ("train", "validation"))
    assert stats["corpus_train"]["documents"] == len(train) > 4000
    assert stats["corpus_validation"]["documents"] == len(validation)
    assert 0.06 < len(validation) / (len(train) + len(validation)) < 0.14
    assert stats["corpus_train"]["words"] == sum(len(d.split()) for d in train) > 150_000
    assert stats["corpus_train"]["tokens"] > stats["corpus_train"]["words"]
    documents = train + validation
    assert len(set(documents)) == len(documents), "documents are deduplicated"
    assert all(len(d.split()) >= cleaning.MIN_DOCUMENT_WORDS for d in documents)
    assert not [d for d in documents if ">>>" in d or "  " in d or "\t" in d]


def test_supervised_examples_follow_their_documents_split(builtin_corpus):
    validation_text = " ".join(_lines(builtin_corpus.corpus_path("validation")))
    rows = _lines(builtin_corpus.summarize_path("validation"))
    assert len(rows) == builtin_corpus.stats["summarize_validation"]["examples"] > 50
    for row in rows:
        body, summary = row.split("\t")
        assert f"{summary} {body}" in validation_text  # never seen in pretraining's train split
    labels = builtin_corpus.stats["package_labels"]
    assert len(labels) >= 10
    for split in cache.SPLITS:
        package_rows = [row.split("\t") for row in _lines(builtin_corpus.package_path(split))]
        assert {label for _, label in package_rows} <= set(labels)
        assert all(cleaning.split_of(text) == split for text, _ in package_rows)


def test_reading_sources_imports_nothing_with_side_effects(builtin_corpus):
    del builtin_corpus  # built in this process: the stdlib walk has run
    for module in (
        "tkinter",
        "turtle",
        "antigravity",
        "idlelib",
        "smtpd",
        "asyncio.windows_events",
    ):
        assert module not in sys.modules


def test_cache_is_reused_without_rebuilding(builtin_corpus, monkeypatch):
    monkeypatch.setattr(cache, "_build_into", lambda *a: pytest.fail("rebuilt an existing cache"))
    root = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    assert cache.get_or_build(root).directory == builtin_corpus.directory


def test_crash_leaves_no_partial_cache(tmp_path, monkeypatch):
    def crash(documents, path, **kwargs):
        raise KeyboardInterrupt  # the process dies while training the vocabulary

    monkeypatch.setattr(cache.vocab, "train_sentencepiece", crash)
    monkeypatch.setattr(cache.sources, "stdlib_docstrings", lambda: iter([]))  # quicker
    with pytest.raises(KeyboardInterrupt):
        cache.get_or_build(str(tmp_path))
    assert os.listdir(tmp_path / "builtin") == []  # neither the target nor a staging dir


def test_cache_dir_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("T2T_CACHE_DIR", str(tmp_path))
    assert cache.corpus_directory().startswith(str(tmp_path))
    with pytest.raises(ValueError, match="splits"):
        cache.BuiltinCorpus("x").corpus_path("test")


def test_registering_reads_nothing_and_first_use_builds(
    builtin_tasks, builtin_corpus, tmp_path, monkeypatch
):
    """Importing `t2t.data.tasks.builtin` only registers: the corpus is built (here: the session's
    corpus stands in for the build) when a task is first counted or read, or its vocabulary used."""
    import seqio

    from t2t.data.tasks import builtin

    session_root = os.path.dirname(os.path.dirname(builtin_corpus.directory))
    builds = []

    def build(root, **kwargs):
        builds.append(root)
        return builtin_corpus

    monkeypatch.setattr(cache, "get_or_build", build)
    try:
        builtin.register(str(tmp_path))
        assert builds == [] and os.listdir(tmp_path) == []
        task = seqio.get_mixture_or_task("builtin_package")
        assert (
            task.num_input_examples("validation")
            == builtin_corpus.stats["package_validation"]["examples"]
        )
        assert builds == [str(tmp_path)]
        vocabulary = task.output_features["targets"].vocabulary
        assert vocabulary.sentencepiece_model_file == builtin_corpus.vocabulary_path
        assert builds == [str(tmp_path)] * 2
    finally:
        monkeypatch.undo()
        builtin.register(session_root)  # the other tests' tasks read the session's corpus
