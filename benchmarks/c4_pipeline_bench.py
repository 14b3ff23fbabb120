"""C4 pipeline throughput on DirectRunner, beside the TFDS `c4` cleaning functions on the same pages.

Generates a corpus of realistic-looking web pages (no network): news-like English articles with
site navigation, JavaScript and cookie notices, citation markers and site footers shared across a
site's pages (which the span deduplication removes), syndicated copies of articles, re-captured
URLs, and some non-English, code, "lorem ipsum", menu-only and bad-word pages. Writes them as
gzipped WET files, then measures:

  * the whole pipeline (`c4_pipeline.run`) on DirectRunner: pages read per second;
  * each stage's pure function in-process (pages per second), to show where time goes;
  * the TFDS peer (`tensorflow_datasets.text.c4_utils`): the same chain of stages (split WET,
    newest page per URL, clean_page, remove_duplicate_text, detect_english, bad-words filter) as a
    Beam pipeline on the same runner and pages, and its pure functions; the ratio of pipeline
    throughputs (ours / TFDS) is reported.

TFDS counts sentences with NLTK's Punkt model, which it downloads; with no network the benchmark
gives it an untrained `PunktSentenceTokenizer`, which splits like a trained one on this text.
TFDS deduplicates lines, not three-sentence spans, and identifies the language after
deduplication, so its output differs in detail; the comparison is of throughput.

Pipelines run `--repeats` times each, alternately; the median wall time and the median CPU time of
this process are reported (CPU time barely moves when other processes load the machine).

Usage: python benchmarks/c4_pipeline_bench.py [--pages=3000] [--files=4] [--repeats=3]
                                               [--direct_num_workers=1] [--skip_tfds]
"""

import argparse
import collections
import gzip
import json
import os
import random
import tempfile
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from common import REPO  # noqa: F401 (importing it puts the repository on sys.path)

from c4_pipeline import C4Config, badwords, dedup, langid, output, rules, run, wet
from c4_pipeline.page import Page

SUBJECTS = [
    "The city council",
    "Our small team",
    "The new public library",
    "Local farmers",
    "The history museum",
    "Many visitors",
    "The school board",
    "A family bakery",
    "The river trail group",
    "Volunteers from the club",
    "The regional hospital",
    "Two local artists",
    "The football club",
    "Our editors",
    "The transport authority",
    "A group of students",
    "The harbour office",
    "Most residents",
    "The weather service",
    "The county fair",
]
VERBS = [
    "opened",
    "announced",
    "finished",
    "reviewed",
    "supported",
    "planned",
    "described",
    "celebrated",
    "improved",
    "discussed",
    "presented",
    "questioned",
    "welcomed",
    "postponed",
    "published",
]
OBJECTS = [
    "a plan for the summer season",
    "the results of the annual survey",
    "new opening hours for the weekend",
    "a proposal to repair the old bridge",
    "the budget for the coming year",
    "a festival of music and food",
    "the report on water quality",
    "an exhibition of early photographs",
    "the schedule for the bus routes",
    "a program for young readers",
    "the restoration of the town hall",
    "a campaign to plant more trees",
    "the winners of the photo contest",
    "a study of traffic near the school",
    "the menu for the charity dinner",
]
TAILS = [
    "after a long public meeting",
    "with help from the community",
    "earlier this month",
    "for the first time in years",
    "despite the heavy rain",
    "in front of a large crowd",
    "without much debate",
    "at the request of local families",
    "before the end of the week",
    "as part of a wider effort",
    "following several complaints",
    "to the surprise of many",
]
FOREIGN = {
    "fr": [
        "Le conseil municipal a présenté un nouveau projet pour la saison estivale.",
        "Les habitants du quartier ont participé à une longue réunion publique hier soir.",
        "La bibliothèque ouvrira ses portes plus tard pendant les vacances scolaires.",
        "Plusieurs associations soutiennent la rénovation de la vieille mairie du village.",
    ],
    "de": [
        "Der Stadtrat hat gestern einen neuen Plan für die Sommersaison vorgestellt.",
        "Viele Besucher kamen trotz des starken Regens zum Fest auf dem Marktplatz.",
        "Die Bibliothek verlängert ihre Öffnungszeiten während der Schulferien deutlich.",
        "Mehrere Vereine unterstützen die Renovierung des alten Rathauses im Dorf.",
    ],
    "es": [
        "El ayuntamiento presentó ayer un nuevo plan para la temporada de verano.",
        "Muchos vecinos participaron en una larga reunión pública en el centro cultural.",
        "La biblioteca ampliará su horario durante las vacaciones escolares de este año.",
        "Varias asociaciones apoyan la restauración del antiguo edificio del ayuntamiento.",
    ],
}
BOILERPLATE = [
    "Please enable JavaScript in your browser to see this content.",
    "This website uses cookies to improve your experience while you navigate.",
    "By using this site you agree to our Terms of Use and Privacy Policy.",
    "Read more...",
    "Share this article",
    "Posted in News | Tagged local, community",
]


def _sentence(rng):
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)} {rng.choice(TAILS)}."


