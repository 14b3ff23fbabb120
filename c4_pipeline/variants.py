"""The paper's corpus variants that restrict C4 to chosen sources (T5 paper section 3.4).

RealNews-like keeps pages from a list of news domains; WebText-like keeps pages whose URL is in a
list (the paper used the URLs of OpenWebText). Both then get the full C4 cleaning. The domain
list is small and travels inside the filter; a URL list can have tens of millions of entries, so
it is read as a PCollection and joined with the pages by normalized URL instead of being held in
memory.

Filtering happens before the cleaning and the span deduplication, so pages outside the variant
never claim a repeated span that a page inside it would otherwise lose.

Counter names (namespace `variant`):
  page_dropped:domain_not_listed  RealNews-like: the page's host is not a listed domain
  page_dropped:url_not_listed     WebText-like: the page's URL is not in the list
  listed_url_without_page         WebText-like: listed URLs with no crawled page
  page_kept                       pages inside the variant
"""

import collections
from typing import Iterable

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from c4_pipeline import counting
from c4_pipeline.page import Page, normalize_url, url_host


def read_list(path: str) -> list[str]:
    """Reads one entry per line from a local or remote file, skipping blanks and "#" comments.

    Raises:
        ValueError: when the file cannot be read or has no entries.
    """
    try:
        with FileSystems.open(path) as f:
            raw = f.read().decode("utf-8")
    except OSError as e:
        raise ValueError(f"Could not read the list file {path!r}: {e}") from e
    entries = [line.strip() for line in raw.splitlines()]
    entries = [e for e in entries if e and not e.startswith("#")]
    if not entries:
        raise ValueError(f"The list file {path!r} has no entries; expected one per line.")
    return entries


def _normalize_domain(entry: str) -> str:
    return url_host(entry).removeprefix("www.")


class DomainFilter:
    """Keeps pages whose host is a listed domain or a subdomain of one.

    Example: with domains ["nytimes.com", "bbc.co.uk"], "https://www.nytimes.com/2019/x" and
    "http://news.bbc.co.uk/a" are kept; "https://notnytimes.com/" is dropped with
    `counters["page_dropped:domain_not_listed"] += 1`.
    """

    def __init__(self, domains: Iterable[str]):
        self._domains = frozenset(d for d in map(_normalize_domain, domains) if d)
        if not self._domains:
            raise ValueError("DomainFilter needs at least one domain, e.g. 'nytimes.com'.")

    def keeps(self, url: str) -> bool:
        labels = url_host(url).split(".")
        return any(".".join(labels[i:]) in self._domains for i in range(len(labels)))

    def __call__(self, page: Page, counters: collections.Counter) -> list[Page]:
        if not self.keeps(page.url):
            counters["page_dropped:domain_not_listed"] += 1
            return []
        counters["page_kept"] += 1
        return [page]


def _select_listed(element, counters: collections.Counter) -> list[Page]:
    _, grouped = element
    pages, listed = list(grouped["pages"]), bool(list(grouped["listed"]))
    if not listed:
        counters["page_dropped:url_not_listed"] += len(pages)
        return []
    if not pages:
        counters["listed_url_without_page"] += 1
        return []
    counters["page_kept"] += len(pages)
    return pages


class FilterByUrlList(beam.PTransform):
    """PCollection[Page] -> the pages whose normalized URL appears in the file at `urls_path`."""

    def __init__(self, urls_path: str, namespace: str = "variant"):
        super().__init__()
        self._urls_path = urls_path
        self._namespace = namespace

    def expand(self, pages):
        listed = (
            pages.pipeline
            | "ReadUrlList" >> beam.io.ReadFromText(self._urls_path)
            | "KeepUrlEntries"
            >> beam.Filter(lambda line: line.strip() and not line.startswith("#"))
            | "KeyListedUrl" >> beam.Map(lambda line: (normalize_url(line), None))
        )
        keyed = pages | "KeyPageUrl" >> beam.Map(lambda page: (normalize_url(page.url), page))
        return (
            {"pages": keyed, "listed": listed}
            | "JoinUrlList" >> beam.CoGroupByKey()
            | "SelectListed" >> beam.ParDo(counting.CountingFn(self._namespace, _select_listed))
        )
