"""Planning a study: Welch's test's power from the noncentral t distribution (Cohen's table
values), the paper's gap carried to our benchmark, the spread read from a study.json, the wall
time from timed stages, and `t2t study --plan` on a micro study."""

import json

import pytest

from t2t import cli
from t2t.studies import plan, power

from .test_study import MICRO, SMALL


@pytest.fixture(scope="module", autouse=True)
def _builtin(builtin_tasks):
    return builtin_tasks


@pytest.fixture
def micro(tmp_path):
    path = tmp_path / "micro.gin"
    path.write_text(f"SMALL = {SMALL!r}\n" + MICRO)
    return str(path)


@pytest.mark.parametrize("effect, seeds", [(1.0, 17), (0.8, 26), (0.5, 64)])
def test_seeds_for_a_gap_in_standard_deviations_match_cohens_table(effect, seeds):
    # Two-sided alpha 0.05, power 0.8, equal spreads: Cohen (1988), Table 2.4.1.
    assert power.seeds_needed(effect * 3.0, 3.0, 3.0) == seeds
    assert power.welch_power(effect * 3.0, 3.0, 3.0, seeds) >= 0.8
    assert power.welch_power(effect * 3.0, 3.0, 3.0, seeds - 1) < 0.8


def test_unequal_spreads_need_more_seeds_than_their_pooled_average_suggests():
    # Welch's degrees of freedom fall when one arm carries most of the variance.
    assert power.seeds_needed(2.0, 0.5, 2.5) >= power.seeds_needed(2.0, 1.8, 1.8)
    assert power.seeds_needed(0.0, 1.0, 1.0) is None
    assert power.seeds_needed(0.01, 10.0, 10.0, max_seeds=50) is None


def test_the_papers_gap_is_carried_as_a_fraction_of_the_room_above_the_constant_baseline():
    # The module docstring's example: Table 1's 83.28 vs 66.22 with our best arm 62.9 and the
    # constant baseline 24.2.
    assert power.expected_gap(83.28, 66.22, 62.9, 24.2) == pytest.approx(7.93, abs=0.01)
    assert power.expected_gap(66.22, 83.28, 62.9, 24.2) == power.expected_gap(
        83.28, 66.22, 62.9, 24.2
    )


def _study_json(path):
    result = {
        "arms": {
            "a": {"suite": {"n": 3, "mean": 70.0, "std": 3.0}},
            "b": {"suite": {"n": 3, "mean": 60.0, "std": 4.0}},
            "one seed": {"suite": {"n": 1, "mean": 90.0, "std": 0.0}},
        },
        "baselines": {"t1": 20.0, "t2": 30.0},
    }
    path.write_text(json.dumps(result))
    return result


def test_the_spread_of_a_finished_study(tmp_path):
    spread = power.spread_of(_study_json(tmp_path / "study.json"))
    assert spread["arm_stds"] == {"a": 3.0, "b": 4.0}  # one seed has no spread
    assert spread["pooled_std"] == pytest.approx(12.5**0.5)
    assert (spread["best"], spread["constant"]) == (90.0, 25.0)


def test_the_spread_of_chosen_arms(tmp_path):
    result = _study_json(tmp_path / "study.json")
    spread = power.spread_of(result, ["b"])
    assert (spread["pooled_std"], spread["best"], spread["arm_stds"]) == (4.0, 60.0, {"b": 4.0})
    with pytest.raises(ValueError, match=r"no arms \['c'\]"):
        power.spread_of(result, ["c"])
    with pytest.raises(ValueError, match="No arm with two or more seeds"):
        power.spread_of(result, ["one seed"])


def test_plan_prints_the_grid_and_the_seeds_of_each_paper_pair(micro, tmp_path, capsys):
    _study_json(tmp_path / "study.json")
    argv = ["study", f"--gin_file={micro}", f"--study_dir={tmp_path / 's'}"]
    assert cli.main([*argv, f"--plan={tmp_path / 'study.json'}"]) == 0
    out = capsys.readouterr().out
    assert "micro: 2 arms x 1 tasks x 2 seeds = 4 runs" in out
    # Table 1, GLUE: 83.28 vs 66.22 -> 17.06 / 83.28 of (90 - 25) = 13.32 points; pooled std
    # 3.54 for both arms.
    gap = 17.06 / 83.28 * 65.0
    seeds = power.seeds_needed(gap, 12.5**0.5, 12.5**0.5)
    assert f"| pre-trained vs no pre-training | 83.28 vs 66.22 | {gap:.2f} | {seeds} |" in out
    assert "no timed stage under" in out  # nothing measured yet: no wall time
    assert not (tmp_path / "s").exists()  # nothing trained
    assert cli.main([*argv, f"--plan={tmp_path / 'missing.json'}"]) == 2
    assert "--plan needs a finished study's study.json" in capsys.readouterr().err


