"""The C4 pipeline: WET files in, a cleaned, deduplicated English corpus out.

Stages, each a Beam transform with its own counter namespace in the stats file:

  read        WET files -> pages (malformed records counted and skipped)
  url_dedup   one page per normalized URL: the newest capture
  variant     RealNews-like: listed domains only; WebText-like: listed URLs only
  clean       line rules, "lorem ipsum" and "{" pages, at least 3 sentences
  span_dedup  repeated three-sentence spans kept once across the corpus
  langid      English with probability >= 0.99 (langdetect, deterministic)
  badwords    pages with a word of the bad-words list dropped
  write       TFRecord shards of tf.train.Example (text, url, timestamp)

The unfiltered variant runs read, url_dedup, langid (on the raw text) and write only.

The order after cleaning is the one of the T5 authors' implementation (TFDS `c4`): language
identification and the bad-words filter judge the text that will be written, after
deduplication. It is also the cheap order: langdetect, by far the slowest stage, sees fewer and
shorter pages. The price: a page dropped after deduplication (not English, or with a bad word)
may have been the keeper of a repeated span, which then leaves the corpus entirely; repeated
spans are mostly boilerplate, so little is lost.

Only Beam primitives are used (Create, Reshuffle, ParDo, GroupByKey, CoGroupByKey,
CombinePerKey, Partition, ReadFromText, WriteToTFRecord), so the pipeline runs unchanged on the
DirectRunner, Dataflow, Flink and Spark.
"""

import collections
import dataclasses
import os
from typing import Iterable, Optional, Sequence

import apache_beam as beam
from apache_beam.io import fileio
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from c4_pipeline import badwords, counting, dedup, langid, output, rules, variants, wet
from c4_pipeline.page import Page, normalize_url

VARIANTS = ("c4", "unfiltered", "realnewslike", "webtextlike")


@dataclasses.dataclass(frozen=True)
class C4Config:
    """What the pipeline reads, how it filters, and where it writes.

    Attributes:
        wet_paths: WET file paths or glob patterns, local or remote (gs://, s3://, hdfs://).
        output_dir: where the shards and `stats.json` go; must not already hold shards.
        variant: one of `VARIANTS`.
        badwords: the bad-words list (`badwords.load_badwords`); required except for unfiltered.
        domains: RealNews-like: the news domains to keep.
        urls_path: WebText-like: a file with one URL per line.
        min_language_probability: langdetect's English probability threshold.
        validation_fraction: the share of pages (by URL hash) written to a validation split.
        num_shards: TFRecord shards per split; 0 lets the runner decide.
    """

    wet_paths: tuple[str, ...]
    output_dir: str
    variant: str = "c4"
    badwords: tuple[str, ...] = ()
    domains: tuple[str, ...] = ()
    urls_path: str = ""
    min_language_probability: float = langid.MIN_ENGLISH_PROBABILITY
    validation_fraction: float = 0.0
    num_shards: int = 0

    def __post_init__(self):
        if isinstance(self.wet_paths, str) or not self.wet_paths:
            raise ValueError(
                f"wet_paths must be a non-empty tuple of paths or patterns; got {self.wet_paths!r}."
            )
        if not self.output_dir:
            raise ValueError("output_dir must name a directory; got an empty string.")
        if self.variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}; got {self.variant!r}.")
        if self.variant != "unfiltered" and not self.badwords:
            raise ValueError(
                f"The {self.variant!r} variant filters bad words: pass the list "
                "(badwords.load_badwords(), or --badwords_file on the command line)."
            )
        if self.variant == "realnewslike" and not self.domains:
            raise ValueError("The 'realnewslike' variant needs domains (--domains_file).")
        if self.variant == "webtextlike" and not self.urls_path:
            raise ValueError("The 'webtextlike' variant needs a URL list file (--urls_file).")
        if not 0.0 <= self.min_language_probability <= 1.0:
            raise ValueError(
                f"min_language_probability must be in [0, 1]; got {self.min_language_probability}."
            )
        if not 0.0 <= self.validation_fraction < 1.0:
            raise ValueError(
                f"validation_fraction must be in [0, 1); got {self.validation_fraction}."
            )
        if self.num_shards < 0:
            raise ValueError(f"num_shards must be >= 0 (0: runner decides); got {self.num_shards}.")


