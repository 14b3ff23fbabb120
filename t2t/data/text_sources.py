"""Plain text for vocabulary training: text files or a TFDS feature, mixed by weight.

A SentencePiece model is trained on lines of text. The T5 paper trained its vocabulary on C4
mixed 10:1:1:1 with German, French and Romanian text; `mix_documents` reproduces such a recipe
for any weighted list of sources, and reads a single source (or several unweighted ones) as-is.

A source is named by a spec string:
  - a file path or glob (`data/*.txt`): one document per line;
  - `tfds:NAME` or `tfds:NAME#FEATURE` (`tfds:c4/en:3.1.0`, `tfds:wmt_t2t_translate/de-en:1.0.0#de`):
    the string feature FEATURE (default `text`) of the `train` split of a TFDS dataset.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator, Sequence

from t2t import files

TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class TextSource:
    """One source of documents.

    Attributes:
      spec: a file glob or `tfds:NAME[#FEATURE]` (see the module docstring).
      weight: relative share of documents in a weighted mixture (> 0).
    """

    spec: str
    weight: float = 1.0

    def __post_init__(self):
        if not self.spec:
            raise ValueError(
                "TextSource.spec is empty; expected a file glob or 'tfds:NAME[#FEATURE]'."
            )
        if not self.weight > 0:
            raise ValueError(f"TextSource weight must be > 0, got {self.weight} for {self.spec!r}.")

    def documents(self, split: str = "train") -> Iterator[str]:
        """Yields the source's documents as `str`, in a deterministic order."""
        if self.spec.startswith(TFDS_PREFIX):
            yield from _tfds_documents(self.spec[len(TFDS_PREFIX) :], split)
        else:
            yield from _file_documents(self.spec)


def _file_documents(pattern: str) -> Iterator[str]:
    paths = files.glob(pattern if files.is_remote(pattern) else os.path.expanduser(pattern))
    if not paths:
        raise ValueError(
            f"No file matches {pattern!r}. Pass an existing text file or glob, or 'tfds:NAME' for "
            "a TFDS dataset."
        )
    for path in paths:
        with files.open_file(path, "rb") as f:
            for number, raw in enumerate(f, start=1):
                try:
                    line = raw.decode("utf-8").strip()
                except UnicodeDecodeError as error:
                    raise ValueError(
                        f"{path} is not UTF-8 text (line {number}: {error.reason} at byte "
                        f"{error.start}); text sources are UTF-8 files, one document per "
                        "line."
                    ) from None
                if line:
                    yield line


def _tfds_documents(name_and_feature: str, split: str) -> Iterator[str]:
    import tensorflow_datasets as tfds  # NOTE: imported lazily; file sources need no TF.

    from t2t.data import tf_setup

    tf_setup.hide_accelerators_from_tensorflow()
    name, _, feature = name_and_feature.partition("#")
    feature = feature or "text"
    dataset = tfds.load(name, split=split, shuffle_files=False)
    if feature not in dataset.element_spec:
        raise ValueError(
            f"TFDS dataset {name!r} has no feature {feature!r}; its features are "
            f"{sorted(dataset.element_spec)}. Name one with 'tfds:{name}#FEATURE'."
        )
    for example in dataset.as_numpy_iterator():
        text = example[feature].decode("utf-8").strip()
        if text:
            yield text


def parse_ratio(ratio: str, count: int) -> list[float]:
    """Parses `"10:1:1:1"` into `[10.0, 1.0, 1.0, 1.0]`, checking it has `count` positive parts.

    Raises:
      ValueError: when the ratio is malformed or does not have `count` parts.
    """
    try:
        parts = [float(p) for p in ratio.split(":")]
    except ValueError:
        raise ValueError(
            f"Ratio {ratio!r} is not numbers separated by ':' (e.g. '10:1:1:1')."
        ) from None
    if len(parts) != count or any(p <= 0 for p in parts):
        raise ValueError(
            f"Ratio {ratio!r} needs {count} positive parts, one per source, got {len(parts)}."
        )
    return parts


def mix_documents(
    sources: Sequence[TextSource], *, weighted: bool, max_characters: int | None = None
) -> Iterator[str]:
    """Yields documents from `sources`, mixed in proportion to their weights when `weighted`.

    Weighted mixing is a smooth weighted round-robin over the sources: after n documents, source i
    has contributed within one document of `n * w_i / sum(w)`. It stops when any source runs out,
    so the proportions hold exactly (the paper's 10:1:1:1 is a mixture of documents). Unweighted,
    every document of every source is read in turn.

    Example: weights 2:1 over sources A, B give A B A A B A A B A ... (A twice as often).

    Args:
      sources: the text sources.
      weighted: mix by weight (True) or concatenate the sources (False).
      max_characters: stop after this many characters (None: no limit).

    Yields:
      documents as `str`.
    """
    if not sources:
        raise ValueError("No text source given; pass at least one file glob or 'tfds:NAME'.")
    stream = _weighted_round_robin(sources) if weighted else _concatenated(sources)
    total = 0
    for document in stream:
        yield document
        total += len(document)
        if max_characters is not None and total >= max_characters:
            return


def _concatenated(sources: Sequence[TextSource]) -> Iterator[str]:
    for source in sources:
        yield from source.documents()


def _weighted_round_robin(sources: Sequence[TextSource]) -> Iterator[str]:
    iterators = [source.documents() for source in sources]
    weights = [source.weight for source in sources]
    total_weight = sum(weights)
    credit = [0.0] * len(sources)
    while True:
        for i, weight in enumerate(weights):
            credit[i] += weight
        chosen = max(range(len(sources)), key=lambda i: credit[i])  # first index wins ties
        credit[chosen] -= total_weight
        document = next(iterators[chosen], None)
        if document is None:
            return
        yield document
