"""The whole pipeline on DirectRunner over a WET fixture: surviving text and the stats file."""

import collections
import json

import pytest
import tensorflow as tf

from c4_pipeline import C4Config, dedup, langid, pipeline, run
from c4_pipeline.page import Page


def _read_shards(pattern):
    files = sorted(tf.io.gfile.glob(pattern))
    spec = {k: tf.io.FixedLenFeature([], tf.string) for k in ("text", "url", "timestamp")}
    pages = []
    for record in tf.data.TFRecordDataset(files):
        parsed = tf.io.parse_single_example(record, spec)
        pages.append(
            Page(*(parsed[k].numpy().decode("utf-8") for k in ("url", "timestamp", "text")))
        )
    return files, sorted(pages)


def test_surviving_text(c4_run, wet_corpus):
    fx = wet_corpus
    _, out = c4_run
    files, pages = _read_shards(f"{out}/c4-train.tfrecord-*")
    assert [f.rsplit("/", 1)[1] for f in files] == [
        "c4-train.tfrecord-00000-of-00002",
        "c4-train.tfrecord-00001-of-00002",
    ]
    farm_body, bakery_body = "\n".join(fx.FARM_BODY), " ".join(fx.BAKERY_BODY)
    footer = "\n".join(fx.FOOTER)
    farm = Page(fx.FARM.url, fx.FARM.timestamp, farm_body + "\n" + footer)
    bakery = Page(fx.BAKERY.url, fx.BAKERY.timestamp, bakery_body + "\n" + " ".join(fx.FOOTER))
    # The shared footer stays in the page with the smaller key; the bakery's repeated body goes.
    if dedup.page_key(farm) < dedup.page_key(bakery):
        expected = [bakery._replace(text=bakery_body), farm]
    else:
        expected = [bakery, farm._replace(text=farm_body)]
    assert pages == sorted(expected)


def test_stats_file(c4_run, wet_corpus):
    fx = wet_corpus
    _, out = c4_run
    stats = json.loads((out / "stats.json").read_text())
    farm_keeps_footer = any(
        fx.FOOTER[0] in p.text and p.url == fx.FARM.url
        for p in _read_shards(f"{out}/c4-train.tfrecord-*")[1]
    )
    assert stats["config"]["variant"] == "c4" and stats["config"]["badwords"] == 2
    assert stats["counters"] == {
        "read": {
            "file": 2,
            "page_read": 8,
            "record:warcinfo": 1,
            "malformed:unexpected_data": 1,
            "malformed:bad_content_length": 1,
            "malformed:truncated": 1,
        },
        "url_dedup": {"page_dropped:duplicate_url": 1, "page_kept": 7},
        "clean": {
            "citation_removed": 1,
            "line_dropped:javascript": 1,
            "line_dropped:no_terminal_punctuation": 8,
            "line_dropped:policy": 1,
            "line_kept": 22,
            "page_dropped:curly_bracket": 1,
            "page_dropped:lorem_ipsum": 1,
            "page_dropped:too_few_sentences": 1,
            "page_kept": 4,
        },
        "span_dedup": {
            "span_repeated": 2,
            "span_occurrence_dropped": 2,
            "sentence_dropped": 6,
            "page_changed": 1 if farm_keeps_footer else 2,
            "page_kept": 4,
        },
        "langid": {
            "detected:en": 3,
            "detected:fr": 1,
            "page_dropped:not_english": 1,
            "page_kept": 3,
        },
        "badwords": {"page_dropped:bad_words": 1, "page_kept": 2},
        "write": {"page_written:train": 2},
    }


def test_rerun_into_a_used_directory_is_refused(c4_run):
    root, out = c4_run
    with pytest.raises(ValueError, match="already holds shards"):
        run(C4Config(wet_paths=(f"{root}/*.gz",), output_dir=str(out), badwords=("x",)))
    with pytest.raises(ValueError, match="No WET file matches"):
        run(
            C4Config(
                wet_paths=(f"{root}/nothing-*.gz",), output_dir=str(root / "new"), badwords=("x",)
            )
        )


def test_unfiltered_variant_only_identifies_language(tmp_path, wet_corpus):
    fx = wet_corpus
    wet_paths = fx.write_fixture(tmp_path)
    config = C4Config(
        wet_paths=tuple(wet_paths),
        output_dir=str(tmp_path / "out"),
        variant="unfiltered",
        validation_fraction=0.3,
    )
    stats = run(config)
    _, train = _read_shards(f"{tmp_path}/out/c4-train.tfrecord-*")
    _, validation = _read_shards(f"{tmp_path}/out/c4-validation.tfrecord-*")
    candidates = [fx.FARM, fx.FRENCH, fx.CODE, fx.LOREM, fx.BAKERY, fx.RUDE, fx.MENU]
    english = sorted(p for p in candidates if langid.is_english(p.text, collections.Counter()))
    assert {fx.FARM, fx.BAKERY, fx.RUDE, fx.CODE} <= set(english) and fx.FRENCH not in english
    assert sorted(train + validation) == english  # raw text, no cleaning, no deduplication
    assert validation and train
    assert set(stats["counters"]) == {"read", "url_dedup", "langid", "write"}