class ReadWetFiles(beam.PTransform):
    """PBegin -> PCollection[Page] from WET files matched by path patterns."""

    def __init__(self, patterns: Iterable[str]):
        super().__init__()
        self._patterns = list(patterns)

    def expand(self, pbegin):
        return (
            pbegin
            | "Patterns" >> beam.Create(self._patterns)
            | "Match" >> fileio.MatchAll()
            | "Paths" >> beam.Map(lambda metadata: metadata.path)
            | "SpreadFiles" >> beam.Reshuffle()
            | "Parse" >> beam.ParDo(counting.CountingFn("read", wet.read_wet_file))
        )


class _NewestCapture(beam.CombineFn):
    """Combines the captures of one URL into (newest page, number of captures)."""

    def create_accumulator(self):
        return (None, 0)

    def add_input(self, accumulator, page):
        best, count = accumulator
        return (self._newer(best, page), count + 1)

    def merge_accumulators(self, accumulators):
        best, count = None, 0
        for other, other_count in accumulators:
            best, count = self._newer(best, other), count + other_count
        return (best, count)

    def extract_output(self, accumulator):
        return accumulator

    @staticmethod
    def _newer(a: Optional[Page], b: Optional[Page]) -> Optional[Page]:
        if a is None or b is None:
            return a if b is None else b
        # Ties on the timestamp are broken by the page key, so the choice is deterministic.
        return max(a, b, key=lambda p: (p.timestamp, dedup.page_key(p)))


def _count_captures(element, counters: collections.Counter) -> list[Page]:
    _, (page, captures) = element
    if captures > 1:
        counters["page_dropped:duplicate_url"] += captures - 1
    counters["page_kept"] += 1
    return [page]


class DropDuplicateUrls(beam.PTransform):
    """Keeps the newest capture of each normalized URL (namespace `url_dedup`).

    Counters: `page_dropped:duplicate_url` older captures dropped, `page_kept` pages kept.
    """

    def expand(self, pages):
        return (
            pages
            | "KeyByUrl" >> beam.Map(lambda page: (normalize_url(page.url), page))
            | "NewestCapture" >> beam.CombinePerKey(_NewestCapture())
            | "Count" >> beam.ParDo(counting.CountingFn("url_dedup", _count_captures))
        )


def _clean(page: Page, counters: collections.Counter) -> list[Page]:
    text = rules.clean_text(page.text, counters)
    return [] if text is None else [page._replace(text=text)]


def _drop_bad_words(page: Page, counters: collections.Counter, words_filter) -> list[Page]:
    if not words_filter(page.text, counters):
        return []
    counters["page_kept"] += 1
    return [page]


def _keep_english(page: Page, counters: collections.Counter, min_probability: float) -> list[Page]:
    return [page] if langid.is_english(page.text, counters, min_probability) else []


def build(pipeline: beam.Pipeline, config: C4Config) -> dict:
    """Adds the C4 stages for `config` to `pipeline`; returns the write results by split."""
    pages = (
        pipeline
        | "Read" >> ReadWetFiles(config.wet_paths)
        | "DropDuplicateUrls" >> DropDuplicateUrls()
    )
    if config.variant == "realnewslike":
        domain_filter = variants.DomainFilter(config.domains)
        pages = pages | "KeepListedDomains" >> beam.ParDo(
            counting.CountingFn("variant", domain_filter)
        )
    elif config.variant == "webtextlike":
        pages = pages | "KeepListedUrls" >> variants.FilterByUrlList(config.urls_path)
    if config.variant != "unfiltered":
        pages = (
            pages
            | "Clean" >> beam.ParDo(counting.CountingFn("clean", _clean))
            | "DeduplicateSpans" >> dedup.DeduplicateSpans()
        )
    pages = pages | "KeepEnglish" >> beam.ParDo(
        counting.CountingFn(
            "langid", _keep_english, min_probability=config.min_language_probability
        )
    )
    if config.variant != "unfiltered":
        words_filter = badwords.BadWordsFilter(config.badwords)
        pages = pages | "DropBadWords" >> beam.ParDo(
            counting.CountingFn("badwords", _drop_bad_words, words_filter=words_filter)
        )
    return pages | "Write" >> output.WriteSplits(
        config.output_dir, config.validation_fraction, config.num_shards
    )


