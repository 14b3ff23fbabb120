"""WET reading: well-formed records, every kind of damage, compression, the writer round trip."""

import collections
import gzip
import io

import hypothesis
from hypothesis import strategies as st

from c4_pipeline import wet
from c4_pipeline.page import Page, normalize_url, url_host, url_rank

# A literal two-record WET file: a warcinfo record and one conversion record whose body
# contains a line that looks like a record start (bodies are read by length, not by lines).
_GOLDEN = (
    b"WARC/1.0\r\n"
    b"WARC-Type: warcinfo\r\n"
    b"Content-Length: 13\r\n"
    b"\r\n"
    b"isPartOf: x\r\n"
    b"\r\n\r\n"
    b"WARC/1.0\r\n"
    b"WARC-Type: conversion\r\n"
    b"WARC-Target-URI: https://example.com/a\r\n"
    b"WARC-Date: 2019-04-18T10:00:00Z\r\n"
    b"Content-Length: 40\r\n"
    b"\r\n"
    b"First line.  \r\nWARC/1.0\r\nLast line \xc3\xa9.\r\n"
    b"\r\n\r\n"
)


def _read(data: bytes):
    counters = collections.Counter()
    pages = list(wet.iter_wet_pages(io.BytesIO(data), counters))
    return pages, dict(counters)


def _record(headers: str, body: bytes = b"Body text.") -> bytes:
    return b"WARC/1.0\r\n" + headers.encode() + b"\r\n" + body + b"\r\n\r\n"


def test_golden_file():
    assert len(b"First line.  \r\nWARC/1.0\r\nLast line \xc3\xa9.\r\n") == 40
    assert _read(_GOLDEN) == (
        [
            Page(
                "https://example.com/a",
                "2019-04-18T10:00:00Z",
                "First line.\nWARC/1.0\nLast line \u00e9.",
            )
        ],
        {"record:warcinfo": 1, "page_read": 1},
    )


_PAGE_HEADERS = "WARC-Type: conversion\r\nWARC-Target-URI: http://x.org\r\nWARC-Date: 2019\r\n"


def test_each_malformation_is_counted_and_skipped():
    good = wet.encode_wet_record(Page("http://good.org/", "2019-01-01T00:00:00Z", "Good text."))
    cases = {
        b"stray bytes\nmore stray\n": "malformed:unexpected_data",
        _record(
            "WARC-Type: conversion\r\nno colon here\r\nContent-Length: 10\r\n"
        ): "malformed:bad_header",
        _record("WARC-Type: conversion\r\nContent-Length: ten\r\n"): "malformed:bad_content_length",
        _record(
            f"WARC-Type: conversion\r\nContent-Length: {wet.MAX_RECORD_BYTES + 1}\r\n"
        ): "malformed:bad_content_length",
        _record(
            "WARC-Type: conversion\r\nWARC-Date: 2019\r\nContent-Length: 10\r\n"
        ): "malformed:missing_uri",
        _record(
            "WARC-Type: conversion\r\nWARC-Target-URI: http://x.org\r\nContent-Length: 10\r\n"
        ): "malformed:missing_date",
        _record(
            _PAGE_HEADERS + "Content-Length: 4\r\n",
            b"\xff\xfe\xfd!",
        ): "malformed:bad_utf8",
        _record(
            _PAGE_HEADERS + "Content-Length: 3\r\n",
            b" \r\n",
        ): "page_dropped:empty",
        _record("WARC-Type: request\r\nContent-Length: 10\r\n"): "record:other",
    }
    for bad, counter in cases.items():
        pages, counters = _read(good + bad + good)
        assert [p.url for p in pages] == ["http://good.org/"] * 2, counter
        assert counters == {"page_read": 2, counter: 1}, counter


def test_truncated_record_ends_the_file():
    truncated = b"WARC/1.0\r\nWARC-Type: conversion\r\nContent-Length: 100\r\n\r\nshort"
    good = wet.encode_wet_record(Page("http://good.org/", "2019", "Good text."))
    assert _read(good + truncated) == (
        [Page("http://good.org/", "2019", "Good text.")],
        {"page_read": 1, "malformed:truncated": 1},
    )
    assert _read(b"WARC/1.0\r\nWARC-Type: conversion\r\n")[1] == {"malformed:bad_header": 1}


def test_gzip_members_and_corrupt_stream(tmp_path):
    pages = [Page(f"http://site{i}.org/", "2019-01-01", f"Text number {i}.") for i in range(3)]
    path = tmp_path / "ok.warc.wet.gz"
    with open(path, "wb") as f:
        for page in pages:  # One gzip member per record, as Common Crawl writes them.
            f.write(gzip.compress(wet.encode_wet_record(page)))
    counters = collections.Counter()
    assert list(wet.read_wet_file(str(path), counters)) == pages
    assert dict(counters) == {"file": 1, "page_read": 3}

    data = path.read_bytes()
    cut = tmp_path / "cut.warc.wet.gz"
    cut.write_bytes(data[: len(data) - 20])  # The last member loses its end.
    counters = collections.Counter()
    assert list(wet.read_wet_file(str(cut), counters)) == pages[:2]
    assert dict(counters) == {"file": 1, "page_read": 2, "malformed:corrupt_stream": 1}


_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), min_size=1, max_size=40
).filter(lambda t: t.strip())


@hypothesis.settings(max_examples=60, deadline=None)
@hypothesis.given(st.lists(st.lists(_TEXT, min_size=1, max_size=4), min_size=1, max_size=4))
def test_writer_reader_round_trip(texts):
    pages = [
        Page(f"http://example.org/{i}", "2019-04-18T10:00:00Z", "\n".join(t.strip() for t in lines))
        for i, lines in enumerate(texts)
    ]
    data = b"".join(wet.encode_wet_record(p) for p in pages)
    read, counters = _read(data)
    assert read == pages
    assert counters == {"page_read": len(pages)}


def test_url_helpers_docstring_examples():
    assert normalize_url("https://www.example.com/news/?utm_source=x") == "example.com/news"
    assert normalize_url("http://example.com/news") == "example.com/news"
    assert url_host("https://News.Example.co.uk:8080/a") == "news.example.co.uk"
    assert url_host("example.org/path") == "example.org"
    assert url_rank("a") == bytes.fromhex("0cc175b9c0f1b6a831c399e269772661")  # md5("a")
