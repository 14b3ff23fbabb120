"""Command line: `python -m c4_pipeline --wet_paths=... --output_dir=... [Beam flags]`.

Flags this module does not know (`--runner`, `--project`, `--region`, `--temp_location`,
`--flink_master`, `--spark_master_url`, `--direct_num_workers`, ...) go to Beam's
`PipelineOptions`, so the same command runs on any runner.
"""

import argparse
import json
import logging
import sys
from typing import Optional, Sequence

from apache_beam.options.pipeline_options import PipelineOptions

from c4_pipeline import badwords, langid, pipeline, variants


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Splits `argv` into this pipeline's flags and the Beam flags it passes on."""
    parser = argparse.ArgumentParser(
        prog="python -m c4_pipeline",
        description="Build C4 (the T5 paper's Colossal Clean Crawled Corpus) from WET files.",
    )
    add = parser.add_argument
    add(
        "--wet_paths",
        required=True,
        help="comma-separated WET files or glob patterns (local, gs://, s3://, hdfs://)",
    )
    add("--output_dir", required=True, help="directory for the shards and stats.json")
    add("--variant", default="c4", choices=pipeline.VARIANTS)
    add(
        "--badwords_file",
        default="",
        help="bad-words list, one per line; default: download the pinned LDNOOBW 'en' list",
    )
    add(
        "--badwords_url",
        default=badwords.BADWORDS_URL,
        help="where to download the bad-words list when --badwords_file is not given",
    )
    add("--domains_file", default="", help="realnewslike: one domain per line")
    add("--urls_file", default="", help="webtextlike: one URL per line")
    add("--min_language_probability", type=float, default=langid.MIN_ENGLISH_PROBABILITY)
    add(
        "--validation_fraction",
        type=float,
        default=0.0,
        help="share of pages (by URL hash) written to a validation split",
    )
    add("--num_shards", type=int, default=0, help="shards per split; 0: runner decides")
    return parser.parse_known_args(argv)


def config_from_args(args: argparse.Namespace) -> pipeline.C4Config:
    """Builds the config: checks the paths first (nothing read or downloaded yet), then loads
    the bad-words, domain and URL lists the variant needs.

    Raises:
        ValueError: a path that matches nothing, an output directory that holds shards or
            inputs, a list that cannot be read (the download named), a bad setting.
    """
    wet_paths = tuple(p.strip() for p in args.wet_paths.split(",") if p.strip())
    lists = [path for path in (args.badwords_file, args.domains_file, args.urls_file) if path]
    pipeline.check_inputs(wet_paths, args.output_dir, lists)
    words = ()
    if args.variant != "unfiltered":
        words = tuple(badwords.load_badwords(args.badwords_file or args.badwords_url))
    domains = tuple(variants.read_list(args.domains_file)) if args.variant == "realnewslike" else ()
    return pipeline.C4Config(
        wet_paths=wet_paths,
        output_dir=args.output_dir,
        variant=args.variant,
        badwords=words,
        domains=domains,
        urls_path=args.urls_file,
        min_language_probability=args.min_language_probability,
        validation_fraction=args.validation_fraction,
        num_shards=args.num_shards,
    )


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs the pipeline; exit 2 with one line for bad input (paths, lists, flags), 1 for a run
    that read or kept nothing, and a traceback only for a bug."""
    logging.basicConfig(level=logging.INFO)
    args, beam_args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        config = config_from_args(args)
    except (ValueError, OSError) as error:
        print(f"python -m c4_pipeline: error: {error}", file=sys.stderr)
        return 2
    stats = pipeline.run(config, PipelineOptions(beam_args))
    counters = stats["counters"]
    print(json.dumps(counters, indent=2, sort_keys=True))
    problem = empty_run(counters)
    if problem:
        print(
            f"python -m c4_pipeline: error: {problem} (counters above and in "
            f"{args.output_dir}/stats.json); check --wet_paths.",
            file=sys.stderr,
        )
        return 1
    return 0


def empty_run(counters: dict) -> str:
    """Why a finished run produced nothing usable ("" when it wrote pages)."""
    read = counters.get("read", {})
    if not read.get("page_read"):
        malformed = sum(v for k, v in read.items() if k.startswith("malformed:"))
        return f"no page was read from {read.get('file', 0)} WET file(s)" + (
            f"; {malformed} malformed record(s) skipped" if malformed else ""
        )
    if not sum(counters.get("write", {}).values()):
        return f"{read['page_read']} pages were read, but every one was filtered out"
    return ""


if __name__ == "__main__":
    sys.exit(main())