def _site_footer(rng, site):
    name = site.split(".")[0].title()
    return [
        f"{name} is an independent newspaper run by people who live in the valley.",
        f"Send your letters and story ideas to the {name} newsroom at any time.",
        f"Copyright {rng.randint(2009, 2019)} {name} Media Group, all rights reserved today.",
    ]


def _article(rng, site, footer, body=None):
    body = body or [
        " ".join(_sentence(rng) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(2, 6))
    ]
    if rng.random() < 0.3:
        body[0] += f"[{rng.randint(1, 9)}]"
    lines = [
        f"Home | News | Sport | {site.split('.')[0].title()} | Contact",
        rng.choice(SUBJECTS) + " " + rng.choice(VERBS),
    ]
    lines += body + rng.sample(BOILERPLATE, 3) + footer
    return body, "\n".join(lines)


def make_corpus(num_pages: int, seed: int = 0, bad_words=("flibbertigibbet",)):
    """Returns [Page] with the mix described in the module docstring."""
    rng = random.Random(seed)
    sites = [
        f"{rng.choice(['valley', 'harbour', 'city', 'county', 'river', 'hill'])}{i}.example.com"
        for i in range(200)
    ]
    footers = {s: _site_footer(rng, s) for s in sites}
    pages, articles = [], []
    for i in range(num_pages):
        site = rng.choice(sites)
        url = f"https://www.{site}/2019/04/story-{i}"
        stamp = f"2019-04-{rng.randint(10, 28)}T{rng.randint(10, 23)}:00:00Z"
        kind = rng.random()
        if kind < 0.05:
            lang = rng.choice(sorted(FOREIGN))
            text = "\n".join(" ".join(rng.sample(FOREIGN[lang], 2)) for _ in range(3))
        elif kind < 0.08:
            text = (
                "Here is how we count the visitors on the site today.\nvar total = 0;\n"
                "for (var i = 0; i < n; i++) { total += visits[i]; }\nThe loop adds every visit to the total count."
            )
        elif kind < 0.10:
            text = (
                "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n"
                + _article(rng, site, [])[1]
            )
        elif kind < 0.13:
            text = "Home\nAbout us\nContact\nLogin\nSearch"
        elif kind < 0.15:
            text = (
                _article(rng, site, footers[site])[1]
                + f"\nOne reader called the mayor a {rng.choice(bad_words)} in the comments."
            )
        elif kind < 0.20 and articles:
            text = _article(rng, site, footers[site], body=list(rng.choice(articles)))[
                1
            ]  # syndicated copy
        else:
            body, text = _article(rng, site, footers[site])
            articles.append(body)
        pages.append(Page(url, stamp, text))
        if rng.random() < 0.03:  # an older capture of the same URL
            pages.append(Page(url.replace("https://www.", "http://"), "2018-12-01T00:00:00Z", text))
    return pages


def write_wet(pages, directory, num_files):
    paths = []
    for f in range(num_files):
        path = os.path.join(directory, f"bench-{f:05d}.warc.wet.gz")
        with open(path, "wb") as out:
            for page in pages[f::num_files]:
                out.write(gzip.compress(wet.encode_wet_record(page), compresslevel=1))
        paths.append(path)
    return paths


def _rate(n, seconds):
    return round(n / seconds, 1) if seconds > 0 else float("inf")


def _tfds_utils():
    from nltk.tokenize.punkt import PunktSentenceTokenizer
    from tensorflow_datasets.text import c4_utils

    c4_utils._SENTENCE_TOKENIZER = PunktSentenceTokenizer()  # no download; see module docstring
    return c4_utils


def _timed(fn, items):
    fn(items[:1])  # warm-up: lazy imports, langdetect profile loading
    t = time.perf_counter()
    result = fn(items)
    return result, _rate(len(items), time.perf_counter() - t)


def time_stages(pages, words, with_tfds):
    """Pages per second of each stage's pure function, ours and TFDS's on the same input pages.

    Stages run in pipeline order (clean, span_dedup, langid, badwords); each stage's input is our
    previous stage's output, and TFDS's function for that stage gets the same pages.
    """
    counters = collections.Counter()
    words_filter = badwords.BadWordsFilter(words)
    rates = {}
    cleaned, rates["clean"] = _timed(
        lambda ps: [
            p._replace(text=c) for p in ps if (c := rules.clean_text(p.text, counters)) is not None
        ],
        pages,
    )
    deduplicated, rates["span_dedup"] = _timed(
        lambda ps: dedup.deduplicate_in_memory(ps, counters), cleaned
    )
    english, rates["langid"] = _timed(
        lambda ps: [p for p in ps if langid.is_english(p.text, counters)], deduplicated
    )
    _, rates["badwords"] = _timed(
        lambda ps: [p for p in ps if words_filter(p.text, counters)], english
    )
    report = {stage: {"ours": rate} for stage, rate in rates.items()}
    if not with_tfds:
        return report
    c4_utils = _tfds_utils()

    def as_tfds(ps, language=None):
        return [
            c4_utils.PageFeatures(
                url=p.url,
                normalized_url=c4_utils.normalize_url(p.url),
                text=p.text,
                timestamp=p.timestamp,
                language=language,
            )
            for p in ps
        ]

    clean_page = c4_utils.get_clean_page_fn()
    bad = c4_utils.get_badwords_filter_fn({"en": list(words)})
    _, report["clean"]["tfds"] = _timed(
        lambda ps: [c for p in ps for c in clean_page(p)], as_tfds(pages)
    )
    _, report["langid"]["tfds"] = _timed(
        lambda ps: [e for p in ps for e in c4_utils.detect_english(p)], as_tfds(deduplicated)
    )
    _, report["badwords"]["tfds"] = _timed(
        lambda ps: [p for p in ps if bad(p)], as_tfds(english, "en")
    )
    return report


