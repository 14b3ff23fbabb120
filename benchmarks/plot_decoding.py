"""Plots the recorded `decoding_bench.py` runs: t2t / HF ratios per run, against the 1.5x target.

Reads the JSON results in `benchmarks/results/` (batch 16, 128 input tokens, 64 output tokens)
and writes `benchmarks/results/decoding_ratios.png`:

- top: output tokens/s of t2t over HF for greedy and beam-4, best run (filled) and median run
  (hollow), one column per benchmark run; the model-parallel runs (`--model-parallel 2`) on the
  right;
- shaded: the runs whose decoding steps multiply kernel first (from run 14 on);
- bottom: where the ratio comes from, t2t's speed-up on each step after the first and on the
  first token (encoder, cross-attention set-up and one step), for the runs that measured them.

    python benchmarks/plot_decoding.py [--results benchmarks/results] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
TARGET = 1.5
METHODS = {"greedy": "tab:blue", "beam-4": "tab:orange"}

# (label, file, machine) in the order the runs were taken; benchmarks/README.md tells the story.
# Run 2's file was overwritten by run 7 (both `decoding.json`), so only its table row remains.
RUNS = (
    ("1", "decoding_repeat.json", "A"),
    ("3", "decoding_run3.json", "A"),
    ("4", "decoding_run4.json", "A"),
    ("5", "decoding_run5.json", "A"),
    ("6", "decoding_run6.json", "A"),
    ("7", "decoding.json", "A"),
    ("8", "decoding_run8.json", "B"),
    ("9", "decoding_run9.json", "B"),
    ("10", "decoding_run10.json", "C"),
    ("11", "decoding_run11.json", "C"),
    ("12", "decoding_run12.json", "D"),
    ("13", "decoding_run13.json", "E"),
    ("14", "decoding_run14.json", "E"),
    ("15", "decoding_run15.json", "E"),
    ("mp1", "decoding_model_parallel_run1.json", "A"),
    ("mp2", "decoding_model_parallel_run2.json", "A"),
    ("mp3", "decoding_model_parallel_run3.json", "C"),
    ("mp4", "decoding_model_parallel_run4.json", "C"),
)

# Runs of the code whose decoding steps multiply kernel first (t2t.nn.layers.kernel_first_matmul).
KERNEL_FIRST_RUNS = ("14", "15")


def load_runs(results: pathlib.Path) -> list[tuple[str, str, dict]]:
    """The runs whose files exist, as (label, machine, parsed JSON)."""
    runs = []
    for label, name, machine in RUNS:
        path = results / name
        if not path.exists():
            continue
        record = json.loads(path.read_text())
        args = record.get("args", {})
        if (args.get("batch"), args.get("input_length"), args.get("new_tokens")) != (16, 128, 64):
            raise ValueError(f"{path} is not a batch-16, 128 -> 64 token run: {args}")
        runs.append((label, machine, record))
    if not runs:
        raise FileNotFoundError(f"no decoding results under {results}; run decoding_bench.py")
    return runs


def plot(runs: list[tuple[str, str, dict]], out: pathlib.Path) -> None:
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    xs = range(len(runs))
    offsets = {"greedy": -0.12, "beam-4": 0.12}
    for method, color in METHODS.items():
        dx = offsets[method]
        best = [r["methods"][method]["ratio_best"] for _, _, r in runs]
        median = [r["methods"][method]["ratio_median"] for _, _, r in runs]
        top.scatter([x + dx for x in xs], best, color=color, label=f"{method}, best run")
        top.scatter(
            [x + dx for x in xs],
            median,
            facecolors="none",
            edgecolors=color,
            label=f"{method}, median run",
        )
        for part, marker in (("step_ratio", "o"), ("first_token_ratio", "^")):
            points = [
                (x + dx, r["methods"][method]["phases"][part])
                for x, (_, _, r) in zip(xs, runs)
                if "phases" in r["methods"][method]
            ]
            if points:
                what = "each further step" if part == "step_ratio" else "first token"
                bottom.scatter(*zip(*points), color=color, marker=marker, label=f"{method}, {what}")
    for axis in (top, bottom):
        axis.axhline(TARGET, color="gray", linestyle="--", linewidth=1)
        axis.axhline(1.0, color="black", linewidth=0.5)
        axis.grid(axis="y", alpha=0.3)
        for x in range(1, len(runs)):  # a line where the machine (or the mode) changes
            if runs[x][1] != runs[x - 1][1] or runs[x][0].startswith("mp") != runs[x - 1][
                0
            ].startswith("mp"):
                axis.axvline(x - 0.5, color="gray", linewidth=0.5)
    for axis in (top, bottom):  # room below the points for the legend
        low, high = axis.get_ylim()
        axis.set_ylim(low - 0.35 * (high - low), high)
    top.text(len(runs) - 0.5, TARGET, f" target {TARGET}x", va="bottom", ha="right", color="gray")
    labels = [label for label, _, _ in runs]
    if KERNEL_FIRST_RUNS[0] in labels:  # shade the runs with kernel-first decoding steps
        first = labels.index(KERNEL_FIRST_RUNS[0])
        last = max(labels.index(label) for label in KERNEL_FIRST_RUNS if label in labels)
        for axis in (top, bottom):
            axis.axvspan(first - 0.5, last + 0.5, color="tab:green", alpha=0.08, linewidth=0)
        top.text(
            (first + last) / 2,
            top.get_ylim()[1],
            "kernel-first steps",
            ha="center",
            va="top",
            color="tab:green",
            fontsize=8,
        )
    top.set_ylabel("t2t / HF output tokens/s")
    top.set_title(
        "T5-small decoding, 16 x 128 tokens -> 64, vs. HF transformers generate (2 CPU cores)"
    )
    top.legend(fontsize=8, ncol=2, loc="lower left")
    bottom.set_ylabel("t2t speed-up (HF time / t2t time)")
    bottom.legend(fontsize=8, ncol=2, loc="lower left")
    bottom.set_xticks(list(xs), [f"{label}\n{machine}" for label, machine, _ in runs])
    bottom.set_xlabel("benchmark run (mp: --model-parallel 2) and machine")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    out = args.out or args.results / "decoding_ratios.png"
    plot(load_runs(args.results), out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
