"""Fault injection: stop `t2t train`, `t2t chain` or `t2t study` at random moments, fail the
store under it, kill one host of two, resume, and check nothing was lost.

One reference run goes through without interruption: for `train` (the default) the tiny demo
network (shrunk further, as the suite's tests do) for `--steps` steps; for `chain` a 2-stage
chain of that network (pretraining from scratch, then fine-tuning on builtin_package from the
first stage's last checkpoint, evaluated as it goes); for `study` a micro study (2 arms, one
task, one seed: a shared pretraining, a fine-tuning and a run from scratch, each scored).
Then, episode after episode, the same command runs in a fresh directory and is stopped at a
random moment (uniform over the time a whole reference run takes, so stops land in start-up,
compilation, training, evaluation and checkpoint writes alike) by SIGKILL (no cleanup at all) or
SIGTERM (t2t saves and exits 75), then started again, until it finishes. After every try
`t2t check` verifies every checkpoint of every model directory left behind. An episode passes
when, in every model directory (each stage, each run), the per-step training losses, the
evaluations and the final parameters equal the reference's exactly, and (study) so does every
run's score.

The store (`--store gcs`): every run's directory is in a bucket of a GCS emulator started here
(`t2t.testing.gcs_emulator`; TensorFlow, TensorStore and google-cloud-storage all reach it).
With `--store_faults RATE`, each request of every try fails with that probability: a 429 or
503 answer, the connection reset before the store sees it or after the store applied it (the
answer lost), or a 2 s stall. A try either finishes or exits with t2t's message (exit 2, no
traceback); it is then run again until it finishes. Counted besides: tracebacks, damaged
checkpoints, and silent restarts (a try that trained from step 0 where checkpoints were).

Two hosts (`--hosts 2`, `train`): every try is two `jax.distributed` processes; a stop goes to
one of them at random. A SIGKILLed process's peer must end within the watchdog's bound with a
message naming it (exit 76; JAX's own abort when process 0, the coordination service, is the
one killed), a SIGTERM to one must stop both at the same step with its checkpoint (exit 75).

    python benchmarks/fault_injection.py --kills 30 --terms 10       # about 25 min on 2 cores
    python benchmarks/fault_injection.py --kills 2 --terms 1 --steps 12   # a quick look
    python benchmarks/fault_injection.py --target chain --kills 10 --terms 5 --steps 20
    python benchmarks/fault_injection.py --target study --kills 10 --terms 5 --steps 20
    python benchmarks/fault_injection.py --store gcs --store_faults 0.05 --kills 0 --terms 0 \
        --episodes 10 --steps 60
    python benchmarks/fault_injection.py --hosts 2 --store gcs --kills 10 --terms 5 --steps 300

Results: benchmarks/results/fault_injection[_chain|_study][_gcs][_2hosts].json: every try
(its stop, exit codes, seconds from the stop to the last exit, the checkpoint steps of each
model directory before and after, damaged checkpoints, the store faults injected, t2t's last
message) and a summary on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

RECIPE = "gin/experiments/micro_run.gin"  # the suite's shrunk run (the demo, micro network)
PREEMPTED = 75  # t2t.trainer.loop.PREEMPTED_EXIT_CODE
TARGETS = ("train", "chain", "study")
RESULTS = os.path.join(os.path.dirname(__file__), "results")
DEFAULT_OUT = os.path.join(RESULTS, "fault_injection.json")
# The chain's second stage: short fine-tuning runs, evaluated as they go.
FINETUNE = [
    "TASK_FEATURE_LENGTHS={'inputs': 64, 'targets': 8}",
    "BATCH_SIZE=8",
    "t2t.runs.EvalOptions.steps=2",
    "t2t.runs.LoopOptions.progress=False",
    "t2t.runs.EvalOptions.num_predictions=0",
    "t2t.runs.LoopOptions.log_every=1",
]
# The micro study (tests/studies/test_study.py's, one seed): a shared pretraining, then one
# fine-tuning and one run from scratch on builtin_order, each scored.
STUDY = """\
include 'studies/profiles/builtin_tiny.gin'
PRETRAIN_STEPS = ["TRAIN_STEPS = {steps}", "t2t.runs.CheckpointOptions.every = {every}"]
FINETUNE_BINDINGS = ["TRAIN_STEPS = {steps}", "t2t.runs.EvalOptions.every = {every}",
                     "t2t.runs.CheckpointOptions.every = {every}",
                     "t2t.runs.EvalOptions.num_predictions = 0", "t2t.runs.LoopOptions.progress = False",
                     "t2t.runs.CheckpointOptions.keep = 1", "t2t.runs.LoopOptions.log_every = 1"]
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
    "include 'models/micro.gin'",
    "BATCH_SIZE = 8",
    "t2t.runs.LoopOptions.log_every = 1",
    "t2t.runs.seqio_evaluator.num_examples = 16",
]