def check_paths(config: C4Config, other_inputs: Sequence[str] = ()) -> None:
    """Fails early, before any worker starts, on inputs that match nothing or a used output_dir
    (`check_inputs` for the run's config).

    Raises:
        ValueError: see `check_inputs`.
    """
    check_inputs(config.wet_paths, config.output_dir, other_inputs)


def check_inputs(
    wet_paths: Sequence[str], output_dir: str, other_inputs: Sequence[str] = ()
) -> None:
    """Fails on inputs that match nothing, an output directory that already holds shards, or
    one that is or contains an input; reads no list and downloads nothing.

    Args:
        wet_paths: WET files or glob patterns.
        output_dir: where the shards would go.
        other_inputs: more files the run reads (word, domain and URL lists).

    Raises:
        ValueError: naming the pattern that matched no file, the shards already present, or the
            input the output directory would hold.
    """
    if not wet_paths:
        raise ValueError("--wet_paths names no file; pass WET files or glob patterns.")
    matches = FileSystems.match(list(wet_paths))
    for pattern, match in zip(wet_paths, matches):
        if not match.metadata_list:
            raise ValueError(
                f"No WET file matches {pattern!r}. Pass existing files or glob patterns, e.g. "
                "--wet_paths='/data/CC-MAIN-2019-18/*.warc.wet.gz'."
            )
    target = _real(output_dir)
    read = [m.path for match in matches for m in match.metadata_list] + list(other_inputs)
    for path in read:
        source = _real(path)
        if source == target or source.startswith(target.rstrip("/") + "/"):
            raise ValueError(
                f"--output_dir {output_dir!r} is or contains the input {path!r}; write the "
                "shards to a directory outside the inputs."
            )
    existing = FileSystems.match([output.shard_prefix(output_dir, "*") + "-*"])[0]
    if existing.metadata_list:
        raise ValueError(
            f"{output_dir!r} already holds shards (e.g. {existing.metadata_list[0].path}); "
            "write to an empty directory or delete them, so old and new shards do not mix."
        )


def _real(path: str) -> str:
    """A local path made absolute (links resolved); a remote one (gs://, s3://) as given."""
    return path if "://" in path else os.path.realpath(path)  # local path: checked local


def run(config: C4Config, options: Optional[PipelineOptions] = None) -> dict:
    """Runs the pipeline to completion and writes `<output_dir>/stats.json`.

    Args:
        config: the run's configuration.
        options: Beam pipeline options (runner and its flags); DirectRunner when None.

    Returns:
        The stats written: {"config": ..., "counters": {namespace: {name: value}}}.
    """
    check_paths(config)
    pipeline = beam.Pipeline(options=options or PipelineOptions())
    build(pipeline, config)
    result = pipeline.run()
    result.wait_until_finish()
    stats = {
        "config": {
            "wet_paths": list(config.wet_paths),
            "variant": config.variant,
            "badwords": len(config.badwords),
            "domains": len(config.domains),
            "urls_path": config.urls_path,
            "min_language_probability": config.min_language_probability,
            "validation_fraction": config.validation_fraction,
        },
        "counters": output.collect_counters(result),
    }
    output.write_stats(config.output_dir, stats)
    return stats