def run_tfds_pipeline(wet_paths, words, options, out_dir):
    """The TFDS stage chain as a Beam pipeline; returns its counters."""
    c4_utils = _tfds_utils()
    bad = c4_utils.get_badwords_filter_fn({"en": list(words)})
    with beam.Pipeline(options=options) as pipeline:
        pages = (
            pipeline
            | beam.Create(wet_paths)
            | beam.Reshuffle()
            | beam.FlatMap(c4_utils.split_wet_file)
            | beam.Map(lambda page: (page.normalized_url, page))
            | beam.CombinePerKey(c4_utils.select_newest_page)
            | beam.Values()
            | beam.FlatMap(c4_utils.get_clean_page_fn())
        )
        _ = (
            c4_utils.remove_duplicate_text(pages)
            | beam.FlatMap(c4_utils.detect_english)
            | beam.Filter(bad)
            | beam.Map(_tf_example)
            | beam.io.WriteToTFRecord(os.path.join(out_dir, "tfds-c4-train.tfrecord"))
        )
    return output.collect_counters(pipeline.result)


def _tf_example(page):
    """Serializes a TFDS page as TFDS's writer would: a tf.train.Example built with TensorFlow."""
    import tensorflow as tf

    def feature(value):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value.encode("utf-8")]))

    features = {
        "text": feature(page.text),
        "url": feature(page.url),
        "timestamp": feature(page.timestamp),
    }
    return tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString()


def _measure(fn):
    """Runs `fn()`; returns (its result, wall seconds, CPU seconds of this process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = fn()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def _summary(num_pages, samples):
    walls, cpus = sorted(s[0] for s in samples), sorted(s[1] for s in samples)
    wall, cpu = walls[len(walls) // 2], cpus[len(cpus) // 2]
    return {
        "wall_s": [round(w, 2) for w, _ in samples],
        "cpu_s": [round(c, 2) for _, c in samples],
        "pages_per_s": _rate(num_pages, wall),
        "pages_per_cpu_s": _rate(num_pages, cpu),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=3000)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument(
        "--repeats", type=int, default=3, help="pipeline runs each (median reported)"
    )
    parser.add_argument("--direct_num_workers", type=int, default=1)
    parser.add_argument("--skip_tfds", action="store_true")
    args = parser.parse_args()
    beam_flags = ["--runner=DirectRunner", f"--direct_num_workers={args.direct_num_workers}"]
    if args.direct_num_workers > 1:
        # NOTE: worker processes' CPU time is not counted in pages_per_cpu_s then.
        beam_flags.append("--direct_running_mode=multi_processing")
    words = [f"badword{i}" for i in range(400)] + ["flibbertigibbet"]

    pages = make_corpus(args.pages)
    report = {"pages_generated": len(pages), "beam_flags": beam_flags}
    ours, theirs = [], []
    # Warm-up outside the timings: TensorFlow's import (TFDS reads WET files with tf.io.gfile)
    # and both langdetect profile loads are one-time costs per process.
    langid.is_english("warm up the language profiles", collections.Counter())
    if not args.skip_tfds:
        import langdetect
        import tensorflow  # noqa: F401

        _tfds_utils()
        langdetect.detect_langs("warm up the language profiles")
    with tempfile.TemporaryDirectory() as tmp:
        wet_paths = write_wet(pages, tmp, args.files)
        for repeat in range(args.repeats):  # Alternate the two, so load changes hit both alike.
            config = C4Config(
                wet_paths=tuple(wet_paths),
                output_dir=os.path.join(tmp, f"out{repeat}"),
                badwords=tuple(words),
            )
            stats, wall, cpu = _measure(lambda: run(config, PipelineOptions(beam_flags)))
            ours.append((wall, cpu))
            report["ours_counters"] = stats["counters"]
            if not args.skip_tfds:
                counters, wall, cpu = _measure(
                    lambda: run_tfds_pipeline(wet_paths, words, PipelineOptions(beam_flags), tmp)
                )
                theirs.append((wall, cpu))
                report["tfds_counters"] = counters
        report["ours_pipeline"] = _summary(len(pages), ours)
        if theirs:
            report["tfds_pipeline"] = _summary(len(pages), theirs)
            report["ratio_ours_over_tfds"] = {
                key: round(report["ours_pipeline"][key] / report["tfds_pipeline"][key], 2)
                for key in ("pages_per_s", "pages_per_cpu_s")
            }
        report["stages_pages_per_s"] = time_stages(pages, words, with_tfds=not args.skip_tfds)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