def default_out(target: str, store: str = "local", hosts: int = 1) -> str:
    name = "fault_injection" + ("" if target == "train" else f"_{target}")
    name += "_gcs" if store == "gcs" else ""
    name += f"_{hosts}hosts" if hosts > 1 else ""
    return os.path.join(RESULTS, name + ".json")


def write_spec(target: str, workdir: str, steps: int, checkpoint_every: int) -> str | None:
    """Writes the chain or study file `target` runs into `workdir`; None for `train`."""
    if target == "train":
        return None
    path = os.path.join(workdir, f"{target}.gin")
    if target == "chain":
        pretrain = [
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
            '    {"name": "pretrain",\n'
            '     "gin_files": ["experiments/micro_run.gin"],\n'
            f'     "bindings": {pretrain!r}}},\n'
            f'    {{"name": "finetune", "gin_files": ["experiments/tiny_builtin_finetune.gin"],\n'
            f'     "bindings": {finetune!r}}},\n'
            "]\n"
        )
    elif target == "study":
        text = STUDY.format(steps=steps, every=checkpoint_every, bindings=STUDY_NETWORK)
    else:
        raise ValueError(f"--target must be one of {TARGETS}; got {target!r}")
    with open(path, "w") as f:  # the harness's own work directory
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
        f"MODEL_DIR='{model_dir}'",
        f"TRAIN_STEPS={steps}",
        f"t2t.runs.CheckpointOptions.every={checkpoint_every}",
    ]
    if HOSTS > 1:
        bindings.append("EVAL_TASKS=[]")
    return [*cli, "train", f"--gin_file={RECIPE}", *[f"--gin.{b}" for b in bindings]]


HOSTS = 1  # processes of a run (`--hosts`); each a host of one multi-host run
LOST_SECONDS = 10  # the watchdog's bound in two-host runs ($T2T_HOST_LOST_SECONDS)
JOIN_SECONDS = 60  # how long hosts wait for each other to join ($T2T_HOST_JOIN_SECONDS)
ENV: dict[str, str] = {}  # added to every run's environment (the GCS emulator's)


