"""Fault injection: kill `t2t train`, `t2t chain` or `t2t study` at random moments, resume,
and check nothing was lost.

One reference run goes through without interruption: for `train` (the default) the tiny demo
network (shrunk further, as the suite's tests do) for `--steps` steps; for `chain` a 2-stage
chain of that network (pretraining from scratch, then fine-tuning on builtin_package from the
first stage's last checkpoint, evaluated as it goes); for `study` a micro study (2 arms, one
task, one seed: a shared pretraining, a fine-tuning and a run from scratch, each scored).
Then, episode after episode, the same command runs in a fresh directory and is stopped at a
random moment (uniform over the time a whole reference run takes, so stops land in start-up,
compilation, training, evaluation and checkpoint writes alike) by SIGKILL (no cleanup at all) or
SIGTERM (t2t saves and exits 75), then started again, until it finishes. After every stop
`t2t check` verifies every checkpoint of every model directory left behind. An episode passes
when, in every model directory (each stage, each run), the per-step training losses, the
evaluations and the final parameters equal the reference's exactly, and (study) so does every
run's score.

    python benchmarks/fault_injection.py --kills 30 --terms 10       # about 25 min on 2 cores
    python benchmarks/fault_injection.py --kills 2 --terms 1 --steps 12   # a quick look
    python benchmarks/fault_injection.py --target chain --kills 10 --terms 5 --steps 20
    python benchmarks/fault_injection.py --target study --kills 10 --terms 5 --steps 20

Results: benchmarks/results/fault_injection.json (`train`; fault_injection_chain.json,
fault_injection_study.json for the others): every stop (signal, moment, exit code, the
checkpoint steps of each model directory before and after, damaged checkpoints) and a summary on
stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

DEMO = "gin/experiments/tiny_builtin_demo.gin"
SMALL = [  # the suite's shrunk demo network (tests/runs/test_train_run.py), checkpointing often
    "t2t.nn.get_preset.d_model=64",
    "t2t.nn.get_preset.d_ff=128",
    "t2t.nn.get_preset.num_heads=2",
    "t2t.nn.get_preset.d_kv=32",
    "t2t.nn.get_preset.num_encoder_layers=1",
    "t2t.nn.get_preset.num_decoder_layers=1",
    "TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 16}",
    "BATCH_SIZE=8",
    "t2t.runs.train.progress=False",
    "t2t.runs.EvalOptions.num_predictions=0",
    "t2t.runs.train.log_every=1",
    "t2t.runs.EvalOptions.every=None",
]
PREEMPTED = 75  # t2t.trainer.loop.PREEMPTED_EXIT_CODE
TARGETS = ("train", "chain", "study")
RESULTS = os.path.join(os.path.dirname(__file__), "results")
DEFAULT_OUT = os.path.join(RESULTS, "fault_injection.json")
# The chain's second stage: short fine-tuning runs, evaluated as they go.
FINETUNE = [
    "TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}",
    "BATCH_SIZE=8",
    "t2t.runs.EvalOptions.steps=2",
    "t2t.runs.train.progress=False",
    "t2t.runs.EvalOptions.num_predictions=0",
    "t2t.runs.train.log_every=1",
]
# The micro study (tests/studies/test_study.py's, one seed): a shared pretraining, then one
# fine-tuning and one run from scratch on builtin_order, each scored.
STUDY = """\
include 'studies/profiles/builtin_tiny.gin'
PRETRAIN_STEPS = ["TRAIN_STEPS = {steps}", "t2t.runs.CheckpointOptions.every = {every}"]
FINETUNE_BINDINGS = ["TRAIN_STEPS = {steps}", "t2t.runs.EvalOptions.every = {every}",
                     "t2t.runs.CheckpointOptions.every = {every}",
                     "t2t.runs.EvalOptions.num_predictions = 0", "t2t.runs.train.progress = False",
                     "t2t.runs.CheckpointOptions.keep = 1", "t2t.runs.train.log_every = 1"]
