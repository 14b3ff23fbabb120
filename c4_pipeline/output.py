"""Writing the corpus as sharded TFRecord files of `tf.train.Example`, and the stats file.

Why TFRecord rather than JSONL: seqio reads TFRecord files of Examples natively
(`seqio.TFExampleDataSource`), inside the tf.data graph, in parallel across shards, with no Python
parsing step; JSONL would need a Python JSON parser in the input pipeline. The layout matches the
TFDS `c4` dataset: one Example per page with bytes features `text`, `url` and `timestamp`.

The Example protocol buffer is encoded here by hand (it is three nested length-delimited
messages), so workers need neither TensorFlow nor its protobuf classes; the tests decode the
bytes with TensorFlow's own parser.

Files: `<output_dir>/c4-<split>.tfrecord-SSSSS-of-NNNNN` and `<output_dir>/stats.json`.

Counter names (namespace `write`): `page_written:<split>` pages written to each split.
"""

import collections
import hashlib
import json
from typing import Mapping

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems

from c4_pipeline import counting
from c4_pipeline.page import Page

TRAIN, VALIDATION = "train", "validation"
STATS_FILE = "stats.json"
FEATURES = ("text", "url", "timestamp")


def shard_prefix(output_dir: str, split: str) -> str:
    """Returns the path prefix of a split's shards; seqio reads `prefix + "-*"`."""
    return FileSystems.join(output_dir, f"c4-{split}.tfrecord")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _length_delimited(field_number: int, payload: bytes) -> bytes:
    return _varint(field_number << 3 | 2) + _varint(len(payload)) + payload


def encode_example(features: Mapping[str, str]) -> bytes:
    """Serializes a `tf.train.Example` whose features each hold one UTF-8 string.

    Example message: features(1) -> map entries feature(1) {key(1), value(2): Feature
    {bytes_list(1): BytesList {value(1)}}}. Keys are written in sorted order, as TensorFlow does,
    so equal inputs give equal bytes. `encode_example({"a": "b"})` is
    b"\\n\\x0c\\n\\n\\n\\x01a\\x12\\x05\\n\\x03\\n\\x01b".
    """
    entries = b""
    for key in sorted(features):
        bytes_list = _length_delimited(1, features[key].encode("utf-8"))
        feature = _length_delimited(1, bytes_list)
        entry = _length_delimited(1, key.encode("utf-8")) + _length_delimited(2, feature)
        entries += _length_delimited(1, entry)
    return _length_delimited(1, entries)


def page_split(page: Page, validation_fraction: float) -> str:
    """Assigns a page to a split by the MD5 of its URL (stable across runs and workers)."""
    if validation_fraction <= 0:
        return TRAIN
    point = int.from_bytes(hashlib.md5(page.url.encode("utf-8")).digest()[:8], "big") / 2**64
    return VALIDATION if point < validation_fraction else TRAIN


def _encode(page: Page, counters: collections.Counter, split: str) -> list[bytes]:
    counters[f"page_written:{split}"] += 1
    return [encode_example({"text": page.text, "url": page.url, "timestamp": page.timestamp})]


class WriteSplits(beam.PTransform):
    """Writes pages to TFRecord shards, split into train (and validation when the fraction > 0).

    Args:
        output_dir: a local or remote directory.
        validation_fraction: the share of pages (by URL hash) written to the validation split.
        num_shards: shards per split; 0 lets the runner choose.
    """

    def __init__(self, output_dir: str, validation_fraction: float = 0.0, num_shards: int = 0):
        super().__init__()
        self._output_dir = output_dir
        self._validation_fraction = validation_fraction
        self._num_shards = num_shards

    def expand(self, pages):
        splits = [TRAIN] + ([VALIDATION] if self._validation_fraction > 0 else [])
        parts = pages | "Split" >> beam.Partition(
            lambda page, n: splits.index(page_split(page, self._validation_fraction)), len(splits)
        )
        written = {}
        for split, part in zip(splits, parts):
            written[split] = (
                part
                | f"Encode{split.title()}"
                >> beam.ParDo(counting.CountingFn("write", _encode, split=split))
                | f"Write{split.title()}"
                >> beam.io.WriteToTFRecord(
                    shard_prefix(self._output_dir, split), num_shards=self._num_shards
                )
            )
        return written


def collect_counters(result) -> dict[str, dict[str, int]]:
    """Returns {namespace: {counter: value}} from a finished pipeline's metrics.

    Counters of the same name reported by several steps are summed. Committed values are used
    where the runner reports them, attempted values otherwise.
    """
    totals = collections.defaultdict(collections.Counter)
    for counter in result.metrics().query()["counters"]:
        name = counter.key.metric
        try:
            value = counter.committed
        except Exception:  # Some runners raise instead of returning None for committed values.
            value = None
        totals[name.namespace][name.name] += value if value is not None else counter.attempted
    return {ns: dict(sorted(c.items())) for ns, c in sorted(totals.items())}


def write_stats(output_dir: str, stats: Mapping) -> str:
    """Writes `stats` as JSON to `<output_dir>/stats.json` and returns the path."""
    path = FileSystems.join(output_dir, STATS_FILE)
    with FileSystems.create(path) as f:
        f.write(json.dumps(stats, indent=2, sort_keys=True).encode("utf-8"))
    return path