class Processes:
    """The processes of one try: one, or one per host of a multi-host run (`HOSTS`), each
    logging to its own file."""

    def __init__(self, argv: list[str], logs: list[str]):
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3", **ENV}
        hosts = []
        if HOSTS > 1:
            with socket.socket() as s:
                s.bind(("localhost", 0))
                port = s.getsockname()[1]
            env["T2T_HOST_LOST_SECONDS"] = str(LOST_SECONDS)
            env["T2T_HOST_JOIN_SECONDS"] = str(JOIN_SECONDS)
            env.pop("XLA_FLAGS", None)
            hosts = [
                {
                    "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
                    "JAX_NUM_PROCESSES": str(HOSTS),
                    "JAX_PROCESS_ID": str(i),
                }
                for i in range(HOSTS)
            ]
        self.logs = logs
        self._files = [open(log, "ab") for log in logs]  # the harness's own logs
        self.processes = [
            subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, env={**env, **h})
            for f, h in zip(self._files, hosts or [{}])
        ]

    def wait(self, timeout: float | None = None) -> list[int]:
        """Every process's exit code (TimeoutExpired while any still runs after `timeout`)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        codes = []
        for process in self.processes:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            codes.append(process.wait(timeout=left))
        for f in self._files:
            f.close()
        return codes

    def output(self, index: int = 0) -> str:
        with open(self.logs[index], "rb") as f:  # the harness's own logs
            return f.read().decode("utf-8", "replace")


def model_dirs(root: str) -> list[str]:
    """The model directories under `root` (itself included), local or in a bucket: those
    holding checkpoints or training logs, relative to `root`, sorted."""
    from t2t import files

    found = set()
    for name in files.files_under(root) if files.isdir(root) else []:
        parts = name.split("/")
        for depth, part in enumerate(parts[:-1]):
            if part in ("checkpoints", "damaged_checkpoints", "train"):
                found.add("/".join(parts[:depth]) or ".")
                break
    return sorted(found)


def saved_steps(model_dir: str) -> list[int]:
    from t2t import files

    path = files.join(model_dir, "checkpoints")
    if not files.isdir(path):
        return []
    from t2t.checkpoints import model_dir as model_dir_lib

    return model_dir_lib.ModelDir(model_dir).steps()  # committed steps only


def all_saved_steps(root: str) -> dict[str, list[int]]:
    from t2t import files

    return {name: saved_steps(files.join(root, name)) for name in model_dirs(root)}


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

    from t2t import files
    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.trainer import reporting

    losses = dict(reporting.read_scalars(files.join(model_dir, "train"))["loss"])
    evals = reporting.read_scalars(files.join(model_dir, "eval"))
    loaded = model_dir_lib.ModelDir(model_dir).load()
    return losses, evals, [np.asarray(x) for x in jax.tree.leaves(loaded.params)]


def outcomes(root: str) -> dict[str, tuple]:
    """`outcome` of every model directory under `root`, and every study run's score (under
    the key `scores`)."""
    from t2t import files

    found: dict[str, tuple] = {name: outcome(files.join(root, name)) for name in model_dirs(root)}
    scores = {}
    for name in files.files_under(root) if files.isdir(root) else []:
        if name.split("/")[-1] == "score.json":  # t2t.studies.runner.SCORE_FILE
            directory = name.rsplit("/", 1)[0] if "/" in name else "."
            scores[directory] = json.loads(files.read_text(files.join(root, name)))["score"]
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
    r"stopped by SIGTERM at step (\d+); its checkpoint is saved in (.+?)\. "
)
_FROM_SCRATCH = re.compile(r"trained steps 0 -> ")


def expected_exit(codes: list[int], number: int | None, target_process: int) -> bool:
    """Whether a try's exit codes are what its stop asks for. One process: SIGKILL -> killed;
    SIGTERM -> 75 (or 0, finished first; or killed by it before t2t's handler was set, in
    the first second of start-up); no stop -> 0, or 2/75/76 with a message (a store that kept
    failing). Two hosts: the killed one -> killed, its peer -> 76 (a lost peer) or JAX's own
    abort (-6: process 0, the coordination service, was killed, or a process was lost before
    all had joined); SIGTERM to one -> 75 on both (or 0), its peer 76 or -6 when the one
    stopped at once outside the training loop."""
    if number is None:
        return all(code in (0, 2, 75, 76) for code in codes)
    others = [c for i, c in enumerate(codes) if i != target_process]
    if number == signal.SIGKILL:
        peer_ok = (76, -signal.SIGABRT, 0)
        return codes[target_process] == -signal.SIGKILL and all(c in peer_ok for c in others)
    if codes[target_process] not in (PREEMPTED, 0, -signal.SIGTERM):
        return False
    peer_ok = (PREEMPTED, 0) if codes[target_process] == 0 else (PREEMPTED, 0, 76, -6)
    return all(c in peer_ok for c in others)


def _last_message(text: str) -> str:
    """The last line a try printed that is t2t's (`t2t COMMAND: ...` or `t2t: ...`)."""
    lines = [line for line in text.splitlines() if line.startswith("t2t")]
    return lines[-1][:400] if lines else ""