def test_the_wall_time_takes_the_rate_of_the_same_stage_and_task_first():
    rates = {
        ("pretrain", "c4"): [0.4],
        ("finetune", "glue"): [0.5, 0.7, 0.9],
        ("finetune", "squad"): [2.0],
    }
    stages = [
        ("pretrain", "c4", 500),
        ("finetune", "glue", 300),
        ("finetune", "glue", 300),
        ("finetune", "wmt", 100),  # finetune timed on other tasks: their median, 0.8
        ("scratch", "glue", 100),  # scratch never timed: the median of all five rates, 0.7
    ]
    estimate = plan.wall_time(stages, rates)
    assert estimate["seconds"] == pytest.approx(500 * 0.4 + 600 * 0.7 + 100 * 0.8 + 100 * 0.7)
    groups = estimate["groups"]
    assert groups[("finetune", "glue")] == {
        "stages": 2,
        "steps": 600,
        "timed": 3,
        "rate": 0.7,
        "source": "task",
    }
    assert groups[("finetune", "wmt")]["source"] == "name"
    assert groups[("finetune", "wmt")]["timed"] == 4
    assert groups[("scratch", "glue")]["source"] == "all"
    assert plan.wall_time(stages, {})["seconds"] is None


def test_the_eta_before_each_run_is_the_wall_time_of_the_stages_left():
    rates = {("pretrain", "c4"): [0.4], ("finetune", "glue"): [0.3]}
    left = [("pretrain", "c4", 500), ("finetune", "glue", 300)]  # 200 s + 90 s
    assert plan.eta(left, rates) == ", ETA 5 min"
    assert plan.eta(left[1:], rates) == ", ETA 90 s"
    assert plan.eta([], rates) == plan.eta(left, {}) == ""  # nothing left, nothing timed yet


def _chain_json(directory, stages):
    directory.mkdir(parents=True)
    (directory / "chain.json").write_text(json.dumps({"stages": stages}))


def test_rates_come_from_the_trained_part_of_each_timed_stage(tmp_path):
    _chain_json(
        tmp_path / "a" / "seed0" / "t",
        [
            {"name": "pretrain", "skipped": True, "train_steps": 10},  # trained by another run
            {
                "name": "finetune",
                "task": "glue",
                "skipped": False,
                "train_steps": 10,
                "trained_steps": 4,
                "seconds": 8.0,
            },  # resumed at step 6: 2 s per step
        ],
    )
    _chain_json(
        tmp_path / "shared",
        [
            {
                "name": "pretrain",
                "task": "c4",
                "skipped": False,
                "train_steps": 10,
                "trained_steps": 10,
                "seconds": 30.0,
            }
        ],
    )
    _chain_json(tmp_path / "old", [{"name": "finetune", "skipped": False}])  # not timed
    _chain_json(  # recorded before chain.json named the task
        tmp_path / "older", [{"name": "finetune", "trained_steps": 2, "seconds": 1.0}]
    )
    assert plan.stage_rates([str(tmp_path)]) == {
        ("finetune", "glue"): [2.0],
        ("finetune", None): [0.5],
        ("pretrain", "c4"): [3.0],
    }


def test_plan_estimates_the_wall_time_from_a_timed_study(micro, tmp_path, capsys):
    timed = tmp_path / "timed"
    _chain_json(
        timed / "x",
        [
            {
                "name": "pretrain",
                "task": "builtin_span_corruption",
                "trained_steps": 10,
                "seconds": 30.0,
            },
            {"name": "finetune", "task": "builtin_next", "trained_steps": 10, "seconds": 10.0},
        ],
    )
    argv = ["study", f"--gin_file={micro}", f"--study_dir={tmp_path / 's'}", "--plan"]
    assert cli.main([*argv, f"--plan_timing={timed}"]) == 0
    out = capsys.readouterr().out
    # Per seed a pretraining, a fine-tuning (on builtin_order, timed on builtin_next) and a
    # run from scratch of 2 steps each; scratch untimed takes the median of 3.0 and 1.0 s per
    # step: 2 * 2 * (3 + 1 + 2) = 24 s.
    assert "Wall time: 4 runs left, 6 stages to train (12 steps): about 24 s" in out
    assert "pretrain on builtin_span_corruption: 2 x 2 steps at 3.00 s/step (median of 1" in out
    assert "finetune on builtin_order: 2 x 2 steps at 1.00 s/step (task not timed" in out
    assert "scratch on builtin_order: 2 x 2 steps at 2.00 s/step (name not timed" in out
    assert "time one run of this study for a closer estimate" in out
    assert "Seeds per arm" not in out  # no finished study given for the spread
    assert not (tmp_path / "s").exists()


