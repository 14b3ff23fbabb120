"""What a paper claims of a study's arms, and whether the study reproduced it.

A study file lists the claims, pair by pair, each a direction: `claims = ["15% > 10%",
"15% > 50%"]` (arm names as the study names them; ">" reads "does better than"). Only those
are counted: a pair of arms the paper does not compare, or an ordering inside its noise, is no
claim.

Each claim is tested with Welch's t-test on the arms' units of replication (each pretraining's
mean over its fine-tuning restarts, `t2t.studies.aggregate`): restarts of one checkpoint are
not independent samples of an objective. An arm with a single pretraining shared by its
restarts cannot be tested at that level; its claims stay undecided, and the restart-level
p-value (which compares two checkpoints) is shown beside.

Holm's step-down correction holds the family-wise error at 5% over every claim tested (those of
one study in its report, those of every study in the tally): sort the m p-values ascending,
multiply the i-th smallest (from 0) by m - i, make the sequence non-decreasing, cap at 1. A
claim is then

- reproduced: the study orders the arms as the paper, adjusted p < 0.05;
- contradicted: the study orders them the other way, adjusted p < 0.05;
- undecided: otherwise (too close, too few replicas, or not testable).

    python -m t2t.studies.claims studies/results/builtin_tiny     # the tally over every study
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from t2t import files
from t2t.errors import UserError
from t2t.studies import aggregate

SIGNIFICANCE = 0.05
VERDICTS = ("reproduced", "contradicted", "undecided")


def parse(claims: Sequence[str], arms: Sequence[str]) -> list[dict[str, str]]:
    """[{"better": A, "worse": B, "claim": "A > B"}] of "A > B" strings; raises UserError for
    a claim that is not of that form or names an arm the study does not have."""
    if isinstance(claims, str) or not isinstance(claims, Sequence):
        raise UserError(
            f't2t.studies.run.claims must be a list of "A > B" strings, got {claims!r}.'
        )
    parsed = []
    for text in claims:
        parts = text.split(" > ") if isinstance(text, str) else []
        if len(parts) != 2:
            raise UserError(
                f'Claim {text!r}: expected "A > B" (arm A does better than arm B, with spaces '
                'around ">").'
            )
        better, worse = (part.strip() for part in parts)
        unknown = [name for name in (better, worse) if name not in arms]
        if unknown:
            raise UserError(f"Claim {text!r}: no arm {unknown} in the study; it has {list(arms)}.")
        if better == worse:
            raise UserError(f"Claim {text!r} compares an arm with itself.")
        parsed.append({"better": better, "worse": worse, "claim": f"{better} > {worse}"})
    return parsed


def holm(p_values: Sequence[float | None]) -> list[float | None]:
    """Holm's adjusted p-values, in the input's order; None (an untested claim) stays None and
    does not count in m."""
    tested = sorted((p, i) for i, p in enumerate(p_values) if p is not None)
    adjusted: list[float | None] = [None] * len(p_values)
    running = 0.0
    for rank, (p, index) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[index] = running
    return adjusted


def test(claim: Mapping[str, str], result: Mapping[str, Any]) -> dict[str, Any]:
    """One claim against an aggregation: the difference of the arms' means (better minus
    worse, in score points), the units each has, the unit-level and restart-level p."""
    better, worse = (result["arms"][claim[side]] for side in ("better", "worse"))
    units = [
        list(arm.get("suite_by_unit", arm["suite_by_seed"]).values()) for arm in (better, worse)
    ]
    runs = [list(arm["suite_by_seed"].values()) for arm in (better, worse)]
    means = [aggregate.spread(values)["mean"] for values in units]
    testable = all(len(values) >= 2 for values in units)
    return {
        **claim,
        "difference": None if None in means else means[0] - means[1],
        "units": [len(values) for values in units],
        "runs": [len(values) for values in runs],
        "p_value": aggregate.welch_p_value(*units) if testable else None,
        "p_value_runs": aggregate.welch_p_value(*runs),
    }


def verdict(tested: Mapping[str, Any], adjusted: float | None) -> str:
    if adjusted is None or tested["difference"] is None or adjusted >= SIGNIFICANCE:
        return "undecided"
    return "reproduced" if tested["difference"] > 0 else "contradicted"


def evaluate(claims: Sequence[Mapping[str, str]], result: Mapping[str, Any]) -> dict[str, Any]:
    """Every claim tested, Holm-adjusted over this study's claims, with its verdict, and the
    counts: {"claims": [...], "reproduced": n, "contradicted": n, "undecided": n}."""
    tested = [test(claim, result) for claim in claims]
    adjusted = holm([t["p_value"] for t in tested])
    for entry, p in zip(tested, adjusted):
        entry["p_holm"] = p
        entry["verdict"] = verdict(entry, p)
    return {"claims": tested, **counts(tested)}


def counts(tested: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    return {name: sum(t["verdict"] == name for t in tested) for name in VERDICTS}


# A study directory holding this file (a line saying what replaced it) is not counted.
SUPERSEDED_FILE = "SUPERSEDED"
CLAIMS_FILE = "CLAIMS.md"


def tally(
    studies: Mapping[str, Mapping[str, Any]], superseded: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """Every study's claims, Holm-adjusted over all of them together.

    Args:
      studies: name -> its study.json (with "claims", from `evaluate`); a study without claims
        (a null study, a pilot, or one the paper makes no claim of) is listed and not counted.
      superseded: name -> what replaced it: runs kept for the record, listed and not counted
        (their claims are the replacement's).
    """
    superseded = dict(superseded or {})
    studies = {name: ({} if name in superseded else result) for name, result in studies.items()}
    rows = [
        {**claim, "study": name} for name, result in studies.items() for claim in _claims_of(result)
    ]
    adjusted = holm([row["p_value"] for row in rows])
    for row, p in zip(rows, adjusted):
        row["p_holm_all"] = p
        row["verdict_all"] = verdict(row, p)
    counted = [name for name, result in studies.items() if _claims_of(result)]
    per_study = {
        name: {
            verdict_name: sum(r["verdict_all"] == verdict_name for r in rows if r["study"] == name)
            for verdict_name in VERDICTS
        }
        for name in counted
    }
    return {
        "claims": rows,
        "tested": sum(row["p_value"] is not None for row in rows),
        "per_study": per_study,
        "not_counted": [n for n in studies if n not in counted and n not in superseded],
        "superseded": superseded,
        **{name: sum(r["verdict_all"] == name for r in rows) for name in VERDICTS},
    }


def _claims_of(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list((result.get("claims") or {}).get("claims", []))


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.2g}"


def markdown_rows(
    claims: Sequence[Mapping[str, Any]], holm_key: str, verdict_key: str
) -> list[str]:
    lines = [
        "| claim | difference | units (runs) | p | p over restarts | p (Holm) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in claims:
        difference = "-" if c["difference"] is None else f"{c['difference']:+.1f}"
        sizes = f"{c['units'][0]} ({c['runs'][0]}) vs {c['units'][1]} ({c['runs'][1]})"
        lines.append(
            f"| {c['claim']} | {difference} | {sizes} | {_p(c['p_value'])} | "
            f"{_p(c['p_value_runs'])} | {_p(c[holm_key])} | {c[verdict_key]} |"
        )
    return lines


def tally_markdown(result: Mapping[str, Any]) -> str:
    lines = [
        "# The paper's claims on the built-in benchmark",
        "",
        f"{len(result['claims'])} claims, {result['tested']} testable over units of "
        f"replication; Holm's correction over those {result['tested']}: "
        f"**{result['reproduced']} reproduced, {result['contradicted']} contradicted, "
        f"{result['undecided']} undecided** (adjusted p < {SIGNIFICANCE}).",
        "",
        "| study | reproduced | contradicted | undecided |",
        "|---|---|---|---|",
    ]
    for name, row in result["per_study"].items():
        lines.append(
            f"| {name} | {row['reproduced']} | {row['contradicted']} | {row['undecided']} |"
        )
    if result["not_counted"]:
        lines += [
            "",
            "Not counted (their study.json lists no claims: a null study, a superseded run, a "
            "pilot, or a run not yet aggregated with its claims): "
            + ", ".join(result["not_counted"]),
        ]
    if result.get("superseded"):
        lines += ["", "Superseded, kept for the record and not counted:"]
        lines += [f"- {name}: {why}" for name, why in result["superseded"].items()]
    lines += [
        "",
        "p: Welch's t-test over units of replication (each pretraining's mean over its "
        "restarts; a run that pretrains for itself is its own unit); '-' where an arm has one "
        "pretraining shared by its restarts. p over restarts compares two checkpoints and is "
        "shown only beside.",
        "",
    ]
    for name in result["per_study"]:
        lines += [f"## {name}", ""]
        rows = [r for r in result["claims"] if r["study"] == name]
        lines += markdown_rows(rows, "p_holm_all", "verdict_all") + [""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(
        prog="python -m t2t.studies.claims",
        description="Tally the paper's claims over every study.json under a directory "
        "(Holm's correction over all of them); writes CLAIMS.md there.",
    )
    parser.add_argument("results", help="a directory of study directories (each with study.json)")
    args = parser.parse_args(argv)
    result = read(args.results)
    text = tally_markdown(result)
    files.write_text(files.join(args.results, CLAIMS_FILE), text)
    print(text)
    return result


def read(results: str) -> dict[str, Any]:
    """The tally over every `study.json` one level under `results` (a directory marked
    `SUPERSEDED` is listed with its reason and not counted)."""
    studies, superseded = {}, {}
    for name in sorted(files.listdir(results)):
        path = files.join(results, name, "study.json")
        if files.exists(path):
            studies[name] = json.loads(files.read_text(path))
            marker = files.join(results, name, SUPERSEDED_FILE)
            if files.exists(marker):
                superseded[name] = " ".join(files.read_text(marker).split())
    return tally(studies, superseded)


if __name__ == "__main__":
    main()
