"""The training loop: restore or initialize, step, log, evaluate, checkpoint, stop safely.

`Trainer` owns one run's state (parameters, optimizer state, step, counters) and its model
directory. It

- restores the latest checkpoint of the model directory if there is one (parameters,
  optimizer state, input-pipeline position and counters, onto whatever mesh the run has), and
  otherwise starts from a HF T5 directory, another run's checkpoint (parameters only) or random
  initialization, every array created directly in its shards;
- dispatches jitted train steps without waiting for them, and fetches their metrics every
  `LoopOptions.log_every` steps (and before every evaluation and checkpoint) to write
  TensorBoard scalars, update the progress bar and check that every quantity is finite;
- evaluates every `EvalOptions.every` steps: teacher-forced loss and token accuracy on each
  eval set, then each evaluator callable `evaluator(params, step) -> {name: value}`;
- saves a checkpoint every `CheckpointOptions.every` steps and at the end (keeping the last K and
  the best per tracked metric), says "checkpoint saved" only once Orbax has committed it, and
  redraws `loss_curve.png`;
- on SIGTERM (how a preempted Cloud TPU VM or a scheduler stops a job) or SIGINT (Ctrl-C) saves
  a checkpoint at the next step boundary, waits for it to commit and raises `Preempted` (the
  CLI exits with `PREEMPTED_EXIT_CODE`); a second SIGINT stops at once. In a multi-host run the
  hosts agree on the step at the next log boundary;
- stops at the first non-finite loss, gradient or parameter norm with `NonFiniteError`, after the
  pending checkpoint writes have finished; such parameters are never saved.

In a multi-host run every process runs the same loop (each feeding its shard of the batch) and
takes part in every checkpoint (Orbax writes each process's shards and data-iterator position,
then process 0 commits the step); only process 0 writes the run-level files (TensorBoard
events, the loss curve) and shows progress.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from t2t import files, hosts
from t2t import nn as t2t_nn
from t2t.checkpoints.manager import BestMetric, CheckpointManager
from t2t.finetuning import FineTuning
from t2t.partitioning import Partitioner
from t2t.trainer import init, monitors, reporting, steps
from t2t.trainer.options import CheckpointOptions, EvalOptions, LoopOptions

Evaluator = Callable[[nnx.State, int], Mapping[str, float]]
LOSS_CURVE_FILE = "loss_curve.png"
PREEMPTED_EXIT_CODE = 75  # sysexits' EX_TEMPFAIL: stopped cleanly, run the command again


class Preempted(Exception):
    """Training stopped on a signal after saving (and committing) a checkpoint of this step."""

    def __init__(self, step: int, signal_name: str, directory: str):
        self.step, self.signal_name = step, signal_name
        super().__init__(
            f"stopped by {signal_name} at step {step}; its checkpoint is saved in {directory}. "
            "Run the same command again to resume from it."
        )


class NonFiniteError(FloatingPointError):
    """A training step produced a NaN or infinite loss, gradient or parameter norm."""

    def __init__(self, step: int, problem: str, last_checkpoint: int | None):
        self.step = step
        self.problem = problem
        self.last_checkpoint = last_checkpoint
        if last_checkpoint is None:
            kept, then = "no checkpoint was saved", "start the run again"
        else:
            kept = (
                f"the last checkpoint (step {last_checkpoint}) holds the last saved good parameters"
            )
            then = "restart from that checkpoint"
        super().__init__(
            f"Training stopped at step {step}: {problem}. Nothing of this step was saved; "
            f"{kept}. Lower the learning rate, raise the z-loss, or check the data of this step, "
            f"then {then}."
        )


def open_checkpoints(
    model_dir: str, checkpoints: CheckpointOptions, evaluation: EvalOptions = EvalOptions()
) -> CheckpointManager:
    """The model directory's checkpoint manager: the recent checkpoints to keep, and the best
    one of each tracked metric (early stopping's metric among them)."""
    best = [BestMetric(k, v) for k, v in dict(checkpoints.best_metrics or {}).items()]
    stopping = evaluation.early_stopping
    if stopping is not None and stopping.metric not in {m.name for m in best}:
        best.append(BestMetric(stopping.metric, stopping.mode))
    return CheckpointManager(
        os.fspath(model_dir), keep=checkpoints.keep, best=best, async_save=checkpoints.async_save
    )


class Trainer:
    """Runs a training loop on a state it is handed, keeping checkpoints in the state's model
    directory.

    Example:
      trainer = Trainer.create(model, optim.adafactor(schedule), partitioner, "/runs/demo",
                               InputPipeline(config), learning_rate=schedule,
                               checkpoints=CheckpointOptions(every=100))
      trainer.train(1000)   # from /runs/demo's latest checkpoint, if it has one

    Args:
      model: a `t2t.models` wrapper (its `config`, `loss_fn`).
      tx: the optimizer as the run applies it (`init.optimizer_for`).
      partitioner: the mesh and logical-axis rules of the run.
      train_data: this host's numpy batches; with `save`/`restore` (an `InputPipeline`) its
        position is checkpointed.
      state: where training starts (`init.init_or_restore`); the trainer advances it.
      manager: the model directory's checkpoints (`open_checkpoints`).
      checkpoints: when checkpoints are saved (`CheckpointOptions`).
      evaluation: what is evaluated, how often, and the watchers of the results.
      loop: how the loop steps and reports (`LoopOptions`).
      eval_data: eval set name -> function returning an iterable of numpy batches
        (`batches.eval_batches`).
      metadata: saved with every checkpoint besides the trainer's own keys (vocabulary,
        mixture_or_task, task_feature_lengths).
      learning_rate: the schedule (or constant) `tx` uses, for logging only.
      seed: seeds dropout.
    """

    # What the latest call to `train` did so far (set as it goes).
    compile_seconds: float | None = None  # the train step's compile time
    _train_step: Callable | None = None  # compiled at the first batch (its shapes are needed)
    _evaluated_at: int | None = None  # the step of the latest evaluation
    _saved_step: int | None = None  # the step of the latest checkpoint this run saved
    _stop_signal: int | None = None  # SIGTERM or SIGINT received
    _in_save = False  # inside CheckpointManager.save (its synchronous part)
    _interrupt_after_save = False  # a second Ctrl-C came during a save

    def __init__(
        self,
        model: Any,
        tx: optax.GradientTransformation,
        partitioner: Partitioner,
        train_data: Iterator[Mapping[str, np.ndarray]],
        state: init.TrainState,
        manager: CheckpointManager,
        *,
        checkpoints: CheckpointOptions = CheckpointOptions(),
        evaluation: EvalOptions = EvalOptions(),
        loop: LoopOptions = LoopOptions(),
        eval_data: Mapping[str, Callable[[], Iterable[Mapping[str, np.ndarray]]]] | None = None,
        metadata: Mapping[str, Any] | None = None,
        learning_rate: optax.Schedule | float | None = None,
        seed: int = 0,
    ):
        self.model, self.tx, self.partitioner = model, tx, partitioner
        self.config: t2t_nn.TransformerConfig = model.config
        self.train_data, self.state, self.manager = train_data, state, manager
        self.model_dir, self.is_chief = manager.model_dir, jax.process_index() == 0
        self.checkpoints, self.evaluation, self.loop = checkpoints, evaluation, loop
        self.eval_data, self.metadata = dict(eval_data or {}), dict(metadata or {})
        self.evaluators = [f(model=model, partitioner=partitioner) for f in evaluation.evaluators]
        self.learning_rate = learning_rate
        self.rng = jax.random.PRNGKey(seed)
        self._eval_step = jax.jit(steps.make_eval_step(model))
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, train scalars) this run
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self._uncommitted: list[int] = []  # saved steps not yet reported as committed
        self._pending: list[tuple[int, dict[str, jax.Array]]] = []  # dispatched, not fetched
        self._window_start = time.perf_counter()
        self._writers = reporting.run_writers(self.model_dir, self.step + 1)  # train, eval
        self._curve_train, self._curve_eval = self._earlier_curves()

    @classmethod
    def create(
        cls,
        model: Any,
        tx: optax.GradientTransformation,
        partitioner: Partitioner,
        model_dir: str,
        train_data: Iterator[Mapping[str, np.ndarray]],
        *,
        checkpoints: CheckpointOptions = CheckpointOptions(),
        evaluation: EvalOptions = EvalOptions(),
        loop: LoopOptions = LoopOptions(),
        init_checkpoint: str | None = None,
        init_optimizer_state: bool = False,
        finetuning: FineTuning | None = None,
        eval_data: Mapping[str, Callable[[], Iterable[Mapping[str, np.ndarray]]]] | None = None,
        metadata: Mapping[str, Any] | None = None,
        learning_rate: optax.Schedule | float | None = None,
        seed: int = 0,
    ) -> Trainer:
        """A trainer on `model_dir`'s latest checkpoint, or on a first state: opens the
        checkpoints, wraps `tx` for the fine-tuning method and the watchers, and restores or
        initializes (`init.init_or_restore`). `init_checkpoint` and `finetuning` decide the
        first state (`init.init_or_restore`); the other arguments are `Trainer`'s."""
        finetuning = finetuning or FineTuning()
        tx = init.optimizer_for(tx, model.config, finetuning, evaluation.reduce_on_plateau)
        abstract_params = init.abstract_model(model.config, partitioner, seed)
        finetuning.check(abstract_params)
        metadata = {**(metadata or {}), "finetuning": finetuning.describe(abstract_params)}
        manager = open_checkpoints(model_dir, checkpoints, evaluation)
        state = init.init_or_restore(
            manager,
            model.config,
            tx,
            partitioner,
            train_data=train_data,
            init_checkpoint=init_checkpoint,
            init_optimizer_state=init_optimizer_state,
            finetuning=finetuning,
            seed=seed,
            start_over=checkpoints.start_over,
            abstract_params=abstract_params,
        )
        return cls(
            model,
            tx,
            partitioner,
            train_data,
            state,
            manager,
            checkpoints=checkpoints,
            evaluation=evaluation,
            loop=loop,
            eval_data=eval_data,
            metadata=metadata,
            learning_rate=learning_rate,
            seed=seed,
        )

    @property
    def step(self) -> int:
        return self.state.step

    @property
    def params(self) -> nnx.State:
        return self.state.params

    def _earlier_curves(self):
        """Loss-curve points an earlier (interrupted) run of this model directory logged."""
        if self.step == 0 or not self.is_chief:
            return [], {}
        train = reporting.read_scalars(files.join(self.model_dir, "train"), self.step)
        evals = reporting.read_scalars(files.join(self.model_dir, "eval"), self.step)
        suffix = reporting.CURVE_EVAL_SUFFIX
        return (
            list(train.get(reporting.CURVE_TRAIN_TAG, [])),
            {tag[: -len(suffix)]: list(v) for tag, v in evals.items() if tag.endswith(suffix)},
        )

    # -- the loop --------------------------------------------------------------------------------

    def train(self, num_steps: int) -> dict[str, Any]:
        """Trains until `num_steps` updates have been made (counting those restored).

        Returns:
          A summary: first and last step of this call, the first and last logged training
          loss, compile time, and the final eval results (if any).

        Raises:
          NonFiniteError: at the first step with a non-finite loss, gradient or parameters.
        """
        first_step = self.state.step
        if self.state.stopped_early is not None:
            num_steps = self.state.step  # an early-stopped run stays stopped
        progress = reporting.Progress(
            num_steps,
            self.state.step,  # no bar when nothing is left
            enabled=self.loop.progress and self.state.step < num_steps,
            silent=not self.is_chief,
        )
        self._window_start = time.perf_counter()
        eval_results: dict[str, float] = {}
        try:
            with self._signals():
                eval_results = self._loop(num_steps, progress)
        finally:
            progress.close()
            self._finish()
        return self._summary(first_step, eval_results)

    def _loop(self, num_steps: int, progress: reporting.Progress) -> dict[str, float]:
        first_step = self.state.step
        eval_results: dict[str, float] = {}
        while self.state.step < num_steps:
            try:
                local = next(self.train_data)
            except StopIteration:
                progress.note(f"The training data ran out at step {self.state.step}.")
                num_steps = self.state.step
                break
            except Exception as error:  # noqa: BLE001 (tf.data's InvalidArgumentError)
                if self.state.origin.get("kind") == "resume" and "Incompatible shapes" in str(
                    error
                ):
                    raise ValueError(
                        f"The input pipeline saved in {self.model_dir}'s checkpoint makes "
                        "batches of another shape than this run's (a different batch size or "
                        "feature lengths): resume with the settings that wrote it (its "
                        "config.gin), or give a new MODEL_DIR with INIT_CHECKPOINT set to this "
                        "one to start from its parameters."
                    ) from None
                raise
            self._dispatch(local)
            progress.advance()
            eval_results = self._boundary(num_steps, progress) or eval_results
            if self.state.stopped_early is not None:
                break
            if self._should_stop():
                self._preempt(progress)
        if self.state.step > first_step and self._saved_step != self.state.step:  # the data ran out
            self._flush(progress)
            self._save(eval_results if self._evaluated_at == self.state.step else None, progress)
        return eval_results

    # -- signals ---------------------------------------------------------------------------------

    @contextlib.contextmanager
    def _signals(self):
        """SIGTERM and SIGINT ask for a checkpoint and a stop at the next step boundary."""
        if threading.current_thread() is not threading.main_thread():
            yield  # signal handlers can only be set from the main thread
            return

        def handler(signum, frame):
            if self._stop_signal is not None and signum == signal.SIGINT:
                if self._in_save:  # the write under way is finished first, then we stop
                    self._interrupt_after_save = True
                    return
                raise KeyboardInterrupt  # a second Ctrl-C: stop at once
            self._stop_signal = signum
            if self.is_chief:
                print(
                    f"\n{signal.Signals(signum).name} received: saving a checkpoint after "
                    "this step, then stopping (Ctrl-C again stops at once, without saving).",
                    file=sys.stderr,
                    flush=True,
                )

        previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for number, old in previous.items():
                signal.signal(number, old)

    def _should_stop(self) -> bool:
        """Whether a signal asks this run to stop now (every host agreeing on the step)."""
        if jax.process_count() == 1:
            return self._stop_signal is not None
        if self.state.step % self.loop.log_every:
            return False  # hosts compare notes at log boundaries, keeping steps asynchronous
        received = hosts.agree(f"stop at step {self.state.step}", str(self._stop_signal or 0))
        if max(map(int, received)) and self._stop_signal is None:
            self._stop_signal = max(map(int, received))
        return self._stop_signal is not None

    def _preempt(self, progress: reporting.Progress) -> None:
        """Saves this step (unless just saved), waits for the commit, raises Preempted."""
        self._flush(progress)
        if self._saved_step != self.state.step:
            self._save(None, progress)
        self._report_commits(progress, wait=True)
        raise Preempted(
            self.state.step,
            signal.Signals(self._stop_signal).name,
            os.fspath(self.manager.directory),
        )

    def _dispatch(self, local: Mapping[str, np.ndarray]) -> None:
        """Runs one train step on a host batch without waiting for it."""
        batch = self.partitioner.make_global_batch(local)
        step = np.int32(self.state.step)
        with self.partitioner.context():
            if self._train_step is None:
                self._train_step = self._compile(batch, step)
            self.state.params, self.state.opt_state, metrics = self._train_step(
                self.state.params, self.state.opt_state, batch, self.rng, step
            )
        self.state.step += 1
        self._pending.append((self.state.step, metrics))

    def _compile(self, batch, step) -> Callable:
        start = time.perf_counter()
        abstract_params = init.abstract_of(self.state.params)
        jitted = steps.jit_train_step(
            steps.make_train_step(
                self.model,
                self.tx,
                num_microbatches=self.loop.num_microbatches,
                grad_shardings=steps.shardings_of(abstract_params),
            ),
            self.partitioner,
            abstract_params,
            init.abstract_of(self.state.opt_state),
            batch,
        )
        compiled = jitted.lower(
            self.state.params, self.state.opt_state, batch, self.rng, step
        ).compile()
        self.compile_seconds = time.perf_counter() - start
        logging.info("Compiled the train step in %.1f s.", self.compile_seconds)
        self._window_start = time.perf_counter()
        return compiled

    def _boundary(self, num_steps: int, progress: reporting.Progress) -> dict[str, float] | None:
        """Logging, evaluation and checkpointing due after the step just dispatched."""
        step, last = self.state.step, self.state.step == num_steps
        checkpoint_due = last or step % self.checkpoints.every == 0
        eval_due = self.evaluation.every is not None and (last or step % self.evaluation.every == 0)
        if last or checkpoint_due or eval_due or step % self.loop.log_every == 0:
            self._flush(progress)
        results = None
        if eval_due:
            results = self.evaluate(progress)
            if self._watch(results, progress):
                checkpoint_due = True  # keep the new best (or the last step before stopping)
        if checkpoint_due:
            self._save(results, progress)
        if eval_due or checkpoint_due:
            self._window_start = time.perf_counter()  # keep their time out of tokens/s
        return results

    # -- metrics ---------------------------------------------------------------------------------

    def _flush(self, progress: reporting.Progress) -> None:
        """Fetches pending step metrics, checks them, logs them."""
        if not self._pending:
            return
        fetched = jax.device_get([m for _, m in self._pending])
        elapsed = time.perf_counter() - self._window_start
        steps_done = [s for s, _ in self._pending]
        self._pending = []
        factor = self.model.loss_normalizing_factor
        writer = self._writers["train"]
        tokens = examples = 0
        for step, raw in zip(steps_done, fetched):
            problem = steps.first_non_finite(raw)
            if problem is not None:
                self._stop(step, problem)
            scalars = steps.train_scalars(raw, factor)
            tokens += int(scalars.pop("num_tokens"))
            examples += int(scalars.pop("num_examples"))
            self.history.append((step, scalars))
            self._curve_train.append((step, scalars[reporting.CURVE_TRAIN_TAG]))
            writer.write(step, scalars)
        self.state.tokens_seen += tokens
        self.state.examples_seen += examples
        window = {
            "tokens_per_second": tokens / max(elapsed, 1e-9),
            "examples_per_second": examples / max(elapsed, 1e-9),
            "step_time": elapsed / len(steps_done),
            "tokens_seen": self.state.tokens_seen,
        }
        if self.learning_rate is not None:
            rate = self.learning_rate
            window["learning_rate"] = float(rate(steps_done[-1] - 1) if callable(rate) else rate)
        if self.evaluation.reduce_on_plateau is not None:
            window["update_scale"] = monitors.plateau_scale(self.state.opt_state)
        writer.write(steps_done[-1], window)
        writer.flush()
        progress.show({**self.history[-1][1], **window})
        self._report_commits(progress)
        self._window_start = time.perf_counter()

    def _stop(self, step: int, problem: str) -> None:
        """Waits for pending checkpoint writes, then raises NonFiniteError."""
        self.manager.wait_until_finished()
        raise NonFiniteError(step, problem, self.manager.latest_step())

    # -- evaluation ------------------------------------------------------------------------------

    def evaluate(self, progress: reporting.Progress | None = None) -> dict[str, float]:
        """Teacher-forced loss and accuracy on every eval set, then every evaluator.

        Returns:
          `<eval set>/loss` (cross-entropy per real target token), `<eval set>/token_accuracy`,
          `<eval set>/z_loss`, `<eval set>/target_tokens`, and the evaluators' metrics.
        """
        results: dict[str, float] = {}
        for name, make_batches in self.eval_data.items():
            sums = []
            with self.partitioner.context():
                for local in make_batches():
                    sums.append(
                        self._eval_step(
                            self.state.params, self.partitioner.make_global_batch(local)
                        )
                    )
            if not sums:
                raise ValueError(f"The eval set {name!r} produced no batch.")
            totals = {k: sum(float(s[k]) for s in jax.device_get(sums)) for k in steps.EVAL_SUMS}
            for key, value in steps.eval_scalars(totals).items():
                results[f"{name}/{key}"] = value
            self._curve_eval.setdefault(name, []).append((self.state.step, results[f"{name}/loss"]))
        for evaluator in self.evaluators:
            results.update(
                {k: float(v) for k, v in evaluator(self.state.params, self.state.step).items()}
            )
        self._evaluated_at = self.state.step
        self.eval_history.append((self.state.step, results))
        self._writers["eval"].write(self.state.step, results)
        self._writers["eval"].flush()
        shown = ", ".join(
            f"{k} {v:.4g}"
            for k, v in results.items()
            if not k.endswith(("/target_tokens", "/z_loss"))
        )
        if not shown:  # no eval tasks and no evaluators: nothing to say
            pass
        elif progress is not None:
            progress.note(f"step {self.state.step} eval: {shown}")
        elif self.is_chief:
            print(f"step {self.state.step} eval: {shown}")
        return results

    def _watch(self, results: Mapping[str, float], progress: reporting.Progress) -> bool:
        """Hands an evaluation to the watchers and acts on their decisions; returns whether a
        checkpoint is due (a new best of the early-stopping metric, or the stop)."""
        stopping, plateau = self.evaluation.early_stopping, self.evaluation.reduce_on_plateau
        if plateau is not None:
            decision = plateau.decide(
                self.state.watches["reduce_on_plateau"],
                self.state.step,
                monitors.metric_value(results, plateau),
                monitors.plateau_scale(self.state.opt_state),
            )
            if decision.scale is not None:
                self.state.opt_state = monitors.with_plateau_scale(
                    self.state.opt_state, decision.scale
                )
                progress.note(f"step {self.state.step}: {decision.note}")
        if stopping is None:
            return False
        decision = stopping.decide(
            self.state.watches["early_stopping"],
            self.state.step,
            monitors.metric_value(results, stopping),
        )
        if decision.stop:
            self.state.stopped_early = self.state.step
            progress.note(f"step {self.state.step}: {decision.note}")
        return decision.best or decision.stop

    # -- checkpoints -----------------------------------------------------------------------------

    def _save(self, metrics: Mapping[str, float] | None, progress: reporting.Progress) -> None:
        savable = hasattr(self.train_data, "save") and hasattr(self.train_data, "restore")
        self._in_save = True  # a second Ctrl-C now waits for this save (see `_signals`)
        try:
            self.manager.save(
                self.state.step,
                params=self.state.params,
                opt_state=self.state.opt_state,
                data_iterator=self.train_data if savable else None,
                metadata=self.checkpoint_metadata(),
                metrics=metrics,
            )
        finally:
            self._in_save = False
        self._saved_step = self.state.step
        self._uncommitted.append(self.state.step)
        if self._interrupt_after_save:  # its commit is awaited on the way out (`_finish`)
            raise KeyboardInterrupt
        self.plot_loss_curve()

    def _report_commits(self, progress: reporting.Progress | None, wait: bool = False) -> None:
        """Says "checkpoint saved" for the saves Orbax has committed (all of them if `wait`)."""
        if not self._uncommitted:
            return
        if wait:
            self.manager.wait_until_finished()
        elif self.manager.is_saving_in_progress():
            return
        for step in self._uncommitted:
            line = f"step {step}: checkpoint saved to {self.manager.directory}"
            if progress is not None:
                progress.note(line)
            elif self.is_chief:
                print(line, flush=True)
        self._uncommitted = []

    def checkpoint_metadata(self) -> dict[str, Any]:
        """The metadata JSON of a checkpoint at the current step."""
        return {
            **self.metadata,
            "step": self.state.step,
            "config": self.config,
            "architecture": self.config.architecture,
            "tokens_seen": self.state.tokens_seen,
            "examples_seen": self.state.examples_seen,
            "initialized_from": self.state.origin,
            "watches": {k: dataclasses.asdict(v) for k, v in self.state.watches.items()},
            "stopped_early": self.state.stopped_early,
        }

    def plot_loss_curve(self) -> str:
        """Redraws `<model_dir>/loss_curve.png` (process 0 only); returns its path."""
        path = files.join(self.model_dir, LOSS_CURVE_FILE)
        if not self.is_chief:
            return path
        reporting.plot_loss_curve(
            path,
            self._curve_train,
            self._curve_eval,
            title=files.basename(self.model_dir),
        )
        return path

    def _finish(self) -> None:
        self._report_commits(None, wait=True)
        self.manager.wait_until_finished()
        for writer in self._writers.values():
            writer.flush()
        if self._curve_train:
            self.plot_loss_curve()

    def close(self) -> None:
        """Waits for checkpoint writes and closes files; the trainer is unusable after."""
        self.manager.wait_until_finished()
        self.manager.close()
        for writer in self._writers.values():
            writer.close()

    def _summary(self, first_step: int, eval_results: Mapping[str, float]) -> dict[str, Any]:
        losses = [scalars["loss"] for _, scalars in self.history]
        return {
            "first_step": first_step,
            "last_step": self.state.step,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "compile_seconds": self.compile_seconds,
            "tokens_seen": self.state.tokens_seen,
            "eval": dict(eval_results),
            "stopped_early": self.state.stopped_early,
            "best": {
                name: {"value": w.best, "step": w.best_step}
                for name, w in self.state.watches.items()
                if w.best is not None
            },
        }
