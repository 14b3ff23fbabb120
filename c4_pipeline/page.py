"""The record every pipeline stage passes along, and the URL keys the stages agree on.

A crawled page is a URL, a crawl timestamp and its extracted text. Two stages key pages by URL (the
duplicate-URL filter and the span deduplication's join), and the WebText-like variant matches URLs
against a list, so they share one normalization here.
"""

import hashlib
import re
import typing
import urllib.parse

_SCHEME_AND_WWW = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://(www\.)?")
_TRACKING_QUERY = re.compile(r"\?(utm_|ref|feed).*$")


class Page(typing.NamedTuple):
    """One crawled page.

    Attributes:
        url: the page's URL as crawled (`WARC-Target-URI`).
        timestamp: the crawl time as written in the WET file (`WARC-Date`, ISO 8601).
        text: the page's extracted text, lines separated by "\\n".
    """

    url: str
    timestamp: str
    text: str


def normalize_url(url: str) -> str:
    """Returns the key under which two URLs count as the same page.

    Drops the scheme, a leading "www.", tracking queries (`?utm_...`, `?ref...`, `?feed...`) and
    trailing slashes, so the http and https captures of one page share a key.

    Example: `normalize_url("https://www.example.com/news/?utm_source=x")` is
    `"example.com/news"`.
    """
    url = _SCHEME_AND_WWW.sub("", url.strip())
    url = _TRACKING_QUERY.sub("", url)
    return url.rstrip("/")


def url_host(url: str) -> str:
    """Returns the lower-cased host name of `url` without port, "" when it has none.

    Example: `url_host("https://News.Example.co.uk:8080/a")` is `"news.example.co.uk"`.
    """
    url = url.strip()
    if not url:
        return ""
    if "://" not in url:
        url = "http://" + url
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return ""
    return host or ""


def url_rank(url: str) -> bytes:
    """Returns a deterministic, domain-unbiased order key for `url` (its MD5 digest).

    Stages that must pick one page among several (which page keeps a repeated span) pick the
    smallest rank. Hashing makes the choice independent of the URL's spelling, so no domain is
    favoured, and it is the same on every worker and every run (Python's `hash` is not).
    """
    return hashlib.md5(url.encode("utf-8")).digest()
