"""Every fine-tuning method of the paper (and LoRA, prompt tuning) from the demo's checkpoint on
the built-in task builtin_package: the metric reached, the share of parameters trained and the
wall time, as `t2t train` runs them (one process per method, in turn, nothing else running).

    make demo                                   # runs/demo: the pretrained tiny model
    python studies/finetuning_methods.py        # ~30 min on 2 CPU cores
    python studies/finetuning_methods.py --markdown   # the table from the results

Each run: gin/experiments/tiny_builtin_finetune.gin (batch 32, inputs 128 / targets 8, constant
learning rate, the best checkpoint by validation accuracy kept) plus the method's file from
gin/finetuning/, STEPS steps, evaluated (greedy decoding, accuracy on the whole validation
split) every STEPS / 2 steps. Results: studies/results/finetuning_methods.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "studies", "results", "finetuning_methods")
METRIC = "builtin_package/accuracy"
# name -> (method gin file or None, extra bindings, what the method is)
METHODS = {
    "all parameters": (None, [], "every parameter trains (the paper's baseline)"),
    "adapters d=32": (
        "adapters",
        ["ADAPTER_SIZE = 32"],
        "adapter layers after every feed-forward block, and layer norms",
    ),
    "adapters d=128": ("adapters", ["ADAPTER_SIZE = 128"], "the same, 128 hidden units"),
    "gradual unfreezing": (
        "gradual_unfreezing",
        ["EPISODE_STEPS = {half}"],
        "top layer of each stack first, one more per episode",
    ),
    "layer-wise rates": (
        "layerwise_rates",
        ["LAYER_DECAY = 0.7"],
        "layer i's updates scaled by 0.7^(n-1-i)",
    ),
    "feature extraction": (
        "feature_extraction",
        [],
        "frozen encoder and embedding, pretrained decoder trains",
    ),
    "new decoder": (
        "feature_extraction_new_decoder",
        [],
        "frozen encoder, re-initialized decoder trains",
    ),
    "LoRA r=8": ("lora", ["LORA_RANK = 8"], "rank-8 updates of the attention query and value"),
    "prompt tuning": (
        "prompt_tuning",
        ["PROMPT_LENGTH = 20"],
        "20 learned input vectors, everything else frozen",
    ),
}


def run_method(name: str, demo: str, steps: int, out_dir: str) -> dict:
    method, bindings, _ = METHODS[name]
    model_dir = os.path.join(out_dir, name.replace(" ", "_").replace("=", ""))
    command = [
        sys.executable,
        "-m",
        "t2t.cli",
        "train",
        "--gin_file=gin/experiments/tiny_builtin_finetune.gin",
    ]
    if method:
        command.append(f"--gin_file=gin/finetuning/{method}.gin")
    half = max(steps // 2, 1)
    flags = [
        f"INIT_CHECKPOINT='{demo}'",
        f"MODEL_DIR='{model_dir}'",
        f"TRAIN_STEPS={steps}",
        f"t2t.runs.EvalOptions.every={half}",
        f"t2t.runs.CheckpointOptions.every={half}",
        "t2t.runs.EvalOptions.num_predictions=0",
        "t2t.runs.LoopOptions.progress=False",
        *[b.format(half=half).replace(" = ", "=") for b in bindings],
    ]
    command += [f"--gin.{flag}" for flag in flags]
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {' '.join(command[3:])}", flush=True)
    start = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    return {
        "method": name,
        "gin": method,
        "bindings": bindings,
        "seconds": seconds,
        **_results(model_dir),
    }


def _results(model_dir: str) -> dict:
    sys.path.insert(0, ROOT)
    from t2t.checkpoints.model_dir import ModelDir
    from t2t.trainer import reporting

    evals = reporting.read_scalars(os.path.join(model_dir, "eval"))
    accuracy = dict(evals[METRIC])
    trained = ModelDir(model_dir).metadata()["finetuning"]
    return {
        "accuracy_by_step": accuracy,
        "final_accuracy": accuracy[max(accuracy)],
        "best_accuracy": max(accuracy.values()),
        "trainable_parameters": trained["trainable_parameters"],
        "total_parameters": trained["total_parameters"],
        "trainable_fraction": trained["trainable_fraction"],
    }


def markdown(results: dict) -> str:
    majority = results.get("majority_baseline") or majority_baseline()
    lines = [
        f"Fine-tuning the demo checkpoint on builtin_package for {results['steps']} steps "
        f"(batch 32); accuracy (%) on the {results['validation_examples']}-example "
        "validation split (at steps 100 and 200: the end, and the better of the two); "
        f"always answering the most frequent package scores {majority:.1f}; wall time of "
        "the whole `t2t train` process (start-up, compile, training, two evaluations); "
        f"{results['machine']}.",
        "",
        "| method | what trains | parameters trained | accuracy at the end | best | wall time |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["runs"]:
        share = row["trainable_fraction"]
        lines.append(
            f"| {row['method']} | {METHODS[row['method']][2]} | "
            f"{row['trainable_parameters']:,} ({share:.1%}) | {row['final_accuracy']:.1f} | "
            f"{row['best_accuracy']:.1f} | {row['seconds'] / 60:.1f} min |"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--demo", default="runs/demo", help="the pretrained model directory")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out_dir", default="runs/finetuning_methods")
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--markdown", action="store_true", help="only print the table")
    args = parser.parse_args(argv)
    if args.markdown:
        with open(RESULTS + ".json") as f:
            print(markdown(json.load(f)))
        return 0
    if not os.path.isdir(os.path.join(ROOT, args.demo, "checkpoints")):
        print(f"No pretrained checkpoint in {args.demo}: run `make demo` first.", file=sys.stderr)
        return 2
    runs = [
        run_method(name, args.demo, args.steps, args.out_dir) for name in args.methods.split(",")
    ]
    results = {
        "steps": args.steps,
        "runs": runs,
        "validation_examples": _validation_size(),
        "majority_baseline": majority_baseline(),
        "machine": f"{os.cpu_count()} CPU cores ({platform.processor() or 'x86_64'}), "
        "one run at a time",
        "command": "python studies/finetuning_methods.py " + " ".join(argv or sys.argv[1:]),
    }
    os.makedirs(os.path.dirname(RESULTS), exist_ok=True)
    with open(RESULTS + ".json", "w") as f:
        json.dump(results, f, indent=1)
    table = markdown(results)
    with open(RESULTS + ".md", "w") as f:
        f.write(table + "\n")
    print(table)
    return 0


def _validation_packages() -> list[str]:
    sys.path.insert(0, ROOT)
    from t2t.data.builtin import cache

    corpus = cache.get_or_build(None)
    with open(corpus.package_path("validation")) as f:
        return [line.rstrip("\n").split("\t")[1] for line in f if line.strip()]


def _validation_size() -> int:
    return len(_validation_packages())


def majority_baseline() -> float:
    """Accuracy (%) of always predicting the validation split's most frequent package."""
    import collections

    packages = _validation_packages()
    return 100.0 * collections.Counter(packages).most_common(1)[0][1] / len(packages)


if __name__ == "__main__":
    sys.exit(main())
