"""The C4 cleaning rules (T5 paper section 2.2, docs/spec.md section 11), each a small pure function.

Every rule takes the text it judges and a `counters` mapping (a `collections.Counter`) and records
why it dropped something under a fixed name, so the rules are tested on plain strings with exact
counter dictionaries and the Beam stages forward the same names to Beam `Metrics` counters.

Line rules return True to keep the line. Page rules return True to keep the page. `clean_text`
applies them in the order of the T5 authors' implementation: line rules first, then the page rules
on the lines that survived ("lorem ipsum" and "{" anywhere in the kept text drop the whole page),
then the sentence count.

Counter names (namespace `clean` in the stats file):
  citation_removed                      citation markers ("[1]", "[edit]", ...) deleted
  line_dropped:blank                    empty lines
  line_dropped:no_terminal_punctuation  lines not ending in . ! ? " or ending in an ellipsis
  line_dropped:too_few_words            lines with fewer than 5 words
  line_dropped:javascript               lines mentioning "javascript"
  line_dropped:policy                   lines with "terms of use", "privacy policy", cookie notices
  line_kept                             lines that passed every line rule
  page_dropped:lorem_ipsum              pages whose kept text contains "lorem ipsum"
  page_dropped:curly_bracket            pages whose kept text contains "{"
  page_dropped:too_few_sentences        pages with fewer than 3 sentences after line filtering
  page_kept                             pages that passed every rule
"""

import collections
import re
from typing import Optional

from c4_pipeline import sentences

MIN_WORDS_PER_LINE = 5
MIN_SENTENCES_PER_PAGE = 3

_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)
_TERMINAL_MARKS = (".", "!", "?", '"', "\u201d")
_ELLIPSES = ("...", "\u2026")
_POLICY_PHRASES = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)

Counters = collections.Counter


def strip_citations(line: str, counters: Counters) -> str:
    """Deletes Wikipedia-style citation markers: "[12]", "[]", "[edit]", "[citation needed]".

    Example: `strip_citations("Paris is large.[3][citation needed]", c)` is "Paris is large."
    and adds 2 to `c["citation_removed"]`.
    """
    cleaned, removed = _CITATION.subn("", line)
    if removed:
        counters["citation_removed"] += removed
    return cleaned


def ends_in_terminal_punctuation(line: str, counters: Counters) -> bool:
    """Keeps lines ending in ".", "!", "?" or a closing double quote, but not in an ellipsis.

    Example: "It works." is kept; "Read more..." and "Home | About" are dropped and each adds 1 to
    `counters["line_dropped:no_terminal_punctuation"]`.
    """
    if line.endswith(_TERMINAL_MARKS) and not line.endswith(_ELLIPSES):
        return True
    counters["line_dropped:no_terminal_punctuation"] += 1
    return False


def has_enough_words(line: str, counters: Counters, min_words: int = MIN_WORDS_PER_LINE) -> bool:
    """Keeps lines of at least `min_words` white-space-separated words.

    Example: "Call us today now." (4 words) is dropped with
    `counters["line_dropped:too_few_words"] += 1`; "Call us today right now." is kept.
    """
    if len(line.split()) >= min_words:
        return True
    counters["line_dropped:too_few_words"] += 1
    return False


def is_free_of_javascript(line: str, counters: Counters) -> bool:
    """Drops lines mentioning "javascript" in any case (e.g. "Please enable JavaScript.")."""
    if "javascript" not in line.lower():
        return True
    counters["line_dropped:javascript"] += 1
    return False


def is_free_of_policy_notice(line: str, counters: Counters) -> bool:
    """Drops lines with a terms-of-use, privacy-policy or cookie notice phrase, in any case."""
    lowered = line.lower()
    if not any(phrase in lowered for phrase in _POLICY_PHRASES):
        return True
    counters["line_dropped:policy"] += 1
    return False


def is_free_of_lorem_ipsum(text: str, counters: Counters) -> bool:
    """Drops pages containing "lorem ipsum" in any case (placeholder text)."""
    if "lorem ipsum" not in text.lower():
        return True
    counters["page_dropped:lorem_ipsum"] += 1
    return False


def is_free_of_curly_bracket(text: str, counters: Counters) -> bool:
    """Drops pages containing "{", which marks program code rather than natural text."""
    if "{" not in text:
        return True
    counters["page_dropped:curly_bracket"] += 1
    return False


def has_enough_sentences(
    text: str, counters: Counters, min_sentences: int = MIN_SENTENCES_PER_PAGE
) -> bool:
    """Keeps pages with at least `min_sentences` sentences (`sentences.count_sentences`).

    Example: "One two three four five.\\nSix seven eight nine ten!" has 2 sentences and is
    dropped with `counters["page_dropped:too_few_sentences"] += 1`.
    """
    if sentences.count_sentences(text) >= min_sentences:
        return True
    counters["page_dropped:too_few_sentences"] += 1
    return False


def clean_line(line: str, counters: Counters) -> Optional[str]:
    """Applies the line rules to one line; returns the cleaned line or None when dropped."""
    line = line.strip()
    if not line:
        counters["line_dropped:blank"] += 1
        return None
    line = strip_citations(line, counters).strip()
    keep = (
        ends_in_terminal_punctuation(line, counters)
        and has_enough_words(line, counters)
        and is_free_of_javascript(line, counters)
        and is_free_of_policy_notice(line, counters)
    )
    if not keep:
        return None
    counters["line_kept"] += 1
    return line


def clean_text(text: str, counters: Counters) -> Optional[str]:
    """Applies every line and page rule to a page's text.

    Example: for the text "Home\\nWe sell fresh bread every day.[1]\\nIt is baked at dawn by
    hand.\\nEnable JavaScript to see the map, please.\\nOur shop opens at seven every day!"
    the result is "We sell fresh bread every day.\\nIt is baked at dawn by hand.\\nOur shop opens at
    seven every day!" and the counters are `{"line_dropped:no_terminal_punctuation": 1,
    "citation_removed": 1, "line_dropped:javascript": 1, "line_kept": 3, "page_kept": 1}`.

    Args:
        text: the page text, lines separated by "\\n".
        counters: incremented with the names listed in the module docstring.

    Returns:
        The kept lines joined by "\\n", or None when the page is dropped.
    """
    kept = [line for line in (clean_line(raw, counters) for raw in text.split("\n")) if line]
    cleaned_text = "\n".join(kept)
    keep = (
        is_free_of_lorem_ipsum(cleaned_text, counters)
        and is_free_of_curly_bracket(cleaned_text, counters)
        and has_enough_sentences(cleaned_text, counters)
    )
    if not keep:
        return None
    counters["page_kept"] += 1
    return cleaned_text
