"""A study's report: `study.json` (everything), `study.md` (the table a person reads) and
`study.png` (suite averages with error bars, and each task's)."""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from t2t import files
from t2t.studies import aggregate
from t2t.studies import claims as claims_lib
from t2t.studies import paper as paper_data

# A reproduced ordering counts as significant below this p-value.
SIGNIFICANCE = 0.05


def paper_comparison(result: Mapping[str, Any], spec: Mapping[str, Any]) -> dict[str, Any]:
    """The paper's numbers for the study's arms and which pairwise orderings reproduced.

    Args:
      result: from `aggregate.aggregate`.
      spec: {"table": "10", "column": "GLUE", "rows": {arm: the paper's row label}}; or, for a
        companion study without numbers here, {"ordering": [arms, best first], "citation":
        "..."}.
    """
    if "ordering" in spec:  # an ordering only: ranks stand in for scores
        order = list(spec["ordering"])
        values = {arm: float(len(order) - i) for i, arm in enumerate(order)}
        ours = {
            arm: entry["suite"]["mean"]
            for arm, entry in result["arms"].items()
            if entry["suite"]["mean"] is not None
        }
        pairs = _with_p_values(result, aggregate.compare_orderings(ours, values))
        return {
            "table": None,
            "column": "ordering",
            "rows": {a: a for a in order},
            "values": values,
            "pairs": pairs,
            **_counts(pairs),
            "citation": spec["citation"],
        }
    table, column = str(spec["table"]), spec.get("column", "GLUE")
    values = {arm: paper_data.value(table, row, column) for arm, row in spec["rows"].items()}
    values = {arm: v for arm, v in values.items() if v is not None}
    ours = {
        arm: entry["suite"]["mean"]
        for arm, entry in result["arms"].items()
        if entry["suite"]["mean"] is not None
    }
    pairs = _with_p_values(result, aggregate.compare_orderings(ours, values))
    return {
        "table": table,
        "column": column,
        "rows": dict(spec["rows"]),
        "values": values,
        "pairs": pairs,
        **_counts(pairs),
        "citation": paper_data.CITATION,
    }


def _with_p_values(result: Mapping[str, Any], pairs: list[dict[str, Any]]) -> list[dict]:
    """Each pair with Welch's p-value of its two arms' per-seed suite averages: an ordering
    reproduced by a difference the restarts cannot tell from noise is not evidence."""
    for pair in pairs:
        a, b = (list(result["arms"][arm].get("suite_by_seed", {}).values()) for arm in pair["pair"])
        pair["p_value"] = aggregate.welch_p_value(a, b)
    return pairs


def _counts(pairs: list[dict[str, Any]]) -> dict[str, int]:
    return {
        "reproduced": sum(p["reproduced"] for p in pairs),
        "compared": len(pairs),
        "significant": sum(
            p["reproduced"] and p["p_value"] is not None and p["p_value"] < SIGNIFICANCE
            for p in pairs
        ),
    }


def _cell(stats: Mapping[str, Any]) -> str:
    if not stats["n"]:
        return "-"
    return f"{stats['mean']:.1f} ± {stats['std']:.1f}"


def markdown(result: Mapping[str, Any]) -> str:
    """The study's report: each arm's scores by task with units and p-values, the claims of the
    paper with their verdicts, and every pair the paper scores."""
    replicas = result.get("pretrainings")
    restarts = f"seeds {result.get('seeds')}" + (
        f" of each of pretrainings {replicas}" if replicas else ""
    )
    lines = [
        f"# {result.get('name', 'study')}",
        "",
        f"Mean ± sample std over the runs ({restarts}) of each task's score (the mean of its "
        "metrics, best evaluation of the run); suite = per run the mean over tasks. Degenerate: "
        "runs at or below the task's constant baseline. Units: the arm's units of replication "
        "(its pretrainings; a run that pretrains for itself is its own unit), their suite "
        "means' std beside. p: Welch's t-test of the suite averages against "
        f"`{result['baseline_arm']}` over units (over runs in brackets: restarts of one "
        "checkpoint compare checkpoints, not arms).",
        "",
        *_arms_table(result),
        "",
        "Ordering here (best first): " + " > ".join(result["ordering"]),
        *_claims_section(result.get("claims")),
        "",
        *_paper_section(result.get("paper")),
    ]
    if result["missing"]:
        lines += ["", f"Runs without a result: {len(result['missing'])}."]
    return "\n".join(lines) + "\n"


def _arms_table(result: Mapping[str, Any]) -> list[str]:
    tasks = result["tasks"]
    lines = [
        "| arm | " + " | ".join(tasks) + " | suite | min / max | degenerate | units | p |",
        "|---|" + "---|" * (len(tasks) + 5),
    ]
    for arm, entry in result["arms"].items():
        suite = entry["suite"]
        degenerate = sum(entry["tasks"][t]["degenerate"] for t in tasks)
        runs = sum(entry["tasks"][t]["n"] for t in tasks)
        units = entry.get("unit_suite", suite)
        p, p_units = entry.get("p_value"), entry.get("p_value_units")
        p_text = "-" if arm == result["baseline_arm"] else f"{_p(p_units)} ({_p(p)})"
        lines.append(
            f"| {arm} | "
            + " | ".join(_cell(entry["tasks"][t]) for t in tasks)
            + f" | {_cell(suite)} | "
            + (f"{suite['min']:.1f} / {suite['max']:.1f}" if suite["n"] else "-")
            + f" | {degenerate}/{runs} | {units['n']}"
            + (f" (± {units['std']:.1f})" if units["n"] > 1 else "")
            + f" | {p_text} |"
        )
    baselines = result["baselines"]
    lines.append(
        "| constant baseline | "
        + " | ".join(f"{baselines[t]:.1f}" for t in tasks)
        + f" | {sum(baselines[t] for t in tasks) / len(tasks):.1f} | | | |"
    )
    return lines


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


