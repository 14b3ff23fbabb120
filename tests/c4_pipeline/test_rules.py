"""Each C4 cleaning rule on strings, with the exact counter dictionary it must leave."""

import collections

import pytest

from c4_pipeline import rules, sentences


def _run(fn, text, **kwargs):
    counters = collections.Counter()
    result = fn(text, counters, **kwargs)
    return result, dict(counters)


def test_split_sentences_docstring_example():
    assert sentences.split_sentences(
        'He met Mr. Smith at 3.30 p.m. today. "Why?" she asked. Fine!'
    ) == ["He met Mr. Smith at 3.30 p.m. today.", '"Why?" she asked.', "Fine!"]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("", []),
        ("No end mark here", ["No end mark here"]),
        ("J. R. Tolkien wrote it. Then he slept!", ["J. R. Tolkien wrote it.", "Then he slept!"]),
        ("Wait... What happened?! Nothing.", ["Wait...", "What happened?!", "Nothing."]),
        ("(It ended.) The next began.", ["(It ended.)", "The next began."]),
        ("Costs are 3.5 times higher. Really.", ["Costs are 3.5 times higher.", "Really."]),
    ],
)
def test_split_sentences_cases(line, expected):
    assert sentences.split_sentences(line) == expected


def test_count_sentences_docstring_example():
    assert sentences.count_sentences("One is here. Two is here.\nThree!") == 3


def test_strip_citations():
    assert _run(rules.strip_citations, "Paris is large.[3][citation needed]") == (
        "Paris is large.",
        {"citation_removed": 2},
    )
    assert _run(rules.strip_citations, "A list [a] stays, as does [1a].") == (
        "A list [a] stays, as does [1a].",
        {},
    )
    assert _run(rules.strip_citations, "History[edit] and []") == (
        "History and ",
        {"citation_removed": 2},
    )


@pytest.mark.parametrize(
    "line, kept",
    [
        ("It works.", True),
        ("Does it work?", True),
        ("It works!", True),
        ('He said "it works."', True),
        ("He said \u201cit works\u201d", True),
        ("Read more...", False),
        ("Read more\u2026", False),
        ("Home | About", False),
        ("It works. ", False),  # Rules see stripped lines; an unstripped one does not end in ".".
    ],
)
def test_ends_in_terminal_punctuation(line, kept):
    expected = {} if kept else {"line_dropped:no_terminal_punctuation": 1}
    assert _run(rules.ends_in_terminal_punctuation, line) == (kept, expected)


def test_has_enough_words():
    assert _run(rules.has_enough_words, "Call us today now.") == (
        False,
        {"line_dropped:too_few_words": 1},
    )
    assert _run(rules.has_enough_words, "Call us today right now.") == (True, {})
    assert _run(rules.has_enough_words, "Two words.", min_words=2) == (True, {})


def test_is_free_of_javascript():
    assert _run(rules.is_free_of_javascript, "Please enable JavaScript to continue.") == (
        False,
        {"line_dropped:javascript": 1},
    )
    assert _run(rules.is_free_of_javascript, "Java is a programming language.") == (True, {})


@pytest.mark.parametrize(
    "phrase",
    [
        "terms of use",
        "privacy policy",
        "cookie policy",
        "uses cookies",
        "use of cookies",
        "use cookies",
    ],
)
def test_is_free_of_policy_notice_drops_every_phrase(phrase):
    line = f"By browsing you accept our {phrase.upper()} today."
    assert _run(rules.is_free_of_policy_notice, line) == (False, {"line_dropped:policy": 1})


def test_is_free_of_policy_notice_keeps_other_lines():
    assert _run(rules.is_free_of_policy_notice, "She baked cookies for the whole class.") == (
        True,
        {},
    )


def test_page_rules():
    assert _run(rules.is_free_of_lorem_ipsum, "Intro.\nLorem Ipsum dolor sit amet.") == (
        False,
        {"page_dropped:lorem_ipsum": 1},
    )
    assert _run(rules.is_free_of_curly_bracket, "function f() { return 1; }") == (
        False,
        {"page_dropped:curly_bracket": 1},
    )
    assert _run(rules.is_free_of_curly_bracket, "Parentheses (like these) are fine.") == (True, {})


def test_has_enough_sentences_docstring_example():
    text = "One two three four five.\nSix seven eight nine ten!"
    assert _run(rules.has_enough_sentences, text) == (False, {"page_dropped:too_few_sentences": 1})
    assert _run(
        rules.has_enough_sentences, text + "\nEleven twelve thirteen fourteen fifteen?"
    ) == (True, {})


def test_clean_line_counts_only_the_first_failing_rule():
    # Fails the word count and mentions javascript; only the first failing rule counts.
    assert _run(lambda line, c: rules.clean_line(line, c), "javascript is off.") == (
        None,
        {"line_dropped:too_few_words": 1},
    )
    assert _run(lambda line, c: rules.clean_line(line, c), "   ") == (
        None,
        {"line_dropped:blank": 1},
    )
    assert _run(
        lambda line, c: rules.clean_line(line, c), "  Our shop opens at seven every day![2]  "
    ) == (
        "Our shop opens at seven every day!",
        {"citation_removed": 1, "line_kept": 1},
    )


def test_clean_text_docstring_example():
    text = (
        "Home\nWe sell fresh bread every day.[1]\nIt is baked at dawn by hand.\n"
        "Enable JavaScript to see the map, please.\nOur shop opens at seven every day!"
    )
    assert _run(rules.clean_text, text) == (
        "We sell fresh bread every day.\nIt is baked at dawn by hand.\nOur shop opens at seven every day!",
        {
            "line_dropped:no_terminal_punctuation": 1,
            "citation_removed": 1,
            "line_dropped:javascript": 1,
            "line_kept": 3,
            "page_kept": 1,
        },
    )


def test_clean_text_page_rules_see_only_kept_lines():
    body = "We sell fresh bread every day.\nIt is baked at dawn by hand.\nOur shop opens at seven!"
    # "{" on a line the line rules drop (no end mark) does not drop the page ...
    assert _run(rules.clean_text, "var x = {a: 1}\n" + body)[1] == {
        "line_dropped:no_terminal_punctuation": 1,
        "line_kept": 3,
        "page_kept": 1,
    }
    # ... but "{" or "lorem ipsum" on a kept line does.
    assert _run(rules.clean_text, "Set x to {a: 1} in the file now.\n" + body) == (
        None,
        {"line_kept": 4, "page_dropped:curly_bracket": 1},
    )
    assert _run(rules.clean_text, "Lorem ipsum dolor sit amet, consectetur.\n" + body) == (
        None,
        {"line_kept": 4, "page_dropped:lorem_ipsum": 1},
    )


def test_clean_text_too_few_sentences():
    assert _run(rules.clean_text, "Menu\nWe sell fresh bread every day.\nLogin") == (
        None,
        {
            "line_dropped:no_terminal_punctuation": 2,
            "line_kept": 1,
            "page_dropped:too_few_sentences": 1,
        },
    )
