"""The built-in corpus without its filter: the offline counterpart of the paper's unfiltered C4.

The built-in corpus keeps only the blocks of the documentation that read as prose and strips
their markup (`cleaning`), as C4's heuristics keep only the lines that read as natural language.
This variant keeps every block of the same sources as written: code samples, doctest sessions,
grammar rules, reStructuredText roles and rules, with each document's white space folded onto
one line (a corpus file holds one document per line). Only exact duplicates are dropped.

Each document goes to the split of the cleaned document made from the same text, so no text of
a validation document (where the benchmark draws its validation examples from) is in the
training split; a text without a cleaned document goes by its own hash. The vocabulary stays
the built-in one, trained on the cleaned corpus, as the paper kept one vocabulary for every
data set of its Table 8.

Files, built once beside the corpus: `<corpus>/unfiltered/<VERSION>/{train,validation}.txt` and
`stats.json` (documents, words, tokens and unknown tokens of the built-in vocabulary per split).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

from t2t.data.builtin import cache, cleaning, sources

VERSION = "v1"


def directory_of(corpus_directory: str) -> str:
    return os.path.join(corpus_directory, "unfiltered", VERSION)


def corpus_path(corpus_directory: str, split: str) -> str:
    if split not in cache.SPLITS:
        raise ValueError(f"The unfiltered corpus has splits {cache.SPLITS}, got {split!r}.")
    return os.path.join(directory_of(corpus_directory), f"{split}.txt")


def documents(topics, docstrings) -> dict[str, list[str]]:
    """split -> the unfiltered documents of pydoc `topics` and `docstrings` (see the module)."""
    pairs = [pair for _, text in topics for pair in cleaning.topic_document_pairs(text)]
    pairs += [(cleaning.document(d.text), " ".join(d.text.split())) for d in docstrings]
    return _by_split(pairs)


def _by_split(pairs: Iterable[tuple[str | None, str]]) -> dict[str, list[str]]:
    split = {name: [] for name in cache.SPLITS}
    seen = set()
    for document, text in pairs:
        if text and text not in seen:
            seen.add(text)
            split[cleaning.split_of(document or text)].append(text)
    return split


def get_or_build(corpus: cache.BuiltinCorpus) -> str:
    """Builds the unfiltered corpus beside `corpus` (once); returns its directory."""
    return cache.build_once(directory_of(corpus.directory), lambda staging: _build(corpus, staging))


def _build(corpus: cache.BuiltinCorpus, staging: str) -> None:
    import sentencepiece as spm

    built = documents(sources.pydoc_topics(), sources.stdlib_docstrings())
    processor = spm.SentencePieceProcessor(model_file=corpus.vocabulary_path)
    stats = {}
    for split, lines in built.items():
        with open(
            os.path.join(staging, f"{split}.txt"), "w", encoding="utf-8"
        ) as f:  # local path: corpus cache
            f.writelines(line + "\n" for line in lines)
        ids = [i for line in lines for i in processor.encode(line)]
        stats[f"corpus_{split}"] = {
            "documents": len(lines),
            "words": sum(len(line.split()) for line in lines),
            "tokens": len(ids),  # with the built-in vocabulary, trained on the cleaned corpus
            "unknown_tokens": sum(i == processor.unk_id() for i in ids),
        }
    with open(
        os.path.join(staging, "stats.json"), "w", encoding="utf-8"
    ) as f:  # local path: corpus cache
        json.dump(stats, f, indent=2, sort_keys=True)


def stats(corpus: cache.BuiltinCorpus) -> dict:
    with open(
        os.path.join(get_or_build(corpus), "stats.json"), encoding="utf-8"
    ) as f:  # local path: corpus cache
        return json.load(f)
