"""Reading Common Crawl WET files (WARC records of extracted text) into pages.

A WET file is a sequence of WARC records, usually gzip-compressed one record per gzip member:

    WARC/1.0
    WARC-Type: conversion
    WARC-Target-URI: https://example.com/a
    WARC-Date: 2019-04-18T10:00:00Z
    Content-Length: 38
    <blank line>
    <38 bytes of UTF-8 text>
    <blank line><blank line>

Records are read by their Content-Length, so page text may contain anything, including lines that
look like headers. Crawls contain damaged records; a bad record is counted and skipped, the reader
resynchronises at the next "WARC/" line, and a damaged stream (truncated gzip) ends its file
without failing the pipeline.

Counter names (namespace `read`):
  file                         WET files opened
  record:warcinfo              file-description records (skipped)
  record:other                 records of other WARC types (skipped)
  page_read                    conversion records turned into pages
  page_dropped:empty           conversion records with no text
  malformed:unexpected_data    runs of bytes between records that are not a record
  malformed:bad_header         header lines without "name: value", or headers cut off by the end
  malformed:bad_content_length missing, non-numeric or implausible (> 64 MiB) Content-Length
  malformed:truncated          records whose body is shorter than its Content-Length
  malformed:missing_uri        conversion records without WARC-Target-URI
  malformed:missing_date       conversion records without WARC-Date
  malformed:bad_utf8           conversion records whose text is not UTF-8
  malformed:corrupt_stream     files whose compression stream is damaged (reading stops there)
"""

import collections
import gzip
import io
import zlib
from typing import BinaryIO, Iterator, Optional

from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from c4_pipeline.page import Page

_VERSION_PREFIX = b"WARC/"
# NOTE: WET bodies are extracted text, rarely above 1 MB. A larger Content-Length is a damaged
# header; trusting it would swallow the following records (or allocate gigabytes at once).
MAX_RECORD_BYTES = 64 * 2**20
_CHUNK_BYTES = 2**20


def _next_version_line(
    stream: BinaryIO, counters: collections.Counter, *, after_bad_record: bool
) -> bool:
    """Advances past the next "WARC/..." line; returns False at the end of the stream.

    Non-blank lines before it are counted once as `malformed:unexpected_data`, unless they are the
    rest of a record already counted as malformed (`after_bad_record`).
    """
    counted = after_bad_record
    for line in iter(stream.readline, b""):
        if line.startswith(_VERSION_PREFIX):
            return True
        if line.strip() and not counted:
            counters["malformed:unexpected_data"] += 1
            counted = True
    return False


def _read_exactly(stream: BinaryIO, size: int) -> Optional[bytes]:
    """Reads `size` bytes in bounded chunks; None when the stream ends first."""
    chunks, remaining = [], size
    while remaining:
        chunk = stream.read(min(remaining, _CHUNK_BYTES))
        if not chunk:
            return None
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def _read_headers(stream: BinaryIO, counters: collections.Counter) -> Optional[dict[str, str]]:
    """Reads "name: value" lines up to the blank line; None (counted) when they are malformed."""
    headers = {}
    for raw in iter(stream.readline, b""):
        line = raw.strip()
        if not line:
            return headers
        name, sep, value = line.decode("utf-8", errors="replace").partition(":")
        if not sep:
            counters["malformed:bad_header"] += 1
            return None
        headers[name.strip().lower()] = value.strip()
    counters["malformed:bad_header"] += 1
    return None


def _to_page(headers: dict[str, str], body: bytes, counters: collections.Counter) -> Optional[Page]:
    url = headers.get("warc-target-uri")
    timestamp = headers.get("warc-date")
    if not url:
        counters["malformed:missing_uri"] += 1
        return None
    if not timestamp:
        counters["malformed:missing_date"] += 1
        return None
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        counters["malformed:bad_utf8"] += 1
        return None
    text = "\n".join(line.rstrip() for line in text.replace("\r\n", "\n").split("\n")).strip()
    if not text:
        counters["page_dropped:empty"] += 1
        return None
    counters["page_read"] += 1
    return Page(url=url, timestamp=timestamp, text=text)


def iter_wet_pages(stream: BinaryIO, counters: collections.Counter) -> Iterator[Page]:
    """Yields the pages of an uncompressed WET byte stream, skipping (and counting) bad records.

    Args:
        stream: a binary file object positioned at the start of a WET file.
        counters: incremented with the names listed in the module docstring.

    Yields:
        One `Page` per well-formed `conversion` record, in file order.
    """
    after_bad_record = False
    try:
        while _next_version_line(stream, counters, after_bad_record=after_bad_record):
            after_bad_record = True
            headers = _read_headers(stream, counters)
            if headers is None:
                continue
            length = headers.get("content-length", "")
            if not length.isdigit() or int(length) > MAX_RECORD_BYTES:
                counters["malformed:bad_content_length"] += 1
                continue
            after_bad_record = False
            body = _read_exactly(stream, int(length))
            if body is None:
                counters["malformed:truncated"] += 1
                return
            record_type = headers.get("warc-type", "")
            if record_type == "warcinfo":
                counters["record:warcinfo"] += 1
            elif record_type != "conversion":
                counters["record:other"] += 1
            else:
                page = _to_page(headers, body, counters)
                if page is not None:
                    yield page
    except (EOFError, OSError, zlib.error):
        counters["malformed:corrupt_stream"] += 1


def read_wet_file(path: str, counters: collections.Counter) -> Iterator[Page]:
    """Yields the pages of one WET file, local or remote (any path Beam's file systems open).

    Files ending in ".gz" are decompressed with Python's gzip reader, which handles the one gzip
    member per record layout of Common Crawl files.
    """
    counters["file"] += 1
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as raw:
        if path.endswith(".gz"):
            with gzip.GzipFile(fileobj=raw) as stream:
                yield from iter_wet_pages(stream, counters)
        else:
            stream = raw if hasattr(raw, "readline") else io.BufferedReader(raw)
            yield from iter_wet_pages(stream, counters)


def encode_wet_record(page: Page) -> bytes:
    """Returns `page` as one WET conversion record (the inverse of `iter_wet_pages`).

    Used to build WET files for tests and benchmarks, and to re-export pages as WET.
    """
    body = page.text.encode("utf-8")
    header = (
        "WARC/1.0\r\n"
        "WARC-Type: conversion\r\n"
        f"WARC-Target-URI: {page.url}\r\n"
        f"WARC-Date: {page.timestamp}\r\n"
        "Content-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\n"
        "\r\n"
    )
    return header.encode("utf-8") + body + b"\r\n\r\n"
