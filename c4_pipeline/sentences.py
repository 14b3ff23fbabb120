"""Sentence splitting for the sentence-count rule and the three-sentence-span deduplication.

The T5 authors' implementation counts sentences with NLTK's Punkt model, which must be downloaded
at run time. The pipeline splits with a rule instead, so workers need no model files and every
worker splits the same text the same way: a sentence ends at a run of `.`, `!`, `?` or `…`
(optionally followed by closing quotes or brackets) that is followed by white space and then by
something other than a lower-case letter, unless the word ending there is a title abbreviation
("Mr.", "Dr.", ...) or a single-letter initial ("J.").
"""

import re

# A candidate boundary: terminal marks, optional closers, then the white space after them.
_BOUNDARY = re.compile(r"[.!?\u2026]+[\"'\u201d\u2019)\]]*\s+")
_TITLES = frozenset(
    [
        "mr.",
        "mrs.",
        "ms.",
        "dr.",
        "prof.",
        "st.",
        "jr.",
        "sr.",
        "mt.",
        "gen.",
        "rev.",
        "sen.",
        "rep.",
        "gov.",
        "capt.",
        "lt.",
        "col.",
        "sgt.",
        "vs.",
        "no.",
        "fig.",
        "vol.",
    ]
)
_INITIAL = re.compile(r"^\(?[A-Za-z]\.$")


def _is_boundary(text: str, match: re.Match) -> bool:
    next_char = text[match.end() : match.end() + 1]
    if next_char.islower():
        return False
    last_word = text[: match.start() + 1].rsplit(None, 1)[-1]
    if match.group().strip() == "." and (last_word.lower() in _TITLES or _INITIAL.match(last_word)):
        return False
    return True


def split_sentences(line: str) -> list[str]:
    """Splits one line of text into sentences.

    Example: `split_sentences('He met Mr. Smith at 3.30 p.m. today. "Why?" she asked. Fine!')`
    is `['He met Mr. Smith at 3.30 p.m. today.', '"Why?" she asked.', 'Fine!']`: "Mr." is a
    title, "3.30" has no space after its period, and "p.m." and '"Why?"' are followed by
    lower-case words.

    Args:
        line: text without line breaks (a line break always ends a sentence in the pipeline, since
            the cleaning rules keep only lines that end in terminal punctuation).

    Returns:
        The sentences, stripped of surrounding white space; `[]` for a blank line.
    """
    line = line.strip()
    sentences = []
    start = 0
    for match in _BOUNDARY.finditer(line):
        if _is_boundary(line, match):
            sentences.append(line[start : match.end()].strip())
            start = match.end()
    if start < len(line):
        sentences.append(line[start:].strip())
    return sentences


def count_sentences(text: str) -> int:
    """Returns the number of sentences in `text`, each line split by `split_sentences`.

    Example: `count_sentences("One is here. Two is here.\\nThree!")` is 3.
    """
    return sum(len(split_sentences(line)) for line in text.split("\n"))
