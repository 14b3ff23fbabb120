"""Three-sentence-span deduplication: the pure steps, the Beam transform, and its invariants."""

import collections
import random

import apache_beam as beam
import hypothesis
from apache_beam.testing import util as beam_util
from hypothesis import strategies as st

from c4_pipeline import dedup
from c4_pipeline.page import Page

# Sentences as words: each is one sentence to `split_sentences` (capitalized, ends in ".").
A, B, C, D, X = "Alpha one.", "Bravo two.", "Charlie three.", "Delta four.", "Xray nine."


def _flat(text):
    return [s for line in dedup.page_sentences(text) for s in line]


def _spans(pages):
    spans = collections.Counter()
    for page in pages:
        flat = _flat(page.text)
        spans.update(" ".join(flat[i : i + 3]) for i in range(len(flat) - 2))
    return spans


def _ranked(first_url, second_url, text_first, text_second):
    """Returns (page ranked first, page ranked second) for the two texts, whatever the MD5s."""
    p, q = Page(first_url, "t", text_first), Page(second_url, "t", text_second)
    if dedup.page_key(p) > dedup.page_key(q):
        p, q = Page(second_url, "t", text_first), Page(first_url, "t", text_second)
        assert dedup.page_key(p) < dedup.page_key(q)
    return p, q


def test_span_keys_normalize_case_and_space():
    keys = dedup.span_keys(["A b.", "C  d.", "E f.", "G h."])
    assert len(keys) == 2
    assert dedup.span_keys(["a b.", "c d.", "e   f."])[0] == keys[0]


def test_mark_occurrences_docstring_example():
    counters = collections.Counter()
    marks = dedup.mark_occurrences([(b"B", 4), (b"A", 0), (b"B", 1)], counters)
    assert marks == [(b"A", ("keep", 0)), (b"B", ("drop", 4)), (b"B", ("drop", 1))]
    assert dict(counters) == {"span_repeated": 1, "span_occurrence_dropped": 2}
    assert dedup.mark_occurrences([(b"A", 0)], counters) == []


def test_remove_marked_keeps_what_a_keeper_covers():
    page = Page("u", "t", f"{A} {B}\n{C} {D}\n{X} {A}")
    counters = collections.Counter()
    # Sentences 0..5; drop 1-3 and 3-5, but a keeper covers 3-5: only 1 and 2 go.
    kept = dedup.remove_marked(page, [("drop", 1), ("drop", 3), ("keep", 3)], counters)
    assert kept == Page("u", "t", f"{A}\n{D}\n{X} {A}")
    assert dict(counters) == {"page_changed": 1, "sentence_dropped": 2, "page_kept": 1}


def test_docstring_worked_example():
    a, b = _ranked(
        "http://a.org", "http://b.org", f"{A} {B} {C} {D}", f"{X} {A} {B} {C}\n{A} {B} {C}"
    )
    counters = collections.Counter()
    assert dedup.deduplicate_in_memory([b, a], counters) == [a]
    assert dict(counters) == {
        "span_repeated": 1,
        "span_occurrence_dropped": 2,
        "page_changed": 1,
        "sentence_dropped": 6,
        "page_dropped:too_few_sentences": 1,
        "page_kept": 1,
    }


# Two pages share a footer span (F1 F2 F3); the second also repeats a paragraph inside itself.
F1, F2, F3 = "Subscribe to our letter.", "It comes every week.", "Cancel at any time."
P1, P2, P3 = "Rivers flood in spring.", "Farmers plant in May.", "Harvest comes in autumn."
Q1, Q2, Q3, Q4 = (
    "Cats sleep all day.",
    "Dogs bark at night.",
    "Birds sing at dawn.",
    "Owls hunt at dusk.",
)


def _corpus():
    first, second = _ranked(
        "http://one.org/",
        "http://two.org/",
        f"{P1} {P2} {P3}\n{F1} {F2} {F3}",
        f"{Q1} {Q2} {Q3}\n{F1} {F2} {F3}\n{Q4}\n{Q1} {Q2} {Q3}",
    )
    unique = Page("http://three.org/", "t", f"{P3} {Q4} {P1}\nNothing repeats here at all.")
    return first, second, unique


