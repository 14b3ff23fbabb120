"""Replicated pretraining (k pretrainings x m restarts per arm), the test over pretrainings,
Holm's correction and the paper's claims, on constructed scores checked by hand or by scipy."""

import statistics

import pytest
import scipy.stats

from t2t import runs
from t2t.errors import UserError
from t2t.studies import aggregate, claims, runner

ARM = {
    "name": "x",
    "stages": [
        {
            "name": "pretrain",
            "gin_files": ["p.gin"],
            "bindings": ["A = '{seed}'"],
            "share": "seeds",
        },
        {"name": "finetune", "gin_files": ["f.gin"]},
    ],
}
SCRATCH = {"name": "scratch", "stages": [{"name": "train", "gin_files": ["s.gin"]}]}


def test_a_replicated_arm_pretrains_once_per_pretraining_and_fine_tunes_each_restart_apart():
    stages = {
        (p, s): runner.expand(ARM, "t", s, "/s", (), None, pretraining=p)
        for p in (0, 1, 2)
        for s in (0, 1)
    }
    pretrain = {key: (st[0].directory, st[0].bindings[-1]) for key, st in stages.items()}
    for p in (0, 1, 2):  # one pretraining per p, seeded p, shared by its restarts
        assert (
            pretrain[(p, 0)]
            == pretrain[(p, 1)]
            == (
                f"/s/x/pretraining{p}/pretrain",
                f"t2t.runs.train.seed = {p}",
            )
        )
    finetunes = {key: (st[1].directory, st[1].bindings) for key, st in stages.items()}
    assert finetunes[(2, 1)][0] == "/s/x/pretraining2/seed1/t/finetune"
    seeds = [b for _, bindings in finetunes.values() for b in bindings if "train.seed" in b]
    assert seeds == [f"t2t.runs.train.seed = {1000 * p + s}" for p in (0, 1, 2) for s in (0, 1)]
    assert len({d for d, _ in finetunes.values()}) == 6  # k x m distinct runs
    # Without replication the layout and seeds are those of every committed study.
    plain = runner.expand(ARM, "t", 1, "/s", (), None)
    assert [st.directory for st in plain] == ["/s/x/pretrain", "/s/x/seed1/t/finetune"]
    assert plain[0].bindings[-1] == "t2t.runs.train.seed = 0"


def test_a_stage_per_task_shared_by_restarts_trains_once_per_task_and_pretraining():
    # Leave-one-out: each task's pretraining leaves that task out, and is fine-tuned m times.
    arm = {"name": "loo", "stages": [
        {"name": "mt", "gin_files": ["p.gin"], "bindings": ["M = 'without_{task}'"], "share": "seeds"},
        {"name": "finetune", "gin_files": ["f.gin"]},
    ]}  # fmt: skip
    first = {
        (t, p, s): runner.expand(arm, t, s, "/s", (), None, pretraining=p)[0]
        for t in "ab" for p in (0, 1) for s in (0, 1)
    }  # fmt: skip
    for (t, p, s), stage in first.items():
        assert stage.directory == f"/s/loo/pretraining{p}/{t}/mt"
        assert list(stage.bindings) == [f"M = 'without_{t}'", f"t2t.runs.train.seed = {p}"]
    assert runner.unit(arm, 1, 1) == "pretraining1"
    unshared = dict(arm, stages=[dict(arm["stages"][0], share=None), arm["stages"][1]])
    assert runner.expand(unshared, "a", 1, "/s", (), None, pretraining=1)[0].directory == (
        "/s/loo/pretraining1/seed1/a/mt"
    )
    with pytest.raises(ValueError, match="shared only by its restarts"):
        everyone = dict(arm, stages=[dict(arm["stages"][0], share="all"), arm["stages"][1]])
        runner.expand(everyone, "a", 0, "/s", (), None)


