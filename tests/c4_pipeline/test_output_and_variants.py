"""TFRecord Example encoding (checked with TensorFlow's parser), splits, and the variant filters."""

import collections

import apache_beam as beam
import hypothesis
import pytest
import tensorflow as tf
from apache_beam.testing import util as beam_util
from hypothesis import strategies as st

from c4_pipeline import output, variants
from c4_pipeline.page import Page


def test_encode_example_docstring_example():
    assert output.encode_example({"a": "b"}) == b"\n\x0c\n\n\n\x01a\x12\x05\n\x03\n\x01b"


@hypothesis.settings(max_examples=50, deadline=None)
@hypothesis.given(
    st.dictionaries(
        st.sampled_from(["text", "url", "timestamp", "k"]), st.text(max_size=300), min_size=1
    )
)
def test_encode_example_matches_tensorflow(features):
    proto = tf.train.Example()
    for key, value in features.items():
        proto.features.feature[key].bytes_list.value.append(value.encode("utf-8"))
    encoded = output.encode_example(features)
    assert tf.train.Example.FromString(encoded) == proto
    assert encoded == proto.SerializeToString(deterministic=True)


def test_page_split_is_stable_and_near_the_fraction():
    pages = [Page(f"http://site.org/{i}", "t", "x") for i in range(4000)]
    assert {output.page_split(p, 0.0) for p in pages} == {output.TRAIN}
    validation = [p for p in pages if output.page_split(p, 0.1) == output.VALIDATION]
    assert 300 < len(validation) < 500  # Binomial(4000, 0.1): mean 400, sd 19.
    assert validation == [p for p in pages if output.page_split(p, 0.1) == output.VALIDATION]


def test_domain_filter_docstring_example():
    keep = variants.DomainFilter(["nytimes.com", "http://www.bbc.co.uk/"])
    counters = collections.Counter()
    urls = ["https://www.nytimes.com/2019/x", "http://news.bbc.co.uk/a", "https://notnytimes.com/"]
    kept = [url for url in urls if keep(Page(url, "t", "x"), counters)]
    assert kept == urls[:2]
    assert dict(counters) == {"page_kept": 2, "page_dropped:domain_not_listed": 1}
    with pytest.raises(ValueError, match="at least one domain"):
        variants.DomainFilter(["", "  "])


def test_read_list(tmp_path):
    path = tmp_path / "domains.txt"
    path.write_text("# news\nnytimes.com\n\n  bbc.co.uk \n")
    assert variants.read_list(str(path)) == ["nytimes.com", "bbc.co.uk"]
    (tmp_path / "empty.txt").write_text("# nothing\n")
    with pytest.raises(ValueError, match="no entries"):
        variants.read_list(str(tmp_path / "empty.txt"))


def test_filter_by_url_list(tmp_path):
    urls = tmp_path / "urls.txt"
    urls.write_text(
        "https://www.a.org/story/\nhttp://b.org/x?utm_source=feed\nhttp://missing.org/\n# c\n"
    )
    pages = [
        Page("http://a.org/story", "t", "a"),
        Page("https://b.org/x", "t", "b"),
        Page("http://c.org/", "t", "c"),
    ]
    with beam.Pipeline() as pipeline:
        kept = pipeline | beam.Create(pages) | variants.FilterByUrlList(str(urls))
        beam_util.assert_that(kept, beam_util.equal_to(pages[:2]))
    counters = {
        c.key.metric.name: c.committed for c in pipeline.result.metrics().query()["counters"]
    }
    assert counters == {
        "page_kept": 2,
        "page_dropped:url_not_listed": 1,
        "listed_url_without_page": 1,
    }
