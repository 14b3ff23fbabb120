"""What a person watching a run sees: TensorBoard scalars, a console progress bar, a loss curve.

- `ScalarWriter` writes scalar summaries as TensorBoard event files with the `tensorboard`
  package alone (no TensorFlow op runs, nothing touches an accelerator).
- `read_scalars` reads them back, honouring restarts, so a resumed run plots its whole history.
- `Progress` is the console bar: steps, ETA, and the latest loss, accuracy and tokens/s.
- `plot_loss_curve` draws `<model_dir>/loss_curve.png` with matplotlib's Agg backend.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
import time
from collections.abc import Mapping, Sequence

import jax
import numpy as np

from t2t import files

# The per-step quantity both curves of the plot share: nats per real target token.
CURVE_TRAIN_TAG = "cross_ent_per_token"
CURVE_EVAL_SUFFIX = "/loss"


class NoWriter:
    """What the processes of a multi-host run other than process 0 write: nothing."""

    def restart(self, first_step: int) -> None:
        del first_step

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        del step, scalars

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


class ScalarWriter:
    """Appends scalar summaries to a TensorBoard event file under `directory`.

    Example:
      writer = ScalarWriter("<model_dir>/train")
      writer.restart(101)       # resumed after step 100: hides older events from step 101 on
      writer.write(101, {"loss": 2.3, "token_accuracy": 41.0})
      writer.flush()
    """

    def __init__(self, directory: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        files.makedirs(directory)
        self.directory = directory
        self._writer = EventFileWriter(directory)

    def restart(self, first_step: int) -> None:
        """Marks a (re)start whose first event will be at `first_step`: TensorBoard then drops
        the events from `first_step` on that an earlier, interrupted run wrote, so a resumed
        run's curves do not show the lost steps twice."""
        from tensorboard.compat.proto import event_pb2

        event = event_pb2.Event(
            wall_time=time.time(),
            step=first_step,
            session_log=event_pb2.SessionLog(status=event_pb2.SessionLog.START),
        )
        self._writer.add_event(event)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2

        values = [
            summary_pb2.Summary.Value(tag=tag, simple_value=float(value))
            for tag, value in scalars.items()
        ]
        event = event_pb2.Event(
            wall_time=time.time(), step=int(step), summary=summary_pb2.Summary(value=values)
        )
        self._writer.add_event(event)

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def run_writers(model_dir: str, first_step: int) -> dict[str, ScalarWriter | NoWriter]:
    """The TensorBoard writers of `<model_dir>/train` and `<model_dir>/eval` on process 0,
    (re)started at `first_step` (`ScalarWriter.restart`); no-op writers elsewhere (only
    process 0 writes run-level files)."""
    writers = {}
    for name in ("train", "eval"):
        if jax.process_index() != 0:
            writers[name] = NoWriter()
            continue
        writers[name] = ScalarWriter(files.join(model_dir, name))
        writers[name].restart(first_step)
    return writers


def read_scalars(directory: str, max_step: int | None = None) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the event files under `directory`: tag -> [(step, value)], by step.

    Events an interrupted run wrote past the step its successor restarted from are dropped (the
    `restart` markers), and so is anything past `max_step`.
    """
    if not files.glob(files.join(directory, "events.out.tfevents.*")):
        return {}
    from tensorboard.backend.event_processing import event_accumulator

    accumulator = event_accumulator.EventAccumulator(
        directory, size_guidance={event_accumulator.SCALARS: 0}, purge_orphaned_data=True
    )
    # The purge at a restart marker is what the marker asks for, not news: TensorBoard's
    # "out of order event.step ... Purging expired events" warning stays off the console.
    with _quiet_logger("tensorboard"):
        accumulator.Reload()
    scalars = {}
    for tag in accumulator.Tags()["scalars"]:
        points = {e.step: e.value for e in accumulator.Scalars(tag)}  # a step's last value wins
        scalars[tag] = sorted(
            (s, v) for s, v in points.items() if max_step is None or s <= max_step
        )
    return scalars


@contextlib.contextmanager
def _quiet_logger(name: str):
    """Drops the warnings of the logger `name` (errors still pass) while the block runs."""
    logger = logging.getLogger(name)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


class Progress:
    """A console progress bar over training steps with ETA and the latest metrics.

    Writes to stderr; `note` prints a line above the bar (evaluations, checkpoints).
    """

    def __init__(
        self, total_steps: int, initial_step: int, *, enabled: bool = True, silent: bool = False
    ):
        """`enabled`: draw the bar (notes print as plain lines otherwise); `silent`: print
        nothing at all (the processes of a multi-host run other than process 0)."""
        from tqdm import tqdm

        self._bar = tqdm(
            total=total_steps,
            initial=initial_step,
            disable=silent or not enabled,
            unit="step",
            dynamic_ncols=True,
            file=sys.stderr,
            mininterval=1.0,
            smoothing=0.1,
        )
        self.enabled = enabled and not silent
        self.silent = silent

    def advance(self, steps: int = 1) -> None:
        self._bar.update(steps)

    def show(self, metrics: Mapping[str, float]) -> None:
        shown = {}
        for name, label, fmt in (
            ("loss", "loss", "{:.3f}"),
            ("token_accuracy", "acc", "{:.1f}%"),
            ("tokens_per_second", "tok/s", "{:.0f}"),
        ):
            if name in metrics:
                shown[label] = fmt.format(metrics[name])
        self._bar.set_postfix(shown, refresh=False)

    def note(self, line: str) -> None:
        if self.silent:
            return
        if self.enabled:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, flush=True)

    def close(self) -> None:
        self._bar.close()


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing moving average (the first points average what there is)."""
    cumulative = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    ends = np.arange(1, len(values) + 1)
    return (cumulative[ends] - cumulative[ends - counts]) / counts


def plot_loss_curve(
    path: str,
    train: Sequence[tuple[int, float]],
    evals: Mapping[str, Sequence[tuple[int, float]]] = (),
    *,
    title: str = "",
) -> None:
    """Writes a PNG of the training loss (raw and smoothed) and each eval loss against step.

    Args:
      path: the PNG to write (replaced atomically).
      train: (step, training cross-entropy per target token) points.
      evals: eval name -> (step, eval loss) points.
      title: the figure title (e.g. the model directory).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(8, 4.5), dpi=100)
    if train:
        steps, values = (np.asarray(v, np.float64) for v in zip(*train))
        axis.plot(steps, values, color="tab:blue", alpha=0.25, linewidth=0.8)
        window = max(1, len(values) // 50)
        axis.plot(
            steps,
            _smooth(values, window),
            color="tab:blue",
            label=f"train (moving average of {window})",
        )
    for name, points in dict(evals).items():
        if points:
            steps, values = zip(*points)
            axis.plot(steps, values, marker="o", markersize=3, label=f"eval {name}")
    axis.set_xlabel("step")
    axis.set_ylabel("cross-entropy per target token (nats)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    if train or any(evals.values() if isinstance(evals, Mapping) else ()):
        axis.legend()
    figure.tight_layout()
    image = io.BytesIO()
    figure.savefig(image, format="png")
    plt.close(figure)
    files.write_bytes(path, image.getvalue())