def test_welchs_power_from_the_noncentral_t_is_too_generous_at_three_seeds():
    """At 3 seeds per arm the approximation says 0.81 where the test, simulated, has 0.71;
    at 17 both agree. `seeds_needed` checks its small counts by simulation."""
    assert power.welch_power(3.1, 1.0, 1.0, 3) == pytest.approx(0.807, abs=0.002)
    assert power.simulated_power(3.1, 1.0, 1.0, 3) == pytest.approx(0.71, abs=0.01)
    assert power.simulated_power(3.0, 3.0, 3.0, 17) == pytest.approx(
        power.welch_power(3.0, 3.0, 3.0, 17), abs=0.01
    )
    assert power.seeds_needed(3.1, 1.0, 1.0) == 4  # not the 3 the approximation gives


def _nested_arm(units):
    """A study.json arm entry of these pretrainings' restart scores."""
    by_run, unit_of = {}, {}
    for p, values in enumerate(units):
        for s, value in enumerate(values):
            by_run[f"pretraining{p}/seed{s}"] = value
            unit_of[f"pretraining{p}/seed{s}"] = f"pretraining{p}"
    means = [sum(v) / len(v) for v in units]
    return {
        "suite_by_seed": by_run,
        "unit_of_run": unit_of,
        "unit_suite": {"n": len(units), "mean": sum(means) / len(means)},
    }


def test_the_spread_between_and_within_pretrainings():
    # Within: restarts 1 apart in each unit -> pooled variance 0.5 (each pair's 0.5).
    # Units' means 60.5, 70.5, 80.5 -> variance 100; between = 100 - 0.5 / 2.
    spread = power.nested_spread(_nested_arm([(60, 61), (70, 71), (80, 81)]))
    assert spread["within"] == pytest.approx(0.5**0.5)
    assert spread["between"] == pytest.approx((100 - 0.25) ** 0.5)
    assert (spread["units"], spread["restarts"]) == (3, 2)
    assert power.nested_spread(_nested_arm([(60, 61)])) is None  # one pretraining
    assert power.nested_spread(_nested_arm([(60,), (70,)])) is None  # no restarts to split


def test_the_design_buys_pretrainings_when_they_vary_most_and_restarts_when_restarts_do():
    costs = {"pretraining_cost": 300.0, "restart_cost": 60.0}
    between = power.plan_design(
        4.0, {"between": 2.0, "within": 0.5}, {"between": 2.0, "within": 0.5}, **costs
    )
    within = power.plan_design(
        4.0, {"between": 0.3, "within": 4.0}, {"between": 0.3, "within": 4.0}, **costs
    )
    assert between["restarts"] == 1 and between["units"] >= 4
    assert within["restarts"] > 1
    for design in (between, within):
        assert design["power"] >= 0.8
        assert design["cost"] == design["units"] * (300.0 + design["restarts"] * 60.0)
    assert (
        power.plan_design(
            0.1, {"between": 5.0, "within": 5.0}, {"between": 5.0, "within": 5.0}, **costs
        )
        is None
    )


def test_plan_from_a_replicated_pilot_prints_a_design_per_claim(micro, tmp_path, capsys):
    pilot = {
        "arms": {
            "x": _nested_arm([(60, 61), (64, 65), (62, 62.5)]),
            "y": _nested_arm([(50, 52), (51, 51.5), (49, 50)]),
        },
        "baselines": {"t": 25.0},
    }
    (tmp_path / "pilot.json").write_text(json.dumps(pilot))
    text = open(micro).read() + 't2t.studies.run.claims = ["pre-trained > no pre-training"]\n'
    (tmp_path / "claimed.gin").write_text(text)
    argv = ["study", f"--gin_file={tmp_path / 'claimed.gin'}", f"--study_dir={tmp_path / 's'}"]
    assert cli.main([*argv, f"--plan={tmp_path / 'pilot.json'}"]) == 0
    out = capsys.readouterr().out
    assert "(replicated pretraining)" in out and "x: between pretrainings" in out
    widest_between = max(power.nested_spread(a)["between"] for a in pilot["arms"].values())
    assert f"takes the widest ({widest_between:.2f}," in out
    best = (60.5 + 64.5 + 62.25) / 3  # the best arm's mean over its pretrainings
    gap = power.expected_gap(83.28, 66.22, best, 25.0)
    row = next(line for line in out.splitlines() if line.startswith("| pre-trained vs"))
    assert f"| 83.28 vs 66.22 | {gap:.2f} |" in row
    # Neither arm is in the pilot: both take its widest spreads; nothing timed: stages counted.
    spreads = [power.nested_spread(a) for a in pilot["arms"].values()]
    widest = {level: max(s[level] for s in spreads) for level in ("between", "within")}
    design = power.plan_design(gap, widest, widest, pretraining_cost=1.0, restart_cost=1.0)
    assert f"| {design['units']} x {design['restarts']} | {design['power']:.2f} |" in row
    assert row.endswith(f"| {design['cost']:.0f} stages |")
