"""A small GLUE-shaped benchmark made from the built-in corpus, for studies without downloads.

Each task is built deterministically from the corpus's documents (one per line, split into
sentences by a rule: a terminal mark, white space, an upper-case letter or a digit), within the
corpus split, so no validation sentence was seen in pretraining's training split. Files:
`<corpus>/benchmark/<task>/{train,validation}.tsv` (input fields, then the label) and
`benchmark/stats.json`; built once, atomically, beside the corpus cache.

| task | shape (GLUE analogue) | example | label |
|---|---|---|---|
| `order` | one sentence, acceptability (CoLA) | a sentence, or the same with two words swapped | `acceptable` / `unacceptable` |
| `next` | sentence pair, large (MNLI) | sentence A, then the sentence after it or one from another document | `next` / `other` |
| `same_document` | sentence pair, small (RTE), <= 1k training examples | two sentences of one document (not adjacent), or of two documents | `same` / `different` |
| `similarity` | sentence pair, regression (STS-B) | a sentence and a copy with some words replaced by words of other sentences | 5 x the share of words kept, to 0.2 |

`next` and `same_document` are the pair for intermediate training: both ask whether two
sentences belong together, `next` with 7,000+ training examples, `same_document` with 800.
Pretraining should help every task: word order (`order`), topical and discourse coherence
(`next`, `same_document`) and which words fit a context (`similarity`) are what a denoising
objective on this prose learns, while the labeled sets are small.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import tempfile

TASKS = ("order", "next", "same_document", "similarity")
SPLITS = ("train", "validation")
# Examples per split (the corpus gives a few more; the first ones in a fixed shuffle are kept).
SIZES = {
    "order": {"train": 6000, "validation": 600},
    "next": {"train": 8000, "validation": 600},
    "same_document": {"train": 800, "validation": 400},
    "similarity": {"train": 6000, "validation": 600},
}
FIELDS = {"order": ("sentence",), "next": ("sentence1", "sentence2"),
          "same_document": ("sentence1", "sentence2"),
          "similarity": ("sentence1", "sentence2")}
LABELS = {"order": ("acceptable", "unacceptable"), "next": ("next", "other"),
          "same_document": ("same", "different")}
MIN_WORDS, MAX_WORDS = 6, 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
VERSION = "v2"


def split_sentences(document: str) -> list[str]:
    """Every sentence of the document, in order."""
    return [s for s in (part.strip() for part in _SENTENCE_END.split(document)) if s]


def usable(sentence: str) -> bool:
    return MIN_WORDS <= len(sentence.split()) <= MAX_WORDS and "\t" not in sentence


def sentences(document: str) -> list[str]:
    """The document's sentences of MIN_WORDS to MAX_WORDS words.

    Example: "Open a file. It returns a file object for the given path name. Ok." -> ["It
    returns a file object for the given path name."] (the others are too short).
    """
    return [s for s in split_sentences(document) if usable(s)]


def swap_two_words(sentence: str, rng: random.Random) -> str:
    """The sentence with two distinct words at different positions exchanged."""
    words = sentence.split()
    for _ in range(20):
        i, j = sorted(rng.sample(range(len(words)), 2))
        if words[i] != words[j]:
            words[i], words[j] = words[j], words[i]
            return " ".join(words)
    return sentence


def _documents(path: str) -> list[list[str]]:
    """Every document's sentences (all of them: `next` needs true neighbours)."""
    with open(path, encoding="utf-8") as f:
        return [s for s in (split_sentences(line) for line in f) if s]


def _order(docs, rng) -> list[tuple[str, ...]]:
    rows = []
    for sentence in (s for doc in docs for s in doc if usable(s)):
        if rng.random() < 0.5:
            rows.append((sentence, "acceptable"))
        else:
            swapped = swap_two_words(sentence, rng)
            rows.append((swapped, "unacceptable" if swapped != sentence else "acceptable"))
    return rows


def _pairs_of_documents(docs, rng, positive) -> list[tuple[str, ...]]:
    """(first, second, label): a positive pair from `positive(doc)` or a pair across
    documents, half each."""
    rows = []
    multi = [d for d in docs if sum(map(usable, d)) > 1]
    for index, doc in enumerate(multi):
        pairs = positive(doc)
        for first, second in pairs:
            if rng.random() < 0.5:
                rows.append((first, second, True))
            else:
                other = multi[(index + rng.randrange(1, len(multi))) % len(multi)]
                rows.append((first, rng.choice([s for s in other if usable(s)]), False))
    return rows


def _next(docs, rng):
    def adjacent(doc):  # neighbours in the text, both usable
        return [(a, b) for a, b in zip(doc, doc[1:]) if usable(a) and usable(b)]

    return [(a, b, "next" if yes else "other")
            for a, b, yes in _pairs_of_documents(docs, rng, adjacent)]


def _same_document(docs, rng):
    def apart(doc):  # one pair per document, two or more usable sentences apart
        doc = [s for s in doc if usable(s)]
        if len(doc) < 3:
            return []
        i = rng.randrange(len(doc) - 2)
        return [(doc[i], doc[rng.randrange(i + 2, len(doc))])]

    return [(a, b, "same" if yes else "different")
            for a, b, yes in _pairs_of_documents(docs, rng, apart)]


def _similarity(docs, rng):
    all_words = [w for doc in docs for s in doc if usable(s) for w in s.split()]
    rows = []
    for sentence in (s for doc in docs for s in doc if usable(s)):
        words = sentence.split()
        kept = rng.randint(0, 5) / 5  # 0, 0.2, ..., 1 of the words kept
        replaced = set(rng.sample(range(len(words)), round(len(words) * (1 - kept))))
        copy = [rng.choice(all_words) if i in replaced else w for i, w in enumerate(words)]
        score = 5 * (len(words) - len(replaced)) / len(words)
        rows.append((sentence, " ".join(copy), f"{round(score * 5) / 5:.1f}"))
    return rows


_BUILDERS = {"order": _order, "next": _next, "same_document": _same_document,
             "similarity": _similarity}


def directory_of(corpus_directory: str) -> str:
    return os.path.join(corpus_directory, "benchmark", VERSION)


def task_path(corpus_directory: str, task: str, split: str) -> str:
    return os.path.join(directory_of(corpus_directory), task, f"{split}.tsv")


def get_or_build(corpus) -> str:
    """Builds the benchmark's files beside the corpus (once); returns their directory."""
    directory = directory_of(corpus.directory)
    if os.path.exists(os.path.join(directory, "stats.json")):
        return directory
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    staging = tempfile.mkdtemp(dir=os.path.dirname(directory), prefix=".building-")
    try:
        stats = {}
        for split in SPLITS:
            docs = _documents(corpus.corpus_path(split))
            for task in TASKS:
                rng = random.Random(f"{task}-{split}")
                rows = _BUILDERS[task](docs, rng)
                rng.shuffle(rows)
                rows = rows[:SIZES[task][split]]
                path = os.path.join(staging, task, f"{split}.tsv")
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as f:
                    f.writelines("\t".join(row) + "\n" for row in rows)
                stats[f"{task}_{split}"] = {"examples": len(rows),
                                            "labels": _label_counts(rows)}
        with open(os.path.join(staging, "stats.json"), "w", encoding="utf-8") as f:
            json.dump(stats, f, indent=2, sort_keys=True)
        try:
            os.rename(staging, directory)
        except OSError:
            if not os.path.exists(os.path.join(directory, "stats.json")):
                raise
    finally:
        if os.path.exists(staging):
            shutil.rmtree(staging)
    return directory


def _label_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[-1]] = counts.get(row[-1], 0) + 1
    return dict(sorted(counts.items()))


def stats(corpus) -> dict:
    with open(os.path.join(get_or_build(corpus), "stats.json"), encoding="utf-8") as f:
        return json.load(f)
