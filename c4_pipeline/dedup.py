"""Three-sentence-span deduplication across the whole corpus (T5 paper section 2.2).

"We discarded all but one of any three-sentence span occurring more than once in the data set."
Every page's sentences (`sentences.split_sentences`, line after line) are cut into overlapping
spans of three consecutive sentences; a span's key is the MD5 digest of its lower-cased,
white-space-collapsed text. Beam groups the occurrences of each key across the corpus, and for a
key seen more than once one occurrence is the keeper: the one with the smallest
(page key, position), where a page's key is the MD5 digest of its URL, timestamp and text. That
choice is the same on every runner and run, and does not favour any domain. Every other
occurrence, in other pages or later in the same page, is marked for removal.

A page then loses the sentences covered by its removal marks, except sentences covered by a
keeper occurrence, so every repeated span of the input survives whole in its keeper. (Spans that
overlap a removed occurrence lose sentences, as with any deduplication.) (When a removal is
entirely covered by keepers of other repeated spans in the same page, that occurrence survives
too; this needs three overlapping repeats and is rare.) A line whose sentences all go disappears;
a page left with fewer than three sentences is dropped.

Worked example, with sentences written as letters and page A ranking before page B:
  A = "a. b. c. d."        spans abc (0), bcd (1)
  B = "x. a. b. c. a. b. c."  spans xab (0), abc (1), bca (2), cab (3), abc (4)
abc occurs at (A,0), (B,1), (B,4): the keeper is (A,0), and B loses sentences 1-6, leaving "x."
alone, so B is dropped (one sentence). A is unchanged.

Counter names (namespace `span_dedup`):
  span_repeated                   distinct spans that occur more than once
  span_occurrence_dropped         occurrences other than the keeper
  sentence_dropped                sentences removed from pages
  page_changed                    pages that lost at least one sentence
  page_dropped:too_few_sentences  changed pages left with fewer than 3 sentences
  page_dropped:exact_duplicate    pages identical to another page (URL, timestamp and text)
  page_kept                       pages written out
"""

import collections
import hashlib
from typing import Iterable, Iterator, Optional

import apache_beam as beam

from c4_pipeline import counting, rules, sentences
from c4_pipeline.page import Page

SPAN_LENGTH = 3
KEEP, DROP = "keep", "drop"


def page_key(page: Page) -> bytes:
    """Returns the page's identity and rank: MD5 of its URL, timestamp and text [16 bytes]."""
    identity = "\0".join((page.url, page.timestamp, page.text))
    return hashlib.md5(identity.encode("utf-8")).digest()


def page_sentences(text: str) -> list[list[str]]:
    """Returns each line's sentences; positions count through them line after line."""
    return [sentences.split_sentences(line) for line in text.split("\n")]


def span_keys(flat_sentences: list[str]) -> list[bytes]:
    """Returns the key of each span of `SPAN_LENGTH` consecutive sentences, by start position.

    Example: 4 sentences give 2 keys; "A b.  C d. E f." and "a b. c d. e f." share a key.
    """
    keys = []
    for start in range(len(flat_sentences) - SPAN_LENGTH + 1):
        span = " ".join(flat_sentences[start : start + SPAN_LENGTH])
        keys.append(hashlib.md5(" ".join(span.lower().split()).encode("utf-8")).digest())
    return keys


def span_occurrences(page: Page) -> Iterator[tuple[bytes, tuple[bytes, int]]]:
    """Yields (span key, (page key, start position)) for every span of the page."""
    key = page_key(page)
    flat = [s for line in page_sentences(page.text) for s in line]
    for position, span in enumerate(span_keys(flat)):
        yield span, (key, position)


def mark_occurrences(
    occurrences: Iterable[tuple[bytes, int]], counters: collections.Counter
) -> list[tuple[bytes, tuple[str, int]]]:
    """Chooses the keeper among one span's occurrences and marks the others for removal.

    Args:
        occurrences: (page key, position) of every occurrence of one span; iterated twice.
        counters: `span_repeated` and `span_occurrence_dropped` are incremented.

    Returns:
        [(page key, (KEEP or DROP, position))]; empty when the span occurs once.
        Example: [(b"B", 4), (b"A", 0), (b"B", 1)] gives
        [(b"A", ("keep", 0)), (b"B", ("drop", 4)), (b"B", ("drop", 1))].
    """
    count = 0
    keeper = None
    for occurrence in occurrences:
        count += 1
        keeper = occurrence if keeper is None else min(keeper, occurrence)
    if count < 2:
        return []
    counters["span_repeated"] += 1
    counters["span_occurrence_dropped"] += count - 1
    marks = [(keeper[0], (KEEP, keeper[1]))]
    skipped_keeper = False
    for occurrence in occurrences:
        if occurrence == keeper and not skipped_keeper:
            # Skip the keeper once. Exact duplicate pages repeat it; their DROP marks are covered
            # by its KEEP mark.
            skipped_keeper = True
            continue
        marks.append((occurrence[0], (DROP, occurrence[1])))
    return marks