def _expected(first, second, unique):
    # `second` loses the shared footer (kept by `first`) and its own second copy of Q1-Q3.
    return [first, second._replace(text=f"{Q1} {Q2} {Q3}\n{Q4}"), unique]


def test_in_memory_shared_span_and_repeat_inside_a_page():
    first, second, unique = _corpus()
    counters = collections.Counter()
    assert dedup.deduplicate_in_memory([second, unique, first], counters) == [
        _expected(first, second, unique)[i] for i in (1, 2, 0)
    ]
    assert counters["sentence_dropped"] == 6


def test_beam_transform_shared_span_and_repeat_inside_a_page():
    first, second, unique = _corpus()
    duplicate_of_unique = Page(unique.url, unique.timestamp, unique.text)
    with beam.Pipeline() as pipeline:
        result = (
            pipeline
            | beam.Create([second, unique, first, duplicate_of_unique])
            | dedup.DeduplicateSpans()
        )
        beam_util.assert_that(result, beam_util.equal_to(_expected(first, second, unique)))
    counters = {
        c.key.metric.name: c.committed
        for c in pipeline.result.metrics().query()["counters"]
        if c.key.metric.namespace == "span_dedup"
    }
    assert counters == {
        "span_repeated": 2 + 2,  # the footer and Q1-Q3; the 2 spans of the exact duplicate page
        "span_occurrence_dropped": 2 + 2,
        "page_changed": 1,
        "sentence_dropped": 6,
        "page_dropped:exact_duplicate": 1,
        "page_kept": 3,
    }


_SENTENCES = st.sampled_from([A, B, C, D, X, F1, F2])
_PAGE_TEXTS = st.lists(st.lists(_SENTENCES, min_size=1, max_size=7), min_size=1, max_size=5)


@hypothesis.settings(max_examples=150, deadline=None)
@hypothesis.given(_PAGE_TEXTS)
def test_every_repeated_span_survives_in_its_keeper(texts):
    pages = [Page(f"http://p{i}.org", "t", " ".join(t)) for i, t in enumerate(texts)]
    counters = collections.Counter()
    result = dedup.deduplicate_in_memory(pages, counters)
    repeated = {span for span, count in _spans(pages).items() if count > 1}
    assert repeated <= set(_spans(result))
    for page in result:  # Output pages are input pages with sentences removed, in order.
        original = next(p for p in pages if p.url == page.url)
        flat, kept = _flat(original.text), _flat(page.text)
        it = iter(flat)
        assert all(s in it for s in kept)
        assert len(kept) >= 3 or kept == flat
    removed = sum(len(_flat(p.text)) for p in pages) - sum(len(_flat(p.text)) for p in result)
    assert removed >= counters["sentence_dropped"]


def test_beam_transform_equals_the_in_memory_reference():
    rng = random.Random(0)
    pool = [A, B, C, D, X, F1, F2, F3, P1, P2, P3, Q1, Q2, Q3, Q4]
    pages = [
        Page(
            f"http://site{i % 23}.org/{i}",
            f"2019-0{i % 9 + 1}",
            "\n".join(
                " ".join(rng.choices(pool[:8], k=rng.randint(1, 4)) + rng.sample(pool[8:], 2))
                for _ in range(rng.randint(1, 4))
            ),
        )
        for i in range(40)
    ]
    pages += pages[:3]  # exact duplicates
    counters = collections.Counter()
    expected = dedup.deduplicate_in_memory(pages, counters)
    assert 0 < len(expected) < len(pages) and counters["sentence_dropped"] > 0
    with beam.Pipeline() as pipeline:
        result = pipeline | beam.Create(pages) | dedup.DeduplicateSpans()
        beam_util.assert_that(result, beam_util.equal_to(expected))
