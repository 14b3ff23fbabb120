"""The bad-words page filter: drop pages containing any word of the LDNOOBW English list.

The paper filters with the "List of Dirty, Naughty, Obscene or Otherwise Bad Words". The list is
fetched once when the pipeline is built (pinned to the commit the T5 authors' implementation
uses, so the corpus does not drift when the list changes) or read from a local or remote file,
and travels to the workers inside the filter object.

A word matches when it stands between non-word characters (or the text's ends), in the
lower-cased text: "ass" matches "an ass." but not "class". Entries made only of word characters
are looked up in a set of the text's words, which is equivalent and much faster than one large
regular expression; entries with spaces or punctuation ("two words", "a$$") use a regular
expression with the same boundaries.
"""

import collections
import re
import urllib.error
import urllib.request
from typing import Iterable

from apache_beam.io.filesystems import FileSystems

BADWORDS_URL = (
    "https://raw.githubusercontent.com/LDNOOBW/List-of-Dirty-Naughty-Obscene-and-Otherwise-Bad-"
    "Words/25e679f03d96baa721cde20db9944649e8d0a844/en"
)
_WORD = re.compile(r"\w+")
_ONLY_WORD_CHARS = re.compile(r"^\w+$")


def load_badwords(source: str = BADWORDS_URL, timeout_s: float = 60.0) -> list[str]:
    """Reads the word list, one entry per line, from an http(s) URL or any Beam file path.

    Args:
        source: an http(s) URL, a local path, or a remote path Beam's file systems open
            (gs://, s3://, hdfs://).
        timeout_s: how long to wait for a download.

    Returns:
        The lower-cased, stripped, non-empty entries in file order.

    Raises:
        ValueError: when the download fails, the file cannot be read, or the list is empty.
    """
    try:
        if source.startswith(("http://", "https://")):
            with urllib.request.urlopen(source, timeout=timeout_s) as response:
                raw = response.read()
        else:
            with FileSystems.open(source) as f:
                raw = f.read()
    except (OSError, urllib.error.URLError) as e:
        raise ValueError(
            f"Could not read the bad-words list from {source!r} ({e}). Pass a local copy with "
            "--badwords_file=PATH (one word per line), e.g. the `en` file of the LDNOOBW "
            "GitHub repository."
        ) from e
    words = [line.strip().lower() for line in raw.decode("utf-8").splitlines() if line.strip()]
    if not words:
        raise ValueError(f"The bad-words list at {source!r} is empty; expected one word per line.")
    return words


class BadWordsFilter:
    """A picklable page predicate built from a word list.

    Example: with words ["ass", "bad word"], "A class of its own." is kept, while "Such an ass!"
    and "This is a bad word here." are dropped, each adding 1 to
    `counters["page_dropped:bad_words"]`.
    """

    def __init__(self, words: Iterable[str]):
        words = sorted({w.strip().lower() for w in words if w.strip()})
        if not words:
            raise ValueError("BadWordsFilter needs at least one word; got an empty list.")
        self._single = frozenset(w for w in words if _ONLY_WORD_CHARS.match(w))
        phrases = [re.escape(w) for w in words if not _ONLY_WORD_CHARS.match(w)]
        self._pattern = (
            re.compile(r"(?:\W|^)(?:{})(?:\W|$)".format("|".join(phrases))) if phrases else None
        )

    def contains_bad_word(self, text: str) -> bool:
        """Returns True when the lower-cased `text` contains a listed word between boundaries."""
        lowered = text.lower()
        if not self._single.isdisjoint(_WORD.findall(lowered)):
            return True
        return bool(self._pattern and self._pattern.search(lowered))

    def __call__(self, text: str, counters: collections.Counter) -> bool:
        """Returns True to keep the page; counts `page_dropped:bad_words` otherwise."""
        if not self.contains_bad_word(text):
            return True
        counters["page_dropped:bad_words"] += 1
        return False
