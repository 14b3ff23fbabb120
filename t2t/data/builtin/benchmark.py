"""A small GLUE-shaped benchmark made from the built-in corpus, for studies without downloads.

Each task is built deterministically from the corpus's documents (one per line, split into
sentences by a rule: a terminal mark, white space, an upper-case letter or a digit), within the
corpus split, so no validation sentence was seen in pretraining's training split. Files:
`<corpus>/benchmark/<task>/{train,validation}.tsv` (input fields, then the label) and
`benchmark/stats.json`; built once, atomically, beside the corpus cache.

| task | shape (GLUE analogue) | example | label |
|---|---|---|---|
| `order` | one sentence, acceptability (CoLA) | a sentence, or the same words in a random order | `acceptable` / `unacceptable` |
| `next` | sentence pair, large (MNLI) | a sentence's first words, then its own last words or the last words of a sentence of another document | `next` / `other` |
| `next_in_document` | sentence pair, small (RTE), <= 1k training examples | the same, the other sentence taken from the same document | `next` / `other` |
| `similarity` | sentence pair, regression (STS-B) | a sentence and a copy with some words replaced by words of other sentences | 5 x the share of words kept, to 0.2 |

`next` and `next_in_document` are the pair for intermediate training: one decision (does this
ending continue this beginning?), `next` with 8,000 training examples, where a change of topic
also gives the answer away, and `next_in_document` with 800, where only grammar and sense do.
Each sentence is cut at a random word boundary, three or more words on each side. Pretraining
should help every task: word order (`order`), how a sentence goes on (`next`,
`next_in_document`) and which words fit a context (`similarity`) are what a denoising objective
on this prose learns, while the labeled sets are small.
"""

from __future__ import annotations

import json
import os
import random
import re

from t2t.data.builtin import cache

TASKS = ("order", "next", "next_in_document", "similarity")
SPLITS = ("train", "validation")
# Examples per split (the corpus gives a few more; the first ones in a fixed shuffle are kept).
SIZES = {
    "order": {"train": 6000, "validation": 600},
    "next": {"train": 8000, "validation": 600},
    "next_in_document": {"train": 800, "validation": 400},
    "similarity": {"train": 6000, "validation": 600},
}
FIELDS = {
    "order": ("sentence",),
    "next": ("sentence1", "sentence2"),
    "next_in_document": ("sentence1", "sentence2"),
    "similarity": ("sentence1", "sentence2"),
}
LABELS = {
    "order": ("acceptable", "unacceptable"),
    "next": ("next", "other"),
    "next_in_document": ("next", "other"),
}
MIN_WORDS, MAX_WORDS = 6, 40
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")
VERSION = "v4"


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


def shuffle_words(sentence: str, rng: random.Random) -> str:
    """The sentence's words in a random order different from the original (if there is one)."""
    words = sentence.split()
    for _ in range(20):
        shuffled = rng.sample(words, len(words))
        if shuffled != words:
            return " ".join(shuffled)
    return sentence


def _documents(path: str) -> list[list[str]]:
    """Every document's sentences, in order."""
    with open(path, encoding="utf-8") as f:  # local path: corpus cache
        return [s for s in (split_sentences(line) for line in f) if s]


def _order(docs, rng) -> list[tuple[str, ...]]:
    rows = []
    for sentence in (s for doc in docs for s in doc if usable(s)):
        if rng.random() < 0.5:
            rows.append((sentence, "acceptable"))
        else:
            shuffled = shuffle_words(sentence, rng)
            rows.append((shuffled, "unacceptable" if shuffled != sentence else "acceptable"))
    return rows


def split_at_word(sentence: str, rng: random.Random) -> tuple[str, str]:
    """The sentence cut at a word boundary, with three or more words on each side."""
    words = sentence.split()
    cut = rng.randrange(3, len(words) - 2)
    return " ".join(words[:cut]), " ".join(words[cut:])


def _next(docs, rng):
    """(beginning, ending, label): a sentence's beginning, then its own ending (`next`) or the
    ending of a sentence of another document (`other`), half each."""
    multi = [[s for s in d if usable(s)] for d in docs]
    multi = [d for d in multi if d]
    rows = []
    for index, doc in enumerate(multi):
        for sentence in doc:
            beginning, ending = split_at_word(sentence, rng)
            if rng.random() < 0.5:
                rows.append((beginning, ending, "next"))
            else:
                other = multi[(index + rng.randrange(1, len(multi))) % len(multi)]
                rows.append((beginning, split_at_word(rng.choice(other), rng)[1], "other"))
    return rows


def _next_in_document(docs, rng):
    """(beginning, ending, label): a sentence's beginning, then its own ending (`next`) or the
    ending of another sentence of the same document (`other`), half each: `next`'s decision
    without the change of topic to go by."""
    rows = []
    for doc in docs:
        doc = [s for s in doc if usable(s)]
        if len(doc) < 2:
            continue
        for index, sentence in enumerate(doc):
            beginning, ending = split_at_word(sentence, rng)
            if rng.random() < 0.5:
                rows.append((beginning, ending, "next"))
            else:
                other = doc[(index + rng.randrange(1, len(doc))) % len(doc)]
                rows.append((beginning, split_at_word(other, rng)[1], "other"))
    return rows


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


_BUILDERS = {
    "order": _order,
    "next": _next,
    "next_in_document": _next_in_document,
    "similarity": _similarity,
}


def directory_of(corpus_directory: str) -> str:
    return os.path.join(corpus_directory, "benchmark", VERSION)


def task_path(corpus_directory: str, task: str, split: str) -> str:
    return os.path.join(directory_of(corpus_directory), task, f"{split}.tsv")


def get_or_build(corpus) -> str:
    """Builds the benchmark's files beside the corpus (once); returns their directory."""
    return cache.build_once(directory_of(corpus.directory), lambda staging: _build(corpus, staging))


def _build(corpus, staging: str) -> None:
    stats = {}
    for split in SPLITS:
        docs = _documents(corpus.corpus_path(split))
        for task in TASKS:
            rng = random.Random(f"{task}-{split}")
            rows = _BUILDERS[task](docs, rng)
            rng.shuffle(rows)
            rows = rows[: SIZES[task][split]]
            path = os.path.join(staging, task, f"{split}.tsv")
            os.makedirs(os.path.dirname(path), exist_ok=True)  # local path: corpus cache
            with open(path, "w", encoding="utf-8") as f:  # local path: corpus cache
                f.writelines("\t".join(row) + "\n" for row in rows)
            stats[f"{task}_{split}"] = {"examples": len(rows), "labels": _label_counts(rows)}
    with open(
        os.path.join(staging, "stats.json"), "w", encoding="utf-8"
    ) as f:  # local path: corpus cache
        json.dump(stats, f, indent=2, sort_keys=True)


def _label_counts(rows) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[row[-1]] = counts.get(row[-1], 0) + 1
    return dict(sorted(counts.items()))


def stats(corpus) -> dict:
    with open(
        os.path.join(get_or_build(corpus), "stats.json"), encoding="utf-8"
    ) as f:  # local path: corpus cache
        return json.load(f)