def _claims_section(found: Mapping[str, Any] | None) -> list[str]:
    if found is None:
        return []
    return [
        "",
        f"The paper's claims of these arms: {found['reproduced']} reproduced, "
        f"{found['contradicted']} contradicted, {found['undecided']} undecided (Welch's "
        "t-test over units, Holm's correction over this study's claims, adjusted p < "
        f"{claims_lib.SIGNIFICANCE}; undecided where an arm has one unit).",
        "",
        *claims_lib.markdown_rows(found["claims"], "p_holm", "verdict"),
    ]


def _paper_section(comparison: Mapping[str, Any] | None) -> list[str]:
    if not comparison:
        return []
    values = comparison["values"]
    paper_order = sorted(values, key=lambda a: -values[a])
    if comparison["table"] is None:
        heading = "Ordering in the cited study: " + " > ".join(paper_order)
    else:
        heading = (
            f"Ordering in the paper (Table {comparison['table']}, {comparison['column']}): "
            + " > ".join(f"{a} ({values[a]:.2f})" for a in paper_order)
        )
    lines = [
        heading,
        "",
        f"Every pair the paper scores, claimed or not: orderings as the paper's "
        f"{comparison['reproduced']} of {comparison['compared']}, "
        f"{comparison.get('significant', 0)} of them with p < {SIGNIFICANCE} over runs "
        "(uncorrected; the claims above are what counts).",
        "",
        "| pair | paper | here | p | reproduced |",
        "|---|---|---|---|---|",
    ]
    for pair in comparison["pairs"]:
        lines.append(
            f"| {pair['pair'][0]} vs {pair['pair'][1]} | {pair['paper']} | {pair['ours']} | "
            f"{_p(pair.get('p_value'))} | {'yes' if pair['reproduced'] else 'no'} |"
        )
    return [*lines, "", f"Paper: {comparison['citation']}"]


def plot(result: Mapping[str, Any], path: str) -> None:
    """Writes `figure(result)` to `path`."""
    import matplotlib.pyplot as plt

    fig = figure(result)
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=110)
    plt.close(fig)
    files.write_bytes(path, image.getvalue())


def figure(result: Mapping[str, Any]):
    """Suite averages per arm and each task's, as bars (mean ± std over runs) with each run's
    score as a dot, so degenerate restarts show, the restarts of one pretraining in one color;
    the constant baseline as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    arms, tasks = list(result["arms"]), result["tasks"]
    panels = ["suite", *tasks]
    columns = min(len(panels), 4)
    rows = -(-len(panels) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 3.2 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        entries = [result["arms"][a] for a in arms]
        if panel == "suite":
            stats = [e["suite"] for e in entries]
            seeds = [e.get("suite_by_seed", {}) for e in entries]
            base = np.mean([result["baselines"][t] for t in tasks])
        else:
            stats = [e["tasks"][panel] for e in entries]
            seeds = [s.get("by_seed", {}) for s in stats]
            base = result["baselines"][panel]
        means = [s["mean"] if s["n"] else np.nan for s in stats]
        stds = [s["std"] if s["n"] else 0.0 for s in stats]
        positions = np.arange(len(arms))
        ax.bar(positions, means, yerr=stds, capsize=3, color="#4c72b0", alpha=0.6)
        for position, by_seed, entry in zip(positions, seeds, entries):
            values = list(by_seed.values())
            if values:  # spread sideways so equal scores stay countable
                offsets = np.linspace(-0.25, 0.25, len(values)) if len(values) > 1 else [0.0]
                ax.scatter(
                    position + np.asarray(offsets),
                    values,
                    s=9,
                    color=_unit_colors(by_seed, entry.get("unit_of_run", {})),
                    zorder=3,
                )
        ax.axhline(base, color="#c44e52", linestyle="--", linewidth=1, label="constant")
        ax.set_title(panel, fontsize=9)
        ax.set_xticks(positions, arms, rotation=35, ha="right", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(result.get("name", "study"), fontsize=10)
    fig.tight_layout()
    return fig


_UNIT_COLORS = ("black", "#dd8452", "#55a868", "#8172b3", "#937860", "#da8bc3", "#8c8c8c")


def _unit_colors(by_run: Mapping[str, Any], unit_of_run: Mapping[str, str]) -> list[str]:
    """One color per unit of replication (a pretraining's restarts alike), black when each run
    is its own unit."""
    units = [unit_of_run.get(run, run) for run in by_run]
    if len(set(units)) == len(units):
        return ["black"] * len(units)
    order = list(dict.fromkeys(units))
    return [_UNIT_COLORS[order.index(u) % len(_UNIT_COLORS)] for u in units]


def write(study_dir: str, result: Mapping[str, Any]) -> None:
    """study.json, study.md and study.png in `study_dir`."""
    files.makedirs(study_dir)
    files.write_text(files.join(study_dir, "study.json"), json.dumps(_jsonable(result), indent=1))
    files.write_text(files.join(study_dir, "study.md"), markdown(result))
    plot(result, files.join(study_dir, "study.png"))


def _jsonable(value):
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value