def run(
    kills: int,
    terms: int,
    steps: int,
    checkpoint_every: int,
    seed: int,
    workdir: str,
    report=print,
    target: str = "train",
    root_of=None,
    store_faults: float = 0.0,
    emulator=None,
    episodes: int | None = None,
) -> dict:
    """Runs the reference and the episodes (see the module docstring). `root_of(name)` is the
    directory of a run (default: under `workdir`; a bucket's prefix with `--store gcs`);
    `emulator` injects `store_faults` during the episodes' tries; `episodes` episodes of store
    faults alone when there are no stops."""
    from t2t import files

    rng = random.Random(seed)
    root_of = root_of or (lambda name: os.path.join(workdir, name))
    os.makedirs(os.path.join(workdir, "logs"), exist_ok=True)
    spec = write_spec(target, workdir, steps, checkpoint_every)
    reference_dir = root_of("reference")
    files.rmtree(reference_dir)
    logs = [os.path.join(workdir, "logs", f"reference_p{i}.log") for i in range(HOSTS)]
    began = time.perf_counter()
    codes = Processes(command(reference_dir, steps, checkpoint_every, target, spec), logs).wait()
    duration = time.perf_counter() - began
    if any(codes):
        raise RuntimeError(f"The reference run failed (exit {codes}); see {logs[0]}.")
    reference = outcomes(reference_dir)
    report(
        f"reference: {target}, {steps} steps per run, {HOSTS} process(es), "
        f"{len(model_dirs(reference_dir))} model directories, in {duration:.1f} s"
    )
    plan = [signal.SIGKILL] * kills + [signal.SIGTERM] * terms
    rng.shuffle(plan)
    faults_only = not plan
    episodes_left = (episodes or 1) if faults_only else None
    stops, tries, finished = [], [], []
    episode, try_number = 0, 0
    root = root_of(f"episode_{episode}")
    files.rmtree(root)
    while root is not None:
        before = all_saved_steps(root)
        logs = [
            os.path.join(workdir, "logs", f"episode_{episode}_try_{try_number}_p{i}.log")
            for i in range(HOSTS)
        ]
        if emulator is not None and store_faults:
            emulator.reset_stats()
            emulator.set_faults(store_faults, seed=rng.randrange(1 << 30), stall_seconds=2.0)
        group = Processes(command(root, steps, checkpoint_every, target, spec), logs)
        number, delay, target_process, exit_seconds = None, None, 0, None
        if plan:
            number, delay = plan[0], rng.uniform(0.0, duration)
            target_process = rng.randrange(HOSTS)
            try:
                codes = group.wait(timeout=delay)  # finished before the stop came
                number = None
            except subprocess.TimeoutExpired:
                group.processes[target_process].send_signal(number)
                stopped = time.perf_counter()
                codes = group.wait()
                exit_seconds = round(time.perf_counter() - stopped, 1)
                plan.pop(0)
        else:
            codes = group.wait()
        faults = {}
        if emulator is not None and store_faults:
            emulator.set_faults(0)
            faults = emulator.stats()["faults"]
        after = all_saved_steps(root)
        damaged = {
            name: damaged_steps
            for name in model_dirs(root)
            if (
                damaged_steps := sorted(
                    s for s, status in check(files.join(root, name)).items() if status == "damaged"
                )
            )
        }
        said = group.output(0)
        saved = _SIGTERM_SAVED.search(said)
        record = {
            "episode": episode,
            "try": try_number,
            "signal": signal.Signals(number).name if number else None,
            "process": target_process if number else None,
            "after_seconds": round(delay, 2) if number else None,
            "exit_codes": codes,
            "seconds_to_exit_after_stop": exit_seconds,
            "steps_before": before,
            "steps_after": after,
            "damaged": damaged,
            "store_faults": faults,
            "message": _last_message(said) if any(codes) else "",
            "traceback": any(
                "Traceback (most recent call last)" in group.output(i) for i in range(HOSTS)
            ),
            "restarted_from_scratch": any(before.values()) and bool(_FROM_SCRATCH.search(said)),
            "stopped_at": int(saved.group(1)) if saved else None,
            "expected_exit": expected_exit(codes, number, target_process),
        }
        if saved:
            stopped_in = _model_dir_of(saved.group(2), root)
            record["saved_its_step"] = int(saved.group(1)) in after.get(stopped_in, [])
        tries.append(record)
        if number:
            stops.append(record)
        report(
            f"episode {episode} try {try_number}: "
            + (
                f"{record['signal']} to process {target_process} after {delay:.1f} s, "
                if number
                else ""
            )
            + f"exit {codes}"
            + (f" ({exit_seconds} s after the stop)" if exit_seconds is not None else "")
            + f", checkpoints {_brief(before)} -> {_brief(after)}, damaged {damaged}"
            + (f", store faults {sum(faults.values())}" if faults else "")
            + (f": {record['message']}" if record["message"] else "")
        )
        try_number += 1
        if number is not None or any(codes):
            if try_number > 20:
                raise RuntimeError(f"Episode {episode} did not finish in 20 tries; see {logs[0]}.")
            continue  # the same command again
        verdict = same_all(outcomes(root), reference)
        result = {"episode": episode, "tries": try_number, **verdict}
        finished.append(result)
        report(
            f"episode {episode}: {try_number} tries, "
            f"{'identical to the reference' if result['exact'] else 'DIFFERS'}"
        )
        episode, try_number = episode + 1, 0
        if faults_only:
            episodes_left -= 1
        root = root_of(f"episode_{episode}") if (plan or (faults_only and episodes_left)) else None
        if root:
            files.rmtree(root)
    injected: dict[str, int] = {}
    for record in tries:
        for kind, count in record["store_faults"].items():
            injected[kind] = injected.get(kind, 0) + count
    summary = {
        "kills": sum(s["signal"] == "SIGKILL" for s in stops),
        "terms": sum(s["signal"] == "SIGTERM" for s in stops),
        "tries": len(tries),
        "tries_exiting_non_zero_unstopped": sum(
            1 for t in tries if t["signal"] is None and any(t["exit_codes"])
        ),
        "tracebacks": sum(t["traceback"] for t in tries),
        "store_faults_injected": injected,
        "damaged_checkpoints": sum(len(v) for t in tries for v in t["damaged"].values()),
        "silent_restarts": sum(t["restarted_from_scratch"] for t in tries),
        "unexpected_exit_codes": sum(not t["expected_exit"] for t in tries),
        "sigterm_while_training": sum(t["stopped_at"] is not None for t in stops),
        "sigterm_saved_its_step": sum(bool(t.get("saved_its_step")) for t in stops),
        "seconds_to_exit_after_stop_max": max(
            (t["seconds_to_exit_after_stop"] for t in stops if t["seconds_to_exit_after_stop"]),
            default=None,
        ),
        "episodes": len(finished),
        "episodes_exact": sum(e["exact"] for e in finished),
    }
    return {
        "settings": {
            "target": target,
            "steps": steps,
            "checkpoint_every": checkpoint_every,
            "seed": seed,
            "hosts": HOSTS,
            "host_lost_seconds": LOST_SECONDS if HOSTS > 1 else None,
            "store_faults": store_faults,
            "model_dirs": model_dirs(reference_dir),
            "reference_seconds": round(duration, 1),
        },
        "summary": summary,
        "tries": tries,
        "episodes": finished,
    }


