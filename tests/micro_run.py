"""The suite's shrunk training run (gin/experiments/micro_run.gin: the demo's recipe on the
micro network; real data, gin, checkpoints) with a checkpoint every 3 steps. The reliability
and object-store tests train it; its uninterrupted 9 steps, their reference, are trained once
per test session (`straight`) and only read after."""

import fcntl
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPE = os.path.join(REPO, "gin/experiments/micro_run.gin")  # the demo on the micro network
CHECKPOINT_EVERY = 3
STRAIGHT_STEPS = 9


def argv(model_dir, steps, *extra) -> list[str]:
    """The `t2t train` arguments of `steps` steps of the run in `model_dir`."""
    return [
        "train",
        f"--gin_file={RECIPE}",
        f"--gin.MODEL_DIR='{model_dir}'",
        f"--gin.t2t.runs.CheckpointOptions.every={CHECKPOINT_EVERY}",
        f"--gin.TRAIN_STEPS={steps}",
        *extra,
    ]


def straight(root: str) -> str:
    """The model directory of the uninterrupted 9-step run under `root` (the session's shared
    directory): trained by the first process to ask, under a lock; the others wait and read it."""
    from t2t import cli

    run = os.path.join(root, "straight_micro_run")
    with open(os.path.join(root, ".straight.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(run + ".done"):
            assert cli.main(argv(run, STRAIGHT_STEPS)) == 0
            open(run + ".done", "w").close()
    return run
