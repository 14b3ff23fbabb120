"""A small WET corpus with one page for every way the pipeline keeps or drops a page.

Shared (as the `wet_corpus` fixture) by the end-to-end test and the seqio task test. Two files: a
gzip file (one gzip member per record, as Common Crawl writes them) and a plain one that ends in a
truncated record.
"""

import gzip
import pathlib
import types

import pytest

from c4_pipeline import __main__ as cli
from c4_pipeline import wet
from c4_pipeline.page import Page

BADWORDS = ["flibbertigibbet", "snollygoster"]

FOOTER = [
    "Subscribe to our newsletter for seasonal recipes and farm news every month.",
    "We never share your email address with anyone else for any reason.",
    "You can unsubscribe from the newsletter at any time with a single click.",
]
FARM_BODY = [
    "Our family has worked this land since 1902, and we still plough the lower fields with horses.",
    "In spring we plant potatoes, beans and three kinds of wheat on the southern slopes.",
    "Visitors can walk the orchard trail and watch the apple harvest in early October.",
]
BAKERY_BODY = [
    "The bakery opens at six in the morning, when the first loaves come out of the oven.",
    "Our sourdough rises for two full days before it is shaped and baked by hand.",
    "On Saturdays the queue often reaches the end of the street before we open the door.",
]

FARM = Page(
    "http://www.valleyfarm.org/about",
    "2019-04-20T08:00:00Z",
    "\n".join(
        ["Home | Shop | Contact", "Welcome to Valley Farm", FARM_BODY[0] + "[1]"]
        + FARM_BODY[1:]
        + [
            "Please enable JavaScript to view the opening hours on our map.",
            "This website uses cookies to give you the best experience possible.",
        ]
        + FOOTER
        + ["Read more..."]
    ),
)
FARM_OLD_CAPTURE = Page(
    "https://valleyfarm.org/about/", "2018-01-02T00:00:00Z", "An older version of the page."
)
BAKERY = Page(
    "https://bakery.example.com/story",
    "2019-04-21T09:30:00Z",
    # The body appears twice (a repeat inside the page), the footer is shared with FARM.
    "\n".join([" ".join(BAKERY_BODY), "Privacy Policy", " ".join(FOOTER), " ".join(BAKERY_BODY)]),
)
FRENCH = Page(
    "http://ferme.example.fr/",
    "2019-04-20T10:00:00Z",
    "Notre famille cultive cette terre depuis 1902 et laboure encore les champs avec des chevaux.\n"
    "Au printemps nous plantons des pommes de terre, des haricots et trois sortes de blé.\n"
    "Les visiteurs peuvent parcourir le verger et assister à la récolte des pommes en octobre.",
)
CODE = Page(
    "http://code.example.org/loops",
    "2019-04-20T11:00:00Z",
    "Loops repeat a block of statements while a condition holds true.\n"
    "In C the body is written as { total += i; } after the loop header.\n"
    "The compiler turns this into a jump back to the start of the block.\n"
    "Every iteration checks the condition again before running the body.",
)
LOREM = Page(
    "http://template.example.net/",
    "2019-04-20T12:00:00Z",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod.\n"
    "Ut enim ad minim veniam, quis nostrud exercitation ullamco laboris.\n"
    "Duis aute irure dolor in reprehenderit in voluptate velit esse cillum.",
)
RUDE = Page(
    "http://forum.example.com/thread/7",
    "2019-04-20T13:00:00Z",
    "The meeting last night went on for three long hours without a decision.\n"
    "One member called the treasurer a flibbertigibbet in front of everyone.\n"
    "We will vote on the new budget at the next meeting in two weeks.",
)
MENU = Page("http://shop.example.com/", "2019-04-20T14:00:00Z", "Home\nProducts\nContact us\nLogin")
TRUNCATED_TAIL = (
    b"WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Target-URI: http://cut.example.com/\r\n"
    b"WARC-Date: 2019-04-20T15:00:00Z\r\nContent-Length: 500\r\n\r\nThis record stops early."
)
WARCINFO = (
    b"WARC/1.0\r\nWARC-Type: warcinfo\r\nContent-Length: 16\r\n\r\nisPartOf: test\r\n\r\n\r\n"
)
STRAY = b"\x00\x01 stray bytes between records\n"
BAD_LENGTH = b"WARC/1.0\r\nWARC-Type: conversion\r\nContent-Length: many\r\n\r\nSome text.\r\n\r\n"


def write_fixture(directory: pathlib.Path) -> list[str]:
    """Writes the two WET files into `directory` and returns their paths."""
    first = directory / "part-00000.warc.wet.gz"
    records = (
        [WARCINFO, STRAY]
        + [wet.encode_wet_record(p) for p in (FARM, FRENCH, CODE)]
        + [BAD_LENGTH]
        + [wet.encode_wet_record(p) for p in (FARM_OLD_CAPTURE, LOREM, BAKERY)]
    )
    with open(first, "wb") as f:
        for record in records:
            f.write(gzip.compress(record))
    second = directory / "part-00001.warc.wet"
    second.write_bytes(b"".join(wet.encode_wet_record(p) for p in (RUDE, MENU)) + TRUNCATED_TAIL)
    return [str(first), str(second)]


@pytest.fixture(scope="session")
def wet_corpus():
    """The corpus's pages, word list and `write_fixture`, as attributes of one namespace."""
    names = {k: v for k, v in globals().items() if k.isupper()}
    return types.SimpleNamespace(**names, write_fixture=write_fixture)


@pytest.fixture(scope="session")
def c4_run(tmp_path_factory, wet_corpus):
    """Runs the CLI once on the corpus (DirectRunner, 2 shards); returns (root, output_dir)."""
    root = tmp_path_factory.mktemp("c4")
    wet_paths = write_fixture(root)
    (root / "badwords.txt").write_text("\n".join(BADWORDS) + "\n")
    out = root / "out"
    argv = [
        f"--wet_paths={root}/*.warc.wet.gz,{wet_paths[1]}",
        f"--output_dir={out}",
        f"--badwords_file={root / 'badwords.txt'}",
        "--num_shards=2",
        "--runner=DirectRunner",
    ]
    assert cli.main(argv) == 0
    return root, out
