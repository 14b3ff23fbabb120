"""Mixing rates agree with seqio.mixing_rate_num_examples; paper mixture; registry misses."""

import math

import pytest
import seqio
import tensorflow as tf

from t2t.data import mixing, registry

SIZES = {"mixtest_small": 100, "mixtest_medium": 1000, "mixtest_large": 10000}


@pytest.fixture(scope="module")
def tasks():
    vocabulary = seqio.PassThroughVocabulary(size=10)
    made = []
    for name, size in SIZES.items():
        source = seqio.FunctionDataSource(
            lambda split, shuffle_files: tf.data.Dataset.range(3),
            splits=["train"],
            num_input_examples={"train": size},
        )
        seqio.TaskRegistry.remove(name)
        made.append(
            seqio.TaskRegistry.add(
                name,
                source=source,
                preprocessors=[],
                output_features={"targets": seqio.Feature(vocabulary)},
            )
        )
    return made


@pytest.mark.parametrize("maximum", [None, 50, 500, 2000, 2**21])
@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0, 8.0])
def test_rates_match_seqio(tasks, maximum, temperature):
    from_task = mixing.examples_proportional(maximum, temperature)
    from_sizes = mixing.examples_proportional(maximum, temperature, sizes=SIZES)
    for task in tasks:
        expected = seqio.mixing_rate_num_examples(task, maximum=maximum, temperature=temperature)
        assert from_task(task) == pytest.approx(expected, rel=1e-12)
        assert from_sizes(task) == pytest.approx(expected, rel=1e-12)


def test_worked_example_proportions(tasks):
    # Same numbers as the `mixtures` module docstring: K = 2000, T = 2.
    seqio.MixtureRegistry.remove("mixtest_k2000_t2")
    mixture = seqio.MixtureRegistry.add(
        "mixtest_k2000_t2",
        [t.name for t in tasks],
        default_rate=mixing.examples_proportional(2000, 2.0),
    )
    shares = mixing.proportions(mixture)
    total = 10 + math.sqrt(1000) + math.sqrt(2000)
    assert shares["mixtest_small"] == pytest.approx(10 / total)
    assert shares["mixtest_large"] == pytest.approx(math.sqrt(2000) / total)
    assert [round(shares[t.name], 3) for t in tasks] == [0.116, 0.366, 0.518]
    assert mixing.proportions("mixtest_k2000_t2") == shares  # by its registered name
    with pytest.raises(ValueError, match="'mixtest_small' is a task, not a mixture"):
        mixing.proportions("mixtest_small")


def test_scale_applies_before_the_cap(tasks):
    rate = mixing.examples_proportional(3000, scale=0.5)
    expected = [seqio.mixing_rate_num_examples(t, maximum=3000, scale=0.5) for t in tasks]
    assert [rate(t) for t in tasks] == expected == [50.0, 500.0, 3000.0]


def test_paper_multitask_rates(tasks):
    sizes = {"mixtest_small": 5_000_000, "mixtest_medium": 2_000_000, "mixtest_large": 9000}
    pairs = dict(
        mixing.paper_multitask_rates(
            ["mixtest_small", "mixtest_medium", "mixtest_large"],
            "unlabeled",
            "base",
            wmt_tasks=("mixtest_small",),
            sizes=sizes,
        )
    )
    by_name = {t.name: t for t in tasks}
    assert pairs["unlabeled"](None) == 2_620_000
    assert pairs["mixtest_small"](by_name["mixtest_small"]) == mixing.WMT_CAP
    assert pairs["mixtest_medium"](by_name["mixtest_medium"]) == 2_000_000  # not WMT: no cap
    with pytest.raises(ValueError, match="expected one of"):
        mixing.paper_multitask_rates([], "unlabeled", "huge")


def test_unknown_size_says_how_to_fix():
    source = seqio.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.range(3), splits=["train"]
    )
    seqio.TaskRegistry.remove("mixtest_unsized")
    task = seqio.TaskRegistry.add(
        "mixtest_unsized",
        source=source,
        preprocessors=[],
        output_features={"targets": seqio.Feature(seqio.PassThroughVocabulary(10))},
    )
    with pytest.raises(ValueError, match=r"sizes=\{'mixtest_unsized': N\}"):
        mixing.examples_proportional()(task)
    assert mixing.examples_proportional(sizes={"mixtest_unsized": 7})(task) == 7.0


def test_registry_miss_lists_near_names(tasks):
    assert registry.get_task_or_mixture("mixtest_small") is tasks[0]
    with pytest.raises(ValueError) as error:
        registry.get_task_or_mixture("mixtest_smal")
    assert "mixtest_small" in str(error.value) and "Nearest registered names" in str(error.value)
    with pytest.raises(ValueError, match="No registered name is close"):
        registry.get_task_or_mixture("zzzzzzzzzzzzzzzzzzzzzzz")
    with pytest.raises(TypeError, match="Expected a task or mixture name"):
        registry.get_task_or_mixture(3)


def test_registration_replaces_only_its_own_tasks():
    """A module's `register()` run again replaces its tasks; a task of that name registered by
    another module, or outside t2t, is a real duplicate and fails naming both."""
    source = seqio.FunctionDataSource(
        lambda split, shuffle_files: tf.data.Dataset.range(3), splits=["train"]
    )
    features = {"targets": seqio.Feature(seqio.PassThroughVocabulary(10))}
    for name in ("regtest_task", "regtest_user", "regtest_mixture"):
        seqio.TaskRegistry.remove(name)
        seqio.MixtureRegistry.remove(name)
    first = registry.add_task(
        "regtest_task", "module_a", source=source, preprocessors=[], output_features=features
    )
    second = registry.add_task(
        "regtest_task", "module_a", source=source, preprocessors=[], output_features=features
    )  # the same module again: replaced
    assert second is not first and seqio.TaskRegistry.get("regtest_task") is second
    with pytest.raises(
        ValueError,
        match=r"'regtest_task' is already registered \(by module_a\); "
        r"module_b registers another",
    ):
        registry.add_task(
            "regtest_task", "module_b", source=source, preprocessors=[], output_features=features
        )
    assert seqio.TaskRegistry.get("regtest_task") is second  # nothing was replaced

    seqio.TaskRegistry.add(
        "regtest_user", source=source, preprocessors=[], output_features=features
    )  # a user's task, through seqio
    with pytest.raises(
        ValueError,
        match=r"already registered \(outside t2t\).*"
        r"seqio.TaskRegistry.remove\('regtest_user'\)",
    ):
        registry.add_task(
            "regtest_user", "module_a", source=source, preprocessors=[], output_features=features
        )

    registry.add_mixture("regtest_mixture", ["regtest_task"], "module_a", default_rate=1.0)
    registry.add_mixture("regtest_mixture", ["regtest_task"], "module_a", default_rate=2.0)
    with pytest.raises(ValueError, match="A mixture named 'regtest_mixture'"):
        registry.add_mixture("regtest_mixture", ["regtest_task"], "module_b", default_rate=1.0)
    # Replaced outside t2t since: the old ownership no longer counts.
    seqio.TaskRegistry.remove("regtest_task")
    seqio.TaskRegistry.add(
        "regtest_task", source=source, preprocessors=[], output_features=features
    )
    with pytest.raises(ValueError, match="outside t2t"):
        registry.add_task(
            "regtest_task", "module_a", source=source, preprocessors=[], output_features=features
        )