t2t.studies.run.name = "fault_injection"
t2t.studies.run.tasks = ["builtin_order"]
t2t.studies.run.seeds = [0]
t2t.studies.run.bindings = {bindings!r}
t2t.studies.run.task_feature_lengths = {{"builtin_order": {{"inputs": 32, "targets": 4}}}}
t2t.studies.run.arms = [
    {{"name": "pre-trained", "stages": [
        {{"name": "pretrain", "gin_files": [%PRETRAIN],
         "bindings": [%PRETRAIN_STEPS, %PRETRAIN_BINDINGS,
                      "TASK_FEATURE_LENGTHS = {{'inputs': 32, 'targets': 8}}"],
         "share": "study"}},
        {{"name": "finetune", "gin_files": [%FINETUNE], "bindings": [%FINETUNE_BINDINGS]}}]}},
    {{"name": "no pre-training", "stages": [
        {{"name": "scratch", "gin_files": [%SCRATCH], "bindings": [%FINETUNE_BINDINGS]}}]}},
]
"""
STUDY_NETWORK = [
    "t2t.nn.get_preset.d_model = 32",
    "t2t.nn.get_preset.d_ff = 64",
    "t2t.nn.get_preset.num_heads = 2",
    "t2t.nn.get_preset.d_kv = 16",
    "t2t.nn.get_preset.num_encoder_layers = 1",
    "t2t.nn.get_preset.num_decoder_layers = 1",
    "BATCH_SIZE = 8",
    "t2t.runs.train.log_every = 1",
    "t2t.runs.seqio_evaluator.num_examples = 16",
]


def default_out(target: str) -> str:
    name = "fault_injection.json" if target == "train" else f"fault_injection_{target}.json"
    return os.path.join(RESULTS, name)


def write_spec(target: str, workdir: str, steps: int, checkpoint_every: int) -> str | None:
    """Writes the chain or study file `target` runs into `workdir`; None for `train`."""
    if target == "train":
        return None
    path = os.path.join(workdir, f"{target}.gin")
    if target == "chain":
        pretrain = [
            *SMALL,
            f"TRAIN_STEPS={steps}",
            f"t2t.runs.CheckpointOptions.every={checkpoint_every}",
        ]
        finetune = [
            *FINETUNE,
            f"TRAIN_STEPS={steps}",
            f"t2t.runs.CheckpointOptions.every={checkpoint_every}",
            f"t2t.runs.EvalOptions.every={checkpoint_every}",
        ]
        text = (
            "import t2t.chain\n"
            "MODEL_DIR = %gin.REQUIRED\n"
            "t2t.chain.run.model_dir = %MODEL_DIR\n"
            "t2t.chain.run.stages = [\n"
            f'    {{"name": "pretrain", "gin_files": ["experiments/tiny_builtin_demo.gin"],\n'
            f'     "bindings": {pretrain!r}}},\n'
            f'    {{"name": "finetune", "gin_files": ["experiments/tiny_builtin_finetune.gin"],\n'
            f'     "bindings": {finetune!r}}},\n'
            "]\n"
        )
    elif target == "study":
        text = STUDY.format(steps=steps, every=checkpoint_every, bindings=STUDY_NETWORK)
    else:
        raise ValueError(f"--target must be one of {TARGETS}; got {target!r}")
    with open(path, "w") as f:
        f.write(text)
    return path


def command(
    model_dir: str,
    steps: int,
    checkpoint_every: int,
    target: str = "train",
    spec: str | None = None,
) -> list[str]:
    """The command line of one try: `model_dir` is the run's, the chain's or the study's."""
    cli = [sys.executable, "-m", "t2t.cli"]
    if target == "chain":
        return [*cli, "chain", f"--gin_file={spec}", f"--gin.MODEL_DIR='{model_dir}'"]
    if target == "study":
        return [*cli, "study", f"--gin_file={spec}", f"--study_dir={model_dir}"]
    bindings = [
        *SMALL,
        f"MODEL_DIR='{model_dir}'",
        f"TRAIN_STEPS={steps}",
        f"t2t.runs.CheckpointOptions.every={checkpoint_every}",
    ]
    return [*cli, "train", f"--gin_file={DEMO}", *[f"--gin.{b}" for b in bindings]]


def start(argv: list[str], log) -> subprocess.Popen:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)


def model_dirs(root: str) -> list[str]:
    """The model directories under `root` (itself included): those holding checkpoints or
    training logs, relative to `root`, sorted."""
    found = []
    for directory, subdirectories, _ in os.walk(root):
        if {"checkpoints", "damaged_checkpoints", "train"} & set(subdirectories):
            found.append(os.path.relpath(directory, root))
            subdirectories.clear()
    return sorted(found)


def saved_steps(model_dir: str) -> list[int]:
    path = os.path.join(model_dir, "checkpoints")
    if not os.path.isdir(path):
        return []
    return sorted(int(n) for n in os.listdir(path) if n.isdigit())


def all_saved_steps(root: str) -> dict[str, list[int]]:
    return {name: saved_steps(os.path.join(root, name)) for name in model_dirs(root)}


def check(model_dir: str) -> dict[int, str]:
    """{step: status} of every checkpoint (`t2t check`'s verification)."""
    from t2t.checkpoints import model_dir as model_dir_lib

    if not saved_steps(model_dir):
        return {}
    return {step: status for step, (status, _) in model_dir_lib.ModelDir(model_dir).check().items()}