def _model_dir_of(saved_in: str, root: str) -> str:
    """The model directory (relative to `root`) of the path a SIGTERM message names (the
    checkpoints directory)."""
    from t2t import files

    saved_in = files.normalize(saved_in)
    if files.basename(saved_in) == "checkpoints":
        saved_in = files.parent(saved_in)
    root = files.normalize(root)
    return "." if saved_in == root else saved_in[len(root) :].strip("/")


def _brief(steps: dict[str, list[int]]) -> str:
    """{".": [10, 20]} as "[10, 20]"; several directories as "name [steps], ..."."""
    if list(steps) == ["."]:
        return str(steps["."])
    return "{" + ", ".join(f"{name} {value}" for name, value in steps.items()) + "}"


def main(argv=None) -> int:
    global HOSTS
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=TARGETS, default="train", help="what to stop")
    parser.add_argument("--kills", type=int, default=30, help="SIGKILL stops")
    parser.add_argument("--terms", type=int, default=10, help="SIGTERM stops")
    parser.add_argument("--steps", type=int, default=300, help="training steps of each run")
    parser.add_argument("--checkpoint_every", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--store",
        choices=("local", "gcs"),
        default="local",
        help="model directories on a "
        "local disk, or in a bucket of a GCS emulator started here (t2t.testing.gcs_emulator)",
    )
    parser.add_argument(
        "--store_faults",
        type=float,
        default=0.0,
        help="with --store gcs: the rate of "
        "requests answered 429 or 503, reset, reset after being applied, or stalled",
    )
    parser.add_argument("--episodes", type=int, default=5, help="episodes without stops")
    parser.add_argument("--hosts", type=int, default=1, help="processes per run (train only)")
    parser.add_argument("--workdir", default=None, help="default: a temporary directory")
    parser.add_argument("--out", default=None, help="default: benchmarks/results/...")
    args = parser.parse_args(argv)
    if args.store_faults and args.store != "gcs":
        parser.error("--store_faults needs --store gcs")
    if args.hosts > 1 and args.target != "train":
        parser.error("--hosts applies to --target train")
    HOSTS = args.hosts
    os.environ.setdefault("JAX_PLATFORMS", "cpu")  # checks and comparisons read on the CPU
    workdir = args.workdir or tempfile.mkdtemp(prefix="t2t_faults_")
    started = time.time()
    emulator, root_of = None, None
    if args.store == "gcs":
        from t2t.testing.gcs_emulator import Emulator

        emulator = Emulator(buckets=["faults"]).start()
        os.environ.update(emulator.env)  # this process's checks read the bucket too
        ENV.update(emulator.env)
        root_of = lambda name: f"gs://faults/{name}"  # noqa: E731
    try:
        results = run(
            args.kills,
            args.terms,
            args.steps,
            args.checkpoint_every,
            args.seed,
            workdir,
            report=lambda line: print(f"[{time.time() - started:6.0f} s] {line}", flush=True),
            target=args.target,
            root_of=root_of,
            store_faults=args.store_faults,
            emulator=emulator,
            episodes=args.episodes,
        )
    finally:
        if emulator is not None:
            emulator.stop()
    results["settings"]["store"] = args.store
    results["command"] = "python benchmarks/fault_injection.py " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    results["machine"] = f"{os.cpu_count()} CPU cores, {platform.processor() or platform.machine()}"
    out = args.out or default_out(args.target, args.store, args.hosts)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:  # the harness's own results
        json.dump(results, f, indent=1)
    print(json.dumps(results["summary"], indent=1))
    good = results["summary"]
    return (
        0
        if (
            good["damaged_checkpoints"] == 0
            and good["unexpected_exit_codes"] == 0
            and good["silent_restarts"] == 0
            and good["tracebacks"] == 0
            and good["episodes_exact"] == good["episodes"]
            and good["sigterm_saved_its_step"] == good["sigterm_while_training"]
        )
        else 1
    )


if __name__ == "__main__":
    sys.exit(main())
