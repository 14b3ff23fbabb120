"""studies/mixture_shares.py on a mixture of two tasks of fixed lengths: the shares it reports
are the mixture's rates, and the target- and input-token shares those rates weighted by each
task's lengths (hand-computed); a packed row holds as many examples as fit."""

import functools
import importlib.util
import os
import re

import numpy as np
import pytest
import seqio
import tensorflow as tf

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "studies", "mixture_shares.py")
VOCAB = seqio.PassThroughVocabulary(size=50)
# task -> (input tokens, target tokens) of every example
LENGTHS = {"shares_short": (6, 2), "shares_long": (12, 6)}


def _source(
    split: str, shuffle_files: bool, seed=None, *, inputs: int, targets: int
) -> tf.data.Dataset:
    del split, shuffle_files, seed
    row = {"inputs": tf.fill([inputs], 3), "targets": tf.fill([targets], 4)}
    return tf.data.Dataset.from_tensors(row).repeat(64)


@pytest.fixture(scope="module")
def shares():
    spec = importlib.util.spec_from_file_location("mixture_shares", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    features = {name: seqio.Feature(VOCAB, add_eos=False) for name in ("inputs", "targets")}
    for name, (inputs, targets) in LENGTHS.items():
        seqio.TaskRegistry.remove(name)
        seqio.TaskRegistry.add(
            name,
            source=seqio.FunctionDataSource(
                functools.partial(_source, inputs=inputs, targets=targets), splits=["train"]
            ),
            output_features=features,
        )
    seqio.MixtureRegistry.remove("shares_mix")
    seqio.MixtureRegistry.add("shares_mix", [("shares_short", 1.0), ("shares_long", 3.0)])
    yield module
    seqio.MixtureRegistry.remove("shares_mix")
    for name in LENGTHS:
        seqio.TaskRegistry.remove(name)


def _table(text: str) -> dict[str, list[float]]:
    rows = {}
    for line in text.splitlines()[2:]:
        name, *cells = line.split()
        rows[name] = [float(cell.rstrip("%")) for cell in cells]
    return rows


def test_shares_are_the_rates_weighted_by_lengths(shares):
    text = shares.report("shares_mix", {"inputs": 24, "targets": 12}, examples=16, batch_size=4)
    rows = _table(text)
    examples = {"shares_short": 0.25, "shares_long": 0.75}
    target_total = sum(examples[t] * LENGTHS[t][1] for t in LENGTHS)  # 0.5 + 4.5
    input_total = sum(examples[t] * LENGTHS[t][0] for t in LENGTHS)  # 1.5 + 9
    for task, (share, target_share, input_share, per_step, target_length) in rows.items():
        assert share == pytest.approx(100 * examples[task], abs=0.05)
        assert target_share == pytest.approx(
            100 * examples[task] * LENGTHS[task][1] / target_total, abs=0.05
        )
        assert input_share == pytest.approx(
            100 * examples[task] * LENGTHS[task][0] / input_total, abs=0.05
        )
        assert target_length == LENGTHS[task][1]
    # A row of 24 input and 12 target tokens holds 1 to 4 examples (4 short ones, or 2 long ones,
    # fill it); the per-step counts are the shares of the examples per batch in the header.
    per_batch = float(re.search(r"}: ([\d.]+) examples per batch of 4 packed rows", text).group(1))
    assert 4 <= per_batch <= 16
    assert sum(row[3] for row in rows.values()) == pytest.approx(per_batch, abs=0.1)
    assert rows["shares_long"][3] == pytest.approx(3 * rows["shares_short"][3], abs=0.1)


def test_a_task_alone_is_all_of_its_batch(shares):
    rows = _table(
        shares.report("shares_short", {"inputs": 24, "targets": 12}, examples=8, batch_size=4)
    )
    assert list(rows) == ["shares_short"]
    np.testing.assert_allclose(rows["shares_short"][:3], [100.0, 100.0, 100.0])