def outcome(model_dir: str) -> tuple[dict[int, float], dict, list]:
    """The per-step losses (the last logged value of each step), every evaluation scalar and
    the final parameters."""
    import jax
    import numpy as np

    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.trainer import reporting

    losses = dict(reporting.read_scalars(os.path.join(model_dir, "train"))["loss"])
    evals = reporting.read_scalars(os.path.join(model_dir, "eval"))
    loaded = model_dir_lib.ModelDir(model_dir).load()
    return losses, evals, [np.asarray(x) for x in jax.tree.leaves(loaded.params)]


def outcomes(root: str) -> dict[str, tuple]:
    """`outcome` of every model directory under `root`, and every study run's score (under
    the key `scores`)."""
    found: dict[str, tuple] = {name: outcome(os.path.join(root, name)) for name in model_dirs(root)}
    scores = {}
    for directory, _, files in os.walk(root):
        if "score.json" in files:  # t2t.studies.runner.SCORE_FILE
            with open(os.path.join(directory, "score.json")) as f:
                scores[os.path.relpath(directory, root)] = json.load(f)["score"]
    return {**found, "scores": scores}


def same(a: tuple, b: tuple) -> dict:
    import numpy as np

    losses_a, evals_a, params_a = a
    losses_b, evals_b, params_b = b
    steps_equal = sorted(losses_a) == sorted(losses_b)
    loss_gap = max(
        (abs(losses_a[s] - losses_b[s]) for s in losses_a if s in losses_b), default=float("inf")
    )
    params_equal = len(params_a) == len(params_b) and all(
        np.array_equal(x, y) for x, y in zip(params_a, params_b)
    )
    return {
        "steps_equal": steps_equal,
        "max_loss_difference": loss_gap,
        "evals_identical": evals_a == evals_b,
        "params_identical": params_equal,
        "exact": steps_equal and loss_gap == 0.0 and evals_a == evals_b and params_equal,
    }


def same_all(a: dict, b: dict) -> dict:
    """`same` per model directory; exact when the directories, each of them and the scores
    agree."""
    names = sorted((set(a) | set(b)) - {"scores"})
    per_dir = {
        name: same(a[name], b[name]) if name in a and name in b else {"exact": False}
        for name in names
    }
    scores_equal = a.get("scores") == b.get("scores")
    return {
        "model_dirs": per_dir,
        "scores_identical": scores_equal,
        "exact": scores_equal and all(v["exact"] for v in per_dir.values()),
    }


_SIGTERM_SAVED = re.compile(
    rb"stopped by SIGTERM at step (\d+); its checkpoint is saved in (.+?)\. "
)


