"""Fixtures for the preprocessor tests: id-level vocabularies and dataset helpers."""

from typing import Dict, List, Sequence

import numpy as np
import pytest
import seqio
import tensorflow as tf


class IdVocabulary(seqio.PassThroughVocabulary):
    """Token ids in, token ids out, with `extra_ids` sentinels on top (docs/spec.md section 3)."""

    def __init__(self, base_size: int = 32000, extra_ids: int = 100):
        super().__init__(base_size, eos_id=1)
        self._extra_ids = extra_ids


@pytest.fixture(scope="session")
def vocab32100() -> IdVocabulary:
    """32000 pieces + 100 sentinels: `<extra_id_0>` = 32099, as in the spec's worked example."""
    return IdVocabulary(32000, 100)


@pytest.fixture(scope="session")
def features32100(vocab32100) -> Dict[str, seqio.Feature]:
    return {
        "inputs": seqio.Feature(vocab32100, add_eos=True),
        "targets": seqio.Feature(vocab32100, add_eos=True),
    }


def _token_dataset(docs: Sequence[Sequence[int]], key: str = "targets") -> tf.data.Dataset:
    docs = [np.asarray(d, np.int32) for d in docs]
    return tf.data.Dataset.from_generator(
        lambda: iter(docs), output_signature=tf.TensorSpec([None], tf.int32)
    ).map(lambda t: {key: t})


def _as_lists(dataset: tf.data.Dataset) -> List[Dict[str, list]]:
    out = []
    for example in dataset.as_numpy_iterator():
        row = {}
        for k, v in example.items():
            if isinstance(v, bytes):
                row[k] = v.decode()
            elif isinstance(v, np.ndarray):
                row[k] = v.tolist()
            else:
                row[k] = v.item() if hasattr(v, "item") else v
        out.append(row)
    return out


@pytest.fixture(scope="session")
def token_dataset():
    """`token_dataset(docs, key="targets")`: a dataset of `{key: int32 [None]}` from id lists."""
    return _token_dataset


@pytest.fixture(scope="session")
def as_lists():
    """`as_lists(dataset)`: the examples as dicts of Python lists (strings decoded)."""
    return _as_lists
