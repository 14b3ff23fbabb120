"""Turns raw documentation into prose documents, supervised examples and a deterministic split.

Documentation mixes prose with code, grammar rules and markup. A paragraph (lines between blank
lines) is kept only if it reads as prose: no doctest prompt, not an indented block (code samples
are indented; bullet items are not counted as such), few code symbols. Kept paragraphs lose their
reStructuredText markup and line breaks. Splits are decided by a hash of the document text, so
they never change between runs or machines and a docstring lands on the same side of the split
in the pretraining corpus and in the supervised tasks built from it.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Iterator

from t2t.data.builtin.sources import Docstring

# Characters that are common in code and grammar rules and rare in prose.
_CODE_SYMBOLS = frozenset("(){}[]=<>;_*/\\|#%$@^~`+&")
MAX_CODE_SYMBOL_FRACTION = 0.06
MIN_DOCUMENT_WORDS = 8
VALIDATION_PERCENT = 10
_ROLE = re.compile(r":[\w:.-]+:`~?([^`]*)`")  # :func:`~os.path.join` -> os.path.join
_LITERAL = re.compile(r"``([^`]*)``|`([^`]*)`")
_EMPHASIS = re.compile(r"(?<![\w*])\*{1,2}([^*\s][^*]*?)\*{1,2}(?![\w*])")
_BULLET = re.compile(r"^(?:[*\-+•]|\d+[.)]|\([a-z0-9]+\))\s")
_RULE_LINE = re.compile(r"^[\s*=\-~^#+`'\".:_]+$")


def paragraphs(text: str) -> list[str]:
    """Prose paragraphs of `text`, each one line with markup and extra whitespace removed.

    Example:
      "Return the sum.\\n\\n    >>> add(1, 2)\\n    3\\n\\nSee :func:`sum` and ``math.fsum``."
      -> ["Return the sum.", "See sum and math.fsum."]
    """
    return [prose for _, prose in blocks(text) if prose]


def blocks(text: str) -> Iterator[tuple[str, str | None]]:
    """Each block of `text` (lines between blank lines) as one line, as written (markup, code
    and all; white space folded), with its prose as `paragraphs` keeps it, or None."""
    for block in re.split(r"\n[ \t]*\n", text):
        raw = " ".join(block.split())
        if not raw:
            continue
        lines = [line.rstrip() for line in block.splitlines() if line.strip()]
        lines = [line for line in lines if not _RULE_LINE.match(line)]
        prose = None
        if lines and _is_prose(lines):
            prose = _strip_markup(" ".join(line.strip() for line in lines)) or None
        yield raw, prose


def _is_prose(lines: list[str]) -> bool:
    first = lines[0]
    stripped = first.lstrip()
    indent = len(first) - len(stripped)
    if any(line.lstrip().startswith((">>>", "...", "$ ", "% ")) for line in lines):
        return False
    if indent >= 3 and not _BULLET.match(stripped):
        return False  # an indented block: a code sample or a grammar rule
    characters = [c for c in _strip_markup(" ".join(lines)) if not c.isspace()]
    symbols = sum(c in _CODE_SYMBOLS for c in characters)
    return symbols <= MAX_CODE_SYMBOL_FRACTION * len(characters)


def _strip_markup(text: str) -> str:
    text = _ROLE.sub(r"\1", text)
    text = _LITERAL.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    text = _EMPHASIS.sub(r"\1", text)
    text = _BULLET.sub("", text)
    text = re.sub(r"::(\s|$)", r":\1", text)
    return " ".join(text.split())


def document(text: str) -> str | None:
    """The prose of `text` as one line, or None when fewer than MIN_DOCUMENT_WORDS words remain."""
    prose = " ".join(paragraphs(text))
    return prose if len(prose.split()) >= MIN_DOCUMENT_WORDS else None


def topic_documents(text: str, target_words: int = 200) -> list[str]:
    """Splits a long pydoc topic into documents of about `target_words` words (whole paragraphs)."""
    return [document for document, _ in topic_document_pairs(text, target_words) if document]


def topic_document_pairs(text: str, target_words: int = 200) -> list[tuple[str | None, str]]:
    """`topic_documents`' documents, each with the blocks it was cut from as written (code and
    markup included: the unfiltered corpus): the blocks up to its last paragraph, and for the
    last document, every block after it too. A part whose prose is too short to be a document,
    or a topic without prose, pairs None with its blocks."""
    pairs, prose, raw = [], [], []
    for block, paragraph in blocks(text):
        raw.append(block)
        if paragraph:
            prose.append(paragraph)
            if sum(len(p.split()) for p in prose) >= target_words:
                pairs.append((" ".join(prose), " ".join(raw)))
                prose, raw = [], []
    if prose or not pairs:
        pairs.append((" ".join(prose), " ".join(raw)))
    elif raw:
        pairs[-1] = (pairs[-1][0], " ".join([pairs[-1][1], *raw]))
    return [
        (document if len(document.split()) >= MIN_DOCUMENT_WORDS else None, blocks_text)
        for document, blocks_text in pairs
        if blocks_text
    ]


def summary_example(docstring: Docstring, min_body_words: int = 15) -> tuple[str, str] | None:
    """(body, summary) for a docstring that opens with a one-sentence summary, else None.

    PEP 257 docstrings start with a summary line, then a blank line, then the body; the summary
    is the target and the body's prose the input.

    Example: "Return the sum of a and b.\\n\\nBoth arguments must be numbers; ... (15+ words)"
    -> ("Both arguments must be numbers; ...", "Return the sum of a and b.")
    """
    head, separator, rest = docstring.text.partition("\n\n")
    summary = " ".join(head.split())
    if not separator or "\n" in head.strip() or not summary.endswith("."):
        return None
    if not paragraphs(head) or len(summary.split()) < 3:
        return None
    body = " ".join(paragraphs(rest))
    if len(body.split()) < min_body_words:
        return None
    return body, _strip_markup(summary)


def split_of(text: str, validation_percent: int = VALIDATION_PERCENT) -> str:
    """'validation' for about `validation_percent`% of texts (by SHA-256), else 'train'."""
    bucket = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big") % 100
    return "validation" if bucket < validation_percent else "train"


def deduplicate(items: Iterable[str]) -> Iterator[str]:
    """Yields each distinct item once, in first-seen order."""
    seen = set()
    for item in items:
        if item not in seen:
            seen.add(item)
            yield item