def test_realnewslike_variant_keeps_listed_domains(tmp_path, wet_corpus):
    fx = wet_corpus
    wet_paths = fx.write_fixture(tmp_path)
    config = C4Config(
        wet_paths=tuple(wet_paths),
        output_dir=str(tmp_path / "out"),
        variant="realnewslike",
        badwords=tuple(fx.BADWORDS),
        domains=("example.com",),
    )
    stats = run(config)
    _, pages = _read_shards(f"{tmp_path}/out/c4-train.tfrecord-*")
    # Of the listed domain only the bakery is clean English; alone, it keeps its footer.
    text = " ".join(fx.BAKERY_BODY) + "\n" + " ".join(fx.FOOTER)
    assert pages == [Page(fx.BAKERY.url, fx.BAKERY.timestamp, text)]
    assert stats["counters"]["variant"] == {"page_dropped:domain_not_listed": 4, "page_kept": 3}


def test_config_errors_say_what_to_pass():
    with pytest.raises(ValueError, match="tuple of paths"):
        C4Config(wet_paths="a.wet.gz", output_dir="/tmp/x", badwords=("x",))
    with pytest.raises(ValueError, match="--badwords_file"):
        C4Config(wet_paths=("a",), output_dir="/tmp/x")
    with pytest.raises(ValueError, match="--domains_file"):
        C4Config(wet_paths=("a",), output_dir="/tmp/x", variant="realnewslike", badwords=("x",))
    with pytest.raises(ValueError, match="variant must be one of"):
        C4Config(wet_paths=("a",), output_dir="/tmp/x", variant="c5")


def test_newest_capture_combiner_is_order_free():
    old = Page("http://a.org/x", "2018-01-01T00:00:00Z", "old")
    new = Page("https://a.org/x/", "2019-01-01T00:00:00Z", "new")
    twin = Page("http://www.a.org/x", "2019-01-01T00:00:00Z", "twin")  # same time as `new`
    combiner = pipeline._NewestCapture()
    winner = max(new, twin, key=dedup.page_key)
    for order in ([old, new, twin], [twin, old, new], [new, twin, old]):
        accumulators = [combiner.add_input(combiner.create_accumulator(), p) for p in order]
        merged = combiner.merge_accumulators(
            [accumulators[0], combiner.merge_accumulators(accumulators[1:])]
        )
        assert combiner.extract_output(merged) == (winner, 3)


def test_a_run_that_reads_nothing_usable_exits_non_zero_with_its_counters(tmp_path, capsys):
    from c4_pipeline import __main__ as c4_cli

    (tmp_path / "empty.warc.wet").write_text("")
    (tmp_path / "junk.warc.wet").write_text("this is not a WARC record\n" * 3)
    (tmp_path / "badwords.txt").write_text("x\n")
    argv = [f"--badwords_file={tmp_path / 'badwords.txt'}", "--runner=DirectRunner"]
    assert (
        c4_cli.main(
            [f"--wet_paths={tmp_path}/empty.warc.wet", f"--output_dir={tmp_path / 'a'}", *argv]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "error: no page was read from 1 WET file(s)" in err and "check --wet_paths" in err
    assert (
        c4_cli.main(
            [f"--wet_paths={tmp_path}/junk.warc.wet", f"--output_dir={tmp_path / 'b'}", *argv]
        )
        == 1
    )
    err = capsys.readouterr().err
    assert "error: no page was read from 1 WET file(s)" in err
    assert (
        c4_cli.empty_run({"read": {"page_read": 5}, "write": {}})
        == "5 pages were read, but every one was filtered out"
    )
    assert c4_cli.empty_run({"read": {"page_read": 5}, "write": {"page_written:train": 1}}) == ""


def test_bad_input_exits_2_before_any_download(tmp_path, capsys, monkeypatch):
    """Issue 33: `--wet_paths` matching nothing raised a ValueError traceback, and only after the
    bad-words list was fetched over the network (offline, the network error hid the real one).
    Now the paths are checked first, nothing is fetched for a run that cannot start, and bad
    input is one line and exit 2, the download named when it is what fails."""
    import urllib.request

    from c4_pipeline import __main__ as c4_cli

    fetched = []

    def offline(url, *args, **kwargs):
        fetched.append(url)
        raise OSError("network unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    wet = tmp_path / "in" / "a.warc.wet"
    wet.parent.mkdir()
    wet.write_text("")
    cases = {
        "no match": (
            [f"--wet_paths={tmp_path}/nothing*.wet", f"--output_dir={tmp_path / 'o'}"],
            "No WET file matches",
        ),
        "output holds the input": (
            [f"--wet_paths={wet}", f"--output_dir={tmp_path}"],
            "is or contains the input",
        ),
        "the download fails": (
            [f"--wet_paths={wet}", f"--output_dir={tmp_path / 'o'}"],
            "Could not read the bad-words list from 'https://",
        ),
    }
    for case, (argv, message) in cases.items():
        assert c4_cli.main([*argv, "--runner=DirectRunner"]) == 2, case
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, (case, err)
        assert "--badwords_file" in err or case != "the download fails"
    assert len(fetched) == 1  # only the run whose inputs were fine tried to download
