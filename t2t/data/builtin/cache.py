"""Builds the built-in corpus, its supervised tasks and its vocabulary once, into a cache dir.

Layout under `<cache>/builtin/<version>-py<major><minor>/` (the stdlib differs per Python):

  corpus/{train,validation}.txt     one prose document per line (pretraining)
  summarize/{train,validation}.tsv  body <TAB> summary line (docstring summarization)
  package/{train,validation}.tsv    docstring <TAB> top-level package (classification)
  spm/builtin.model                 SentencePiece unigram model trained on corpus/train.txt
  stats.json                        documents, words and tokens per split; labels

Everything is written into a temporary sibling directory that is renamed into place only when
complete, so a crash never leaves a half-written cache, and concurrent builders (test workers)
cannot corrupt each other: the first rename wins and the others discard their copy.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable

from t2t.data import vocab
from t2t.data.builtin import cleaning, sources

CACHE_VERSION = "v1"
# NOTE: ~240k words of text support a few thousand unigram pieces. 1,948 pieces + 100 sentinels
# = 2,048 ids (a multiple of 128: no embedding padding). Measured on the validation split:
# 948 pieces -> 2.05 tokens/word, 1,948 -> 1.70, 3,996 -> 1.50, 7,996 -> 1.40. Past ~2k pieces
# the softmax and embedding of the tiny CPU demo model grow faster than sequences shrink, and a
# 5-minute run sees rare pieces too seldom to learn them.
DEFAULT_NUM_PIECES = 1948
MIN_PACKAGE_DOCSTRINGS = 50
SPLITS = ("train", "validation")


def cache_root() -> str:
    """`$T2T_CACHE_DIR`, or `~/.cache/t2t`."""
    return os.path.expanduser(os.environ.get("T2T_CACHE_DIR", "~/.cache/t2t"))


@dataclasses.dataclass(frozen=True)
class BuiltinCorpus:
    """Paths of a built cache directory (see the module docstring for its layout)."""

    directory: str

    def corpus_path(self, split: str) -> str:
        return os.path.join(self.directory, "corpus", f"{_check_split(split)}.txt")

    def summarize_path(self, split: str) -> str:
        return os.path.join(self.directory, "summarize", f"{_check_split(split)}.tsv")

    def package_path(self, split: str) -> str:
        return os.path.join(self.directory, "package", f"{_check_split(split)}.tsv")

    @property
    def vocabulary_path(self) -> str:
        return os.path.join(self.directory, "spm", "builtin.model")

    @property
    def stats(self) -> dict:
        with open(
            os.path.join(self.directory, "stats.json"), encoding="utf-8"
        ) as f:  # local path: corpus cache
            return json.load(f)


def build_once(directory: str, build: Callable[[str], None]) -> str:
    """`directory`, built first if it holds no stats.json: `build(staging)` writes everything
    (stats.json last) into a temporary sibling that is renamed into place when complete, so a
    crash leaves nothing half-written and concurrent builders keep the first complete copy."""
    done = os.path.join(directory, "stats.json")
    if os.path.exists(done):  # local path: corpus cache
        return directory
    os.makedirs(os.path.dirname(directory), exist_ok=True)  # local path: corpus cache
    staging = tempfile.mkdtemp(dir=os.path.dirname(directory), prefix=".building-")
    try:
        build(staging)
        try:
            os.rename(staging, directory)  # local path: corpus cache
        except OSError:
            if not os.path.exists(done):  # local path: corpus cache
                raise
    finally:
        if os.path.exists(staging):  # local path: corpus cache
            shutil.rmtree(staging)  # local path: corpus cache
    return directory


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise ValueError(f"The built-in corpus has splits {SPLITS}, got {split!r}.")
    return split


def corpus_directory(cache_dir: str | None = None) -> str:
    """Where the built-in corpus of this Python lives under `cache_dir` (default `cache_root()`)."""
    tag = f"{CACHE_VERSION}-py{sys.version_info.major}{sys.version_info.minor}"
    return os.path.join(cache_dir or cache_root(), "builtin", tag)


def get_or_build(
    cache_dir: str | None = None,
    *,
    num_pieces: int = DEFAULT_NUM_PIECES,
    report: Callable[[str], None] | None = None,
) -> BuiltinCorpus:
    """Returns the cached built-in corpus, building it first if it is not there.

    Args:
      cache_dir: cache root (default `$T2T_CACHE_DIR` or `~/.cache/t2t`).
      num_pieces: SentencePiece pieces of the vocabulary (the seqio vocabulary adds 100).
      report: called with a line of progress per stage (e.g. `print`); None is silent.
    """
    directory = corpus_directory(cache_dir)
    if "://" in directory:
        raise ValueError(
            f"The built-in corpus is cached on a local disk, not in {directory}: give "
            "--cache_dir (or $T2T_CACHE_DIR) a local directory. Each host builds the same "
            "corpus (about 10 s); a model directory, data and caches of tasks may be on gs://."
        )
    if os.path.exists(os.path.join(directory, "stats.json")):  # local path: corpus cache
        return BuiltinCorpus(directory)
    report = report or (lambda line: None)
    parent = os.path.dirname(directory)
    os.makedirs(parent, exist_ok=True)  # local path: corpus cache
    staging = tempfile.mkdtemp(dir=parent, prefix=".building-")
    try:
        _build_into(staging, num_pieces, report)
        try:
            os.rename(staging, directory)  # local path: corpus cache
        except OSError:
            if not os.path.exists(
                os.path.join(directory, "stats.json")
            ):  # local path: corpus cache
                raise
            report(f"another process built {directory} first; using it")
    finally:
        if os.path.exists(staging):  # local path: corpus cache
            shutil.rmtree(staging)  # local path: corpus cache
    report(f"built-in corpus ready in {directory}")
    return BuiltinCorpus(directory)


def _build_into(directory: str, num_pieces: int, report: Callable[[str], None]) -> None:
    report(
        "reading pydoc topics and standard-library docstrings (parsed with ast, nothing imported)"
    )
    topics = sources.pydoc_topics()
    docstrings = list(sources.stdlib_docstrings())
    report(f"read {len(topics)} topics and {len(docstrings)} docstrings; cleaning")
    documents = _corpus_documents(topics, docstrings)
    corpus = BuiltinCorpus(directory)
    for split in SPLITS:
        _write_lines(corpus.corpus_path(split), documents[split])
        _write_lines(corpus.summarize_path(split), _summarize_rows(docstrings, split))
    labels = _package_labels(docstrings)
    for split in SPLITS:
        _write_lines(corpus.package_path(split), _package_rows(docstrings, labels, split))
    train_words = sum(len(d.split()) for d in documents["train"])
    report(f"training a {num_pieces}-piece SentencePiece model on {train_words} words")
    vocab.train_sentencepiece(documents["train"], corpus.vocabulary_path, num_pieces=num_pieces)
    report("counting tokens")
    stats = _statistics(corpus, labels, num_pieces)
    with open(
        os.path.join(directory, "stats.json"), "w", encoding="utf-8"
    ) as f:  # local path: corpus cache
        json.dump(stats, f, indent=2, sort_keys=True)


def _corpus_documents(topics, docstrings) -> dict[str, list[str]]:
    texts = [d for _, text in topics for d in cleaning.topic_documents(text)]
    texts += [cleaning.document(d.text) for d in docstrings]
    documents = {split: [] for split in SPLITS}
    for text in cleaning.deduplicate(t for t in texts if t):
        documents[cleaning.split_of(text)].append(text)
    return documents


def _docstring_split(docstring: sources.Docstring) -> str | None:
    text = cleaning.document(docstring.text)
    return cleaning.split_of(text) if text else None


def _summarize_rows(docstrings, split: str) -> list[str]:
    rows = []
    for docstring in docstrings:
        example = cleaning.summary_example(docstring)
        if example and _docstring_split(docstring) == split:
            rows.append("\t".join(example))
    return list(cleaning.deduplicate(rows))


def _package_labels(docstrings) -> list[str]:
    """Top-level public packages with at least MIN_PACKAGE_DOCSTRINGS prose docstrings."""
    counts = collections.Counter(
        d.package for d in docstrings if cleaning.document(d.text) and not d.package.startswith("_")
    )
    return sorted(p for p, n in counts.items() if n >= MIN_PACKAGE_DOCSTRINGS)


def _package_rows(docstrings, labels: list[str], split: str) -> list[str]:
    rows, seen = [], set()
    for docstring in docstrings:
        text = cleaning.document(docstring.text)
        if text and docstring.package in labels and cleaning.split_of(text) == split:
            if text not in seen:  # the same text under two packages keeps its first label
                seen.add(text)
                rows.append(f"{text}\t{docstring.package}")
    return rows


def _write_lines(path: str, lines: list[str]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)  # local path: corpus cache
    with open(path, "w", encoding="utf-8") as f:  # local path: corpus cache
        for line in lines:
            assert "\n" not in line, "documents are single lines"
            f.write(line + "\n")


def _statistics(corpus: BuiltinCorpus, labels: list[str], num_pieces: int) -> dict:
    import sentencepiece as spm

    processor = spm.SentencePieceProcessor(model_file=corpus.vocabulary_path)
    stats = {
        "num_pieces": num_pieces,
        "vocab_size": num_pieces + vocab.NUM_SENTINELS,
        "package_labels": labels,
        "python": sys.version.split()[0],
    }
    for split in SPLITS:
        with open(corpus.corpus_path(split), encoding="utf-8") as f:  # local path: corpus cache
            lines = f.read().splitlines()
        stats[f"corpus_{split}"] = {
            "documents": len(lines),
            "words": sum(len(line.split()) for line in lines),
            "tokens": sum(len(ids) for ids in processor.encode(lines)),
        }
        for task, path in (("summarize", corpus.summarize_path), ("package", corpus.package_path)):
            with open(path(split), encoding="utf-8") as f:  # local path: corpus cache
                stats[f"{task}_{split}"] = {"examples": sum(1 for _ in f)}
    return stats
