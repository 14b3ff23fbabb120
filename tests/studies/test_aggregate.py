"""The study aggregation on fixed fake results equals numbers computed by hand."""

import math

import pytest
import scipy.stats

from t2t.studies import aggregate, report

SCORES = {
    ("base", "t1", 0): 80.0,
    ("base", "t1", 1): 82.0,
    ("base", "t1", 2): 84.0,
    ("base", "t2", 0): 60.0,
    ("base", "t2", 1): 62.0,
    ("base", "t2", 2): 58.0,
    ("new", "t1", 0): 70.0,
    ("new", "t1", 1): 72.0,
    ("new", "t1", 2): 71.0,
    ("new", "t2", 0): 50.0,
    ("new", "t2", 1): 40.0,
    ("new", "t2", 2): 52.0,
    ("new", "t2", 3): None,  # a run without a result
}
BASELINES = {"t1": 50.0, "t2": 45.0}


@pytest.fixture(scope="module")
def result():
    return aggregate.aggregate(SCORES, baselines=BASELINES)


def test_spread_per_arm_and_task(result):
    base, new = result["arms"]["base"]["tasks"], result["arms"]["new"]["tasks"]
    assert base["t1"] == {
        "n": 3,
        "mean": 82.0,
        "std": 2.0,
        "min": 80.0,
        "max": 84.0,
        "degenerate": 0,
        "by_seed": {"0": 80.0, "1": 82.0, "2": 84.0},
    }
    assert new["t1"]["mean"] == 71.0 and new["t1"]["std"] == pytest.approx(1.0)
    # 50, 40, 52: mean 47.33; deviations 2.67, -7.33, 4.67, squares summing to 248 / 3
    assert new["t2"]["mean"] == pytest.approx(142 / 3)
    assert new["t2"]["std"] == pytest.approx(math.sqrt(248 / 3 / 2))
    assert new["t2"]["degenerate"] == 1  # 40 <= the constant baseline 45
    assert result["missing"] == [["new", "t2", 3]]


def test_suite_average_and_welch_test(result):
    base, new = result["arms"]["base"], result["arms"]["new"]
    # Per seed: base (70, 72, 71), new (60, 56, 61.5) [seed 3 has no t1 and is left out].
    assert base["suite"]["mean"] == 71.0 and base["suite"]["std"] == pytest.approx(1.0)
    assert new["suite"]["mean"] == pytest.approx(177.5 / 3)
    variance_new = ((60 - 177.5 / 3) ** 2 + (56 - 177.5 / 3) ** 2 + (61.5 - 177.5 / 3) ** 2) / 2
    assert new["suite"]["std"] == pytest.approx(math.sqrt(variance_new))
    # Welch: t = (m1 - m2) / sqrt(v1/n1 + v2/n2), df by Welch-Satterthwaite, two-sided.
    v1, v2, n = 1.0, variance_new, 3
    t = (71.0 - 177.5 / 3) / math.sqrt(v1 / n + v2 / n)
    df = (v1 / n + v2 / n) ** 2 / ((v1 / n) ** 2 / (n - 1) + (v2 / n) ** 2 / (n - 1))
    assert new["p_value"] == pytest.approx(2 * scipy.stats.t.sf(abs(t), df))
    assert base["p_value"] is None
    assert aggregate.ordering(result) == ["base", "new"]


def test_orderings_against_the_paper():
    pairs = aggregate.compare_orderings(
        {"a": 3.0, "b": 2.0, "c": 1.0}, {"a": 1.0, "b": 2.0, "c": 3.0, "d": 9.0}
    )
    assert [(p["pair"], p["paper"], p["ours"], p["reproduced"]) for p in pairs] == [
        (["a", "b"], "b", "a", False),
        (["a", "c"], "c", "a", False),
        (["b", "c"], "c", "b", False),
    ]
    same = aggregate.compare_orderings({"a": 3.0, "b": 2.0}, {"a": 9.0, "b": 1.0})
    assert same[0]["reproduced"] is True
    tie = aggregate.compare_orderings({"a": 1.0, "b": 1.0}, {"a": 9.0, "b": 1.0})
    assert tie[0]["ours"] is None and tie[0]["reproduced"] is False


def test_paper_comparison_reads_the_papers_numbers(result):
    spec = {
        "table": "10",
        "column": "GLUE",
        "rows": {"base": "All parameters", "new": "Gradual unfreezing"},
    }
    comparison = report.paper_comparison(result, spec)
    assert comparison["values"] == {"base": 83.28, "new": 82.5}
    assert comparison["reproduced"] == comparison["compared"] == 1  # base > new, as here
    table = report.markdown(
        {**result, "ordering": ["base", "new"], "paper": comparison, "seeds": [0, 1, 2]}
    )
    assert "| base | 82.0 ± 2.0 | 60.0 ± 2.0 | 71.0 ± 1.0 |" in table
    # Per-seed suite averages: base (70, 72, 71), new (60, 56, 61.5).
    want = scipy.stats.ttest_ind([70, 72, 71], [60, 56, 61.5], equal_var=False).pvalue
    assert comparison["pairs"][0]["p_value"] == pytest.approx(want)
    assert want < 0.05 and comparison["significant"] == 1
    assert "orderings as the paper's 1 of 1, 1 of them with p < 0.05 over runs" in table
    # No unit is shared here (no units given): each run is its own, the two p-values agree.
    row = "| new | 71.0 ± 1.0 | 47.3 ± 6.4 | 59.2 ± 2.8 | 56.0 / 61.5 | 1/6 | 3 (± 2.8) |"
    assert f"{row} {want:.3g} ({want:.3g}) |" in table
    assert f"| base vs new | base | base | {want:.3g} | yes |" in table


def test_the_plot_shows_every_seeds_score_over_its_arms_bar(result):
    import matplotlib.collections
    import matplotlib.pyplot as plt
    import numpy as np

    result = {**result, "name": "fake"}
    fig = report.figure(result)
    suite, t1, t2 = fig.axes[:3]
    assert [ax.get_title() for ax in (suite, t1, t2)] == ["suite", "t1", "t2"]

    def dots(ax):  # per bar position (rounded), the scores of its dots
        found = {}
        for collection in ax.collections:
            if not isinstance(collection, matplotlib.collections.PathCollection):
                continue  # the error bars
            for x, y in collection.get_offsets():
                found.setdefault(int(round(x)), []).append(float(y))
        return found

    assert dots(t2) == {0: [60.0, 62.0, 58.0], 1: [50.0, 40.0, 52.0]}  # seed 3: no result
    assert dots(suite) == {0: [70.0, 72.0, 71.0], 1: [60.0, 56.0, 61.5]}
    heights = [patch.get_height() for patch in t1.patches]
    assert np.allclose(heights, [82.0, 71.0])
    # the constant baseline: the dashed line at t1's
    assert [line.get_ydata()[0] for line in t1.lines if line.get_linestyle() == "--"] == [50.0]
    plt.close(fig)