def test_the_unit_of_replication_is_the_pretraining_or_the_run_itself():
    assert runner.unit(ARM, 1, 2) == runner.unit(ARM, 0, 2) == "pretraining2"
    assert runner.unit(ARM, 1, None) == runner.unit(ARM, 0, None) == "pretraining0"
    assert runner.unit(SCRATCH, 1, 2) == "pretraining2/seed1"  # every run trains for itself
    assert runner.unit(SCRATCH, 1, None) == "seed1"
    # One pretraining every arm starts from (share "all" in each, not replicated) is held fixed
    # by every comparison: each restart is a unit. Replicated (the fine-tuning methods' study,
    # each of 3 pretrainings shared by every arm), the pretrainings are the units, each arm's
    # restarts of one averaged. A stage "all" that only some arms have (STILTs' intermediate
    # task) is those arms' treatment: one unit.
    common = {"name": "pretrain", "gin_files": ["p.gin"], "share": "all"}
    method = {"name": "m", "stages": [common, {"name": "finetune", "gin_files": ["f.gin"]}]}
    middle = {"name": "intermediate", "gin_files": ["i.gin"], "share": "all"}
    stilts = {"name": "s", "stages": [common, middle, {"name": "finetune", "gin_files": ["f"]}]}
    assert runner.common_stages([method, stilts]) == ["pretrain"]
    assert runner.unit(method, 3, None, ["pretrain"]) == "seed3"
    assert runner.unit(stilts, 3, None, ["pretrain"]) == "pretraining0"
    assert runner.unit(method, 3, None) == "pretraining0"  # alone, its pretraining is its own
    assert runner.unit(method, 1, 2, ["pretrain"]) == runner.unit(method, 0, 2, ["pretrain"])
    assert runner.unit(method, 1, 2, ["pretrain"]) == "pretraining2"