def run(
    kills: int,
    terms: int,
    steps: int,
    checkpoint_every: int,
    seed: int,
    workdir: str,
    report=print,
    target: str = "train",
) -> dict:
    rng = random.Random(seed)
    os.makedirs(workdir, exist_ok=True)
    spec = write_spec(target, workdir, steps, checkpoint_every)
    log_path = os.path.join(workdir, "runs.log")
    log = open(log_path, "ab")
    reference_dir = os.path.join(workdir, "reference")
    shutil.rmtree(reference_dir, ignore_errors=True)
    began = time.perf_counter()
    code = start(command(reference_dir, steps, checkpoint_every, target, spec), log).wait()
    duration = time.perf_counter() - began
    if code != 0:
        raise RuntimeError(f"The reference run failed (exit {code}); see {workdir}/runs.log.")
    reference = outcomes(reference_dir)
    report(
        f"reference: {target}, {steps} steps per run, {len(model_dirs(reference_dir))} model "
        f"directories, in {duration:.1f} s"
    )
    plan = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms
    rng.shuffle(plan)
    stops, episodes, episode = [], [], 0
    root = os.path.join(workdir, f"episode_{episode}")
    shutil.rmtree(root, ignore_errors=True)
    stops_in_episode = 0
    while plan or root is not None:
        before = all_saved_steps(root)
        log.flush()
        offset = log.tell()
        process = start(command(root, steps, checkpoint_every, target, spec), log)
        if plan:
            number = plan[0]
            delay = rng.uniform(0.0, duration)
            try:
                code = process.wait(timeout=delay)  # finished before the stop came
            except subprocess.TimeoutExpired:
                process.send_signal(number)
                code = process.wait()
                plan.pop(0)
                after = all_saved_steps(root)
                with open(log_path, "rb") as f:
                    f.seek(offset)
                    said = _SIGTERM_SAVED.search(f.read())
                stopped_at = int(said.group(1)) if said else None
                stopped_in = _model_dir_of(said.group(2).decode(), root) if said else None
                damaged = {
                    name: damaged_steps
                    for name in model_dirs(root)
                    if (
                        damaged_steps := sorted(
                            s
                            for s, status in check(os.path.join(root, name)).items()
                            if status == "damaged"
                        )
                    )
                }
                record = {
                    "episode": episode,
                    "signal": signal.Signals(number).name,
                    "after_seconds": round(delay, 2),
                    "exit_code": code,
                    "steps_before": before,
                    "steps_after": after,
                    "damaged": damaged,
                    "stopped_at": stopped_at,
                    "stopped_in": stopped_in,
                    "saved_its_step": stopped_at is not None
                    and stopped_at in after.get(stopped_in, []),
                    "expected_exit": code
                    in ((-signal.SIGKILL,) if number == signal.SIGKILL else (PREEMPTED, 0)),
                }
                stops.append(record)
                stops_in_episode += 1
                report(
                    f"stop {len(stops)}: {record['signal']} after {delay:.1f} s, exit "
                    f"{code}, checkpoints {_brief(before)} -> {_brief(after)}, damaged {damaged}"
                )
                continue
        else:
            code = process.wait()
        if code != 0:
            raise RuntimeError(f"Episode {episode} exited {code} unstopped; see runs.log.")
        verdict = same_all(outcomes(root), reference)
        result = {"episode": episode, "stops": stops_in_episode, **verdict}
        episodes.append(result)
        report(
            f"episode {episode}: {stops_in_episode} stops, "
            f"{'identical to the reference' if result['exact'] else 'DIFFERS'}"
        )
        episode += 1
        stops_in_episode = 0
        root = os.path.join(workdir, f"episode_{episode}") if plan else None
        if root:
            shutil.rmtree(root, ignore_errors=True)
    log.close()
    summary = {
        "kills": sum(s["signal"] == "SIGKILL" for s in stops),
        "terms": sum(s["signal"] == "SIGTERM" for s in stops),
        "stops_followed_by_exact_resume": sum(e["stops"] for e in episodes if e["exact"]),
        "damaged_checkpoints": sum(len(v) for s in stops for v in s["damaged"].values()),
        "unexpected_exit_codes": sum(not s["expected_exit"] for s in stops),
        # SIGTERM while training: the step it stopped at has a checkpoint afterwards.
        "sigterm_while_training": sum(s["stopped_at"] is not None for s in stops),
        "sigterm_saved_its_step": sum(s["saved_its_step"] for s in stops),
        "episodes": len(episodes),
        "episodes_exact": sum(e["exact"] for e in episodes),
    }
    return {
        "settings": {
            "target": target,
            "steps": steps,
            "checkpoint_every": checkpoint_every,
            "seed": seed,
            "model_dirs": model_dirs(reference_dir),
            "reference_seconds": round(duration, 1),
        },
        "summary": summary,
        "stops": stops,
        "episodes": episodes,
    }


def _model_dir_of(saved_in: str, root: str) -> str:
    """The model directory (relative to `root`) of the path a SIGTERM message names (the
    checkpoints directory)."""
    if os.path.basename(os.path.normpath(saved_in)) == "checkpoints":
        saved_in = os.path.dirname(os.path.normpath(saved_in))
    return os.path.relpath(saved_in, root)


def _brief(steps: dict[str, list[int]]) -> str:
    """{".": [10, 20]} as "[10, 20]"; several directories as "name [steps], ..."."""
    if list(steps) == ["."]:
        return str(steps["."])
    return "{" + ", ".join(f"{name} {value}" for name, value in steps.items()) + "}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, default="train", help="what to stop")
    parser.add_argument("--kills", type=int, default=30, help="SIGKILL stops")
    parser.add_argument("--terms", type=int, default=10, help="SIGTERM stops")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument(
        "--out", default=None, help="default: benchmarks/results/fault_injection[_TARGET].json"
    )
    args = parser.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # checks and comparisons read on the CPU
    workdir = args.workdir or tempfile.mkdtemp(prefix="t2t_faults_")
    started = time.time()
    results = run(
        args.kills,
        args.terms,
        args.steps,
        args.checkpoint_every,
        args.seed,
        workdir,
        report=lambda line: print(f"[{time.time() - started:6.0f} s] {line}", flush=True),
        target=args.target,
    )
    results["command"] = "python benchmarks/fault_injection.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    out = args.out or default_out(args.target)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)
    print(json.dumps(results["summary"], indent=1))
    good = results["summary"]
    return (
        0
        if (
            good["damaged_checkpoints"] == 0
            and good["unexpected_exit_codes"] == 0
            and good["episodes_exact"] == good["episodes"]
            and good["sigterm_saved_its_step"] == good["sigterm_while_training"]
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
