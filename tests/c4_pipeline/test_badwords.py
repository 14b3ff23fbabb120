"""The bad-words page filter: matching semantics, the fast path's equivalence, list loading."""

import collections
import re

import hypothesis
import pytest
from hypothesis import strategies as st

from c4_pipeline import badwords


def test_docstring_example():
    keep = badwords.BadWordsFilter(["ass", "bad word"])
    counters = collections.Counter()
    assert keep("A class of its own.", counters)
    assert dict(counters) == {}
    assert not keep("Such an ass!", counters)
    assert not keep("This is a bad word here.", counters)
    assert dict(counters) == {"page_dropped:bad_words": 2}


@pytest.mark.parametrize(
    "text, found",
    [
        ("ASS at the start.", True),
        ("ends with ass", True),
        ("ass-hat compound", True),
        ("passage and assorted", False),
        ("bad words (plural) differ", False),
        ("a BAD   WORD with two spaces", False),  # Entries match literally, spaces included.
        ("a$$ is listed too.", True),
    ],
)
def test_boundaries(text, found):
    assert badwords.BadWordsFilter(["ass", "bad word", "a$$"]).contains_bad_word(text) == found


_WORDS = st.lists(st.sampled_from(["ab", "b", "a b", "a-b", "c$", "ba"]), min_size=1, max_size=4)
_TEXTS = st.text(alphabet="abAB c$-.\n", max_size=30)


@hypothesis.settings(max_examples=300, deadline=None)
@hypothesis.given(_WORDS, _TEXTS)
def test_fast_path_equals_one_regex(words, text):
    # The reference: one regular expression with non-word boundaries over every entry.
    pattern = re.compile(r"(?:\W|^)(?:{})(?:\W|$)".format("|".join(re.escape(w) for w in words)))
    assert badwords.BadWordsFilter(words).contains_bad_word(text) == bool(
        pattern.search(text.lower())
    )


def test_load_from_file(tmp_path):
    path = tmp_path / "en"
    path.write_text("Alpha\n\n  beta gamma \n")
    assert badwords.load_badwords(str(path)) == ["alpha", "beta gamma"]


def test_load_errors_name_the_fix(tmp_path):
    with pytest.raises(ValueError, match="--badwords_file"):
        badwords.load_badwords(str(tmp_path / "missing"))
    empty = tmp_path / "empty"
    empty.write_text("\n\n")
    with pytest.raises(ValueError, match="empty"):
        badwords.load_badwords(str(empty))
    with pytest.raises(ValueError, match="at least one word"):
        badwords.BadWordsFilter([" "])


def test_pinned_source():
    # The list is pinned to one commit of the LDNOOBW repository's `en` file.
    assert re.fullmatch(
        r"https://raw\.githubusercontent\.com/LDNOOBW/List-of-Dirty-Naughty-Obscene-and-Otherwise-Bad-"
        r"Words/[0-9a-f]{40}/en",
        badwords.BADWORDS_URL,
    )