def remove_marked(
    page: Page,
    marks: Iterable[tuple[str, int]],
    counters: collections.Counter,
    min_sentences: int = rules.MIN_SENTENCES_PER_PAGE,
) -> Optional[Page]:
    """Removes the sentences of a page's DROP marks that no KEEP mark covers.

    Args:
        page: the page as it was when its spans were emitted.
        marks: (KEEP or DROP, start position) of this page's repeated spans.
        counters: incremented with the names of the module docstring.
        min_sentences: changed pages with fewer sentences are dropped.

    Returns:
        The page with the sentences removed, or None when it is dropped.
    """
    protected, dropped = set(), set()
    for kind, start in marks:
        (protected if kind == KEEP else dropped).update(range(start, start + SPAN_LENGTH))
    dropped -= protected
    if not dropped:
        counters["page_kept"] += 1
        return page
    lines, position, remaining = [], 0, 0
    for line, line_sentences in zip(page.text.split("\n"), page_sentences(page.text)):
        kept = [s for i, s in enumerate(line_sentences, position) if i not in dropped]
        position += len(line_sentences)
        remaining += len(kept)
        if len(kept) == len(line_sentences):
            lines.append(line)
        elif kept:
            lines.append(" ".join(kept))
    counters["page_changed"] += 1
    counters["sentence_dropped"] += len(dropped)
    if remaining < min_sentences:
        counters["page_dropped:too_few_sentences"] += 1
        return None
    counters["page_kept"] += 1
    return page._replace(text="\n".join(lines))


def _mark_group(element, counters: collections.Counter):
    _, occurrences = element
    return mark_occurrences(occurrences, counters)


def _join_marks(
    element: tuple[bytes, dict[str, list]], counters: collections.Counter, min_sentences: int
) -> list[Page]:
    _, grouped = element
    pages = list(grouped["page"])
    if not pages:
        return []  # Cannot happen: marks are only emitted for keys of existing pages.
    if len(pages) > 1:
        counters["page_dropped:exact_duplicate"] += len(pages) - 1
    page = remove_marked(pages[0], grouped["marks"], counters, min_sentences)
    return [page] if page is not None else []


class DeduplicateSpans(beam.PTransform):
    """PCollection[Page] -> PCollection[Page] without repeated three-sentence spans.

    Two shuffles: one groups span occurrences by span key, the other joins each page with its
    marks. Both are plain `GroupByKey`/`CoGroupByKey`, so the transform runs on any Beam runner.
    The occurrence groups are iterated twice (first the keeper, then the marks), which Beam's
    `GroupByKey` results allow.
    """

    def __init__(
        self, min_sentences: int = rules.MIN_SENTENCES_PER_PAGE, namespace: str = "span_dedup"
    ):
        super().__init__()
        self._min_sentences = min_sentences
        self._namespace = namespace

    def expand(self, pages):
        keyed = pages | "KeyPages" >> beam.Map(lambda page: (page_key(page), page))
        marks = (
            pages
            | "EmitSpans" >> beam.FlatMap(span_occurrences)
            | "GroupBySpan" >> beam.GroupByKey()
            | "ChooseKeepers" >> beam.ParDo(counting.CountingFn(self._namespace, _mark_group))
        )
        return (
            {"page": keyed, "marks": marks}
            | "JoinPagesWithMarks" >> beam.CoGroupByKey()
            | "RemoveMarked"
            >> beam.ParDo(
                counting.CountingFn(self._namespace, _join_marks, min_sentences=self._min_sentences)
            )
        )


def deduplicate_in_memory(
    pages: list[Page],
    counters: collections.Counter,
    min_sentences: int = rules.MIN_SENTENCES_PER_PAGE,
) -> list[Page]:
    """The same deduplication without Beam, for small corpora and as the transform's reference.

    Returns the surviving pages in the order of `pages`.
    """
    groups = collections.defaultdict(list)
    for page in pages:
        for span, occurrence in span_occurrences(page):
            groups[span].append(occurrence)
    marks = collections.defaultdict(list)
    for occurrences in groups.values():
        for key, mark in mark_occurrences(occurrences, counters):
            marks[key].append(mark)
    seen, result = set(), []
    for page in pages:
        key = page_key(page)
        if key in seen:
            counters["page_dropped:exact_duplicate"] += 1
            continue
        seen.add(key)
        kept = remove_marked(page, marks[key], counters, min_sentences)
        if kept is not None:
            result.append(kept)
    return result