def test_print_commands_lists_k_pretrainings_and_k_x_m_fine_tunings(tmp_path, capsys):
    study = tmp_path / "replicated.gin"
    study.write_text(
        "include 'studies/profiles/builtin_tiny.gin'\n"
        't2t.studies.run.tasks = ["builtin_order"]\n'
        "t2t.studies.run.arms = [\n"
        '  {"name": "a", "stages": [{"name": "pretrain", "gin_files": [%PRETRAIN], '
        '"bindings": [%PRETRAIN_STEPS], "share": "seeds"}, {"name": "finetune", '
        '"gin_files": [%FINETUNE], "bindings": [%FINETUNE_BINDINGS]}]},\n'
        '  {"name": "b", "stages": [{"name": "scratch", "gin_files": [%SCRATCH]}]}]\n'
    )
    from t2t import cli

    argv = ["study", f"--gin_file={study}", f"--study_dir={tmp_path / 's'}", "--print_commands"]
    assert cli.main([*argv, "--pretrainings=0,1,2", "--seeds=0,1"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    pretrain = [c for c in commands if "/a/pretraining" in c and "/pretrain'" in c]
    finetune = [c for c in commands if "/a/" in c and "/finetune'" in c]
    scratch = [c for c in commands if "/b/" in c]
    assert len(pretrain) == 3 and len(finetune) == 6 and len(scratch) == 6
    with pytest.raises(UserError, match="pretrainings must be a non-empty list of distinct"):
        runs.configure([str(study)], [])
        runner.run(study_dir=str(tmp_path / "s"), pretrainings=[0, 0], print_commands=True)


# Two arms, 3 pretrainings x 2 restarts each: the restarts of one pretraining are close, the
# pretrainings far apart (the case where a test over restarts is fooled).
SCORES = {
    ("a", "t", f"pretraining{p}/seed{s}"): value
    for p, pair in enumerate([(70.0, 71.0), (50.0, 52.0), (64.0, 63.0)])
    for s, value in enumerate(pair)
} | {
    ("b", "t", f"pretraining{p}/seed{s}"): value
    for p, pair in enumerate([(60.0, 60.5), (58.0, 57.0), (55.0, 56.0)])
    for s, value in enumerate(pair)
}
UNITS = {arm: {run: run.split("/")[0] for (a, _, run) in SCORES if a == arm} for arm in "ab"}


def test_arms_are_tested_over_their_pretrainings_means():
    result = aggregate.aggregate(SCORES, baselines={"t": 10.0}, units=UNITS)
    a, b = result["arms"]["a"], result["arms"]["b"]
    assert a["suite_by_unit"] == {"pretraining0": 70.5, "pretraining1": 51.0, "pretraining2": 63.5}
    assert b["suite_by_unit"] == {"pretraining0": 60.25, "pretraining1": 57.5, "pretraining2": 55.5}
    assert a["unit_suite"]["std"] == pytest.approx(statistics.stdev([70.5, 51.0, 63.5]))
    by_hand = scipy.stats.ttest_ind([60.25, 57.5, 55.5], [70.5, 51.0, 63.5], equal_var=False)
    assert b["p_value_units"] == pytest.approx(by_hand.pvalue)
    over_restarts = scipy.stats.ttest_ind(
        [60.0, 60.5, 58.0, 57.0, 55.0, 56.0], [70, 71, 50, 52, 64, 63], equal_var=False
    )
    assert b["p_value"] == pytest.approx(over_restarts.pvalue)
    # Without units every run is its own unit: the two levels agree.
    plain = aggregate.aggregate(SCORES, baselines={"t": 10.0})
    assert plain["arms"]["b"]["p_value_units"] == pytest.approx(plain["arms"]["b"]["p_value"])


def test_holm_on_a_worked_example():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.04 -> x4, x3, x2, x1 = 0.04, 0.06, 0.06, 0.04 -> made
    # non-decreasing: 0.04, 0.06, 0.06, 0.06.
    assert claims.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    # An untested claim stays untested and does not count in m (m = 2 here), and p caps at 1.
    assert claims.holm([None, 0.02, 0.6]) == [None, pytest.approx(0.04), pytest.approx(0.6)]
    assert claims.holm([0.7, 0.6]) == pytest.approx([1.0, 1.0])


def test_claims_parse_and_refuse_what_is_not_a_claim():
    arms = ["enc-dec, shared", "language model", "x"]
    assert claims.parse(["enc-dec, shared > language model"], arms) == [
        {
            "better": "enc-dec, shared",
            "worse": "language model",
            "claim": "enc-dec, shared > language model",
        }
    ]
    for bad, message in [
        ("x < language model", 'expected "A > B"'),
        ("x>language model", 'expected "A > B"'),
        ("x > y", r"no arm \['y'\]"),
        ("x > x", "with itself"),
    ]:
        with pytest.raises(UserError, match=message):
            claims.parse([bad], arms)


def _study(units_a, units_b, restarts=2):
    """A study.json-like aggregation whose arms have these pretraining means."""
    scores, units = {}, {}
    for arm, means in (("a", units_a), ("b", units_b)):
        for p, mean in enumerate(means):
            for s in range(restarts):
                run = f"pretraining{p}/seed{s}"
                scores[(arm, "t", run)] = mean + (0.5 if s else -0.5)
                units.setdefault(arm, {})[run] = f"pretraining{p}"
    return aggregate.aggregate(scores, baselines={"t": 0.0}, units=units)


def test_claims_are_counted_reproduced_contradicted_or_undecided():
    result = _study([80.0, 81.0, 82.0], [60.0, 61.5, 62.0])
    found = claims.evaluate(claims.parse(["a > b", "b > a"], ["a", "b"]), result)
    p = scipy.stats.ttest_ind([80, 81, 82], [60, 61.5, 62], equal_var=False).pvalue
    first, second = found["claims"]
    assert first["p_value"] == pytest.approx(p) and first["p_holm"] == pytest.approx(2 * p)
    assert first["difference"] == pytest.approx(81.0 - 61.1666666)
    assert (first["verdict"], second["verdict"]) == ("reproduced", "contradicted")
    assert (found["reproduced"], found["contradicted"], found["undecided"]) == (1, 1, 0)
    close = claims.evaluate(claims.parse(["a > b"], ["a", "b"]), _study([80, 70, 75], [74, 76, 71]))
    assert close["claims"][0]["verdict"] == "undecided"


def test_an_arm_with_one_pretraining_is_undecided_whatever_its_restarts_say():
    """The committed studies' case: every restart of an arm fine-tunes one checkpoint, so the
    restarts' p (tiny here) compares two checkpoints and decides no claim."""
    result = _study([80.0], [60.0], restarts=5)
    (found,) = claims.evaluate(claims.parse(["a > b"], ["a", "b"]), result)["claims"]
    assert found["units"] == [1, 1] and found["runs"] == [5, 5]
    assert found["p_value"] is None and found["p_value_runs"] < 1e-6
    assert found["verdict"] == "undecided"


def test_the_tally_corrects_over_every_studys_claims_and_leaves_out_null_studies():
    strong = _study([80.0, 81.0, 82.0], [60.0, 61.5, 62.0])
    weak = _study([80.0, 81.0, 82.5], [77.5, 79.0, 78.5])
    weaker = _study([80.0, 81.0, 82.5], [77.3, 78.8, 78.3])
    studies = {}
    for name, result in (("strong", strong), ("weak", weak), ("weaker", weaker)):
        result["claims"] = claims.evaluate(claims.parse(["a > b"], ["a", "b"]), result)
        studies[name] = result
    studies["null"] = _study([1.0, 2.0], [1.0, 2.0])  # no claims: listed, not counted
    studies["pilot"] = _study([1.0, 2.0], [1.0, 2.0])  # arms no claim is about: the same
    studies["pilot"]["claims"] = claims.evaluate([], studies["pilot"])
    p = [studies[name]["claims"]["claims"][0]["p_value"] for name in ("strong", "weak", "weaker")]
    assert p[0] < 0.001 and 0.025 < p[2] < p[1] < 0.05  # each significant alone
    assert all(studies[n]["claims"]["reproduced"] == 1 for n in ("strong", "weak", "weaker"))
    found = claims.tally(studies)
    # Holm over m = 3: 3 p0, then max(3 p0, 2 p2), then max(that, p1).
    assert [row["p_holm_all"] for row in found["claims"]] == pytest.approx(
        [3 * p[0], 2 * p[2], 2 * p[2]]
    )
    assert (found["reproduced"], found["undecided"], found["tested"]) == (1, 2, 3)
    assert found["per_study"]["weak"] == {"reproduced": 0, "contradicted": 0, "undecided": 1}
    assert found["not_counted"] == ["null", "pilot"]
    text = claims.tally_markdown(found)
    assert "1 reproduced, 0 contradicted, 2 undecided" in text and "lists no claims" in text
    # A superseded run keeps its claims in its study.json and is listed, not counted.
    without_strong = claims.tally(studies, superseded={"strong": "rerun as weak"})
    assert [row["study"] for row in without_strong["claims"]] == ["weak", "weaker"]
    assert without_strong["not_counted"] == ["null", "pilot"]
    assert "- strong: rerun as weak" in claims.tally_markdown(without_strong)


def test_a_study_continues_from_its_report_on_another_machine(tmp_path):
    """study.json is all that is left of a machine: the runs it reports are not trained again,
    except those of a pretraining it reports in part (all its runs train again, from one
    checkpoint), and the aggregation takes the reported scores."""
    import json

    grid = [
        runner.Cell(arm, "t", seed, pretraining)
        for arm in (ARM, SCRATCH)
        for pretraining in (0, 1)
        for seed in (0, 1)
    ]
    report = {
        "x": {"pretraining0/seed0": 60.0, "pretraining0/seed1": 61.0, "pretraining1/seed0": 40.0},
        "scratch": {"pretraining0/seed0": 30.0, "pretraining1/seed1": 31.0},
    }
    arms = {arm: {"tasks": {"t": {"by_seed": runs}}} for arm, runs in report.items()}
    (tmp_path / "study.json").write_text(json.dumps({"arms": arms}))
    local = tmp_path / "scratch" / "pretraining0" / "seed1" / "t"
    local.mkdir(parents=True)  # a run this machine scored
    (local / runner.SCORE_FILE).write_text(json.dumps({"score": 33.0}))

    todo, carried = runner._unscored(grid, str(tmp_path))
    assert [(c.arm["name"], c.pretraining, c.seed) for c in todo] == [
        ("x", 1, 0),
        ("x", 1, 1),
        ("scratch", 1, 0),
    ]
    assert [(c.arm["name"], c.pretraining, c.seed, score) for c, score in carried] == [
        ("x", 0, 0, 60.0),
        ("x", 0, 1, 61.0),
        ("scratch", 0, 0, 30.0),
        ("scratch", 1, 1, 31.0),
    ]
    # Carried into score.json files, they outlive a report of part of the grid.
    runner._carry(carried, str(tmp_path))
    (tmp_path / "study.json").write_text(json.dumps({"arms": {}}))
    assert [c.seed for c in runner._unscored(grid, str(tmp_path))[0]] == [0, 1, 0]
    scores, units = runner._scores_and_units(grid, str(tmp_path), False, (), None, "builtin")
    assert scores[("x", "t", "pretraining0/seed1")] == 61.0
    assert scores[("scratch", "t", "pretraining0/seed1")] == 33.0  # its own score first
    assert scores[("scratch", "t", "pretraining1/seed0")] is None
    assert units["x"]["pretraining1/seed0"] == "pretraining1"


def test_arm_names_with_commas_are_chosen_whole(tmp_path, capsys):
    names = ["full", "32 examples (1,000 repeats)", "a,b", "a"]
    split = runner.split_arm_names
    assert split("full, 32 examples (1,000 repeats)", names) == names[:2]
    assert split("a,b", names) == ["a,b"]  # the longest name that matches
    assert split("a, full,", names) == ["a", "full"]
    assert split("full,nope", names) == ["full", "nope"]  # the runner names it unknown
    study = tmp_path / "commas.gin"
    study.write_text(
        "include 'studies/profiles/builtin_tiny.gin'\n"
        't2t.studies.run.tasks = ["builtin_order"]\n'
        "t2t.studies.run.arms = [\n"
        '  {"name": "1,000 steps", "stages": [{"name": "scratch", "gin_files": [%SCRATCH]}]},\n'
        '  {"name": "b", "stages": [{"name": "scratch", "gin_files": [%SCRATCH]}]}]\n'
    )
    from t2t import cli

    argv = ["study", f"--gin_file={study}", f"--study_dir={tmp_path / 's'}", "--print_commands"]
    assert cli.main([*argv, "--seeds=0", "--arms=1,000 steps"]) == 0
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("t2t ")]
    assert len(commands) == 1 and "/1_000_steps/" in commands[0]
