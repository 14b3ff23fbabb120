"""The training loop: restore or initialize, step, log, evaluate, checkpoint, stop safely.

`Trainer` owns one run's state (parameters, optimizer state, step, counters) and its model
directory. It

- restores the latest checkpoint of the model directory if there is one (parameters,
  optimizer state, input-pipeline position and counters, onto whatever mesh the run has), and
  otherwise starts from a HF T5 directory, another run's checkpoint (parameters only) or random
  initialization, every array created directly in its shards;
- dispatches jitted train steps without waiting for them, and fetches their metrics every
  `log_every` steps (and before every evaluation and checkpoint) to write TensorBoard scalars,
  update the progress bar and check that every quantity is finite;
- evaluates every `eval_every` steps: teacher-forced loss and token accuracy on each eval set,
  then each evaluator callable `evaluator(params, step) -> {name: value}`;
- saves a checkpoint every `checkpoint_every` steps and at the end (keeping the last K and the
  best per tracked metric), says "checkpoint saved" only once Orbax has committed it, and
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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax
from flax import nnx

from t2t import nn as t2t_nn
from t2t.checkpoints.manager import (
    DAMAGED_SUBDIR,
    BestMetric,
    CheckpointManager,
    CorruptCheckpointError,
)
from t2t.errors import UserError
from t2t.finetuning import FineTuning, depths_of_config
from t2t.partitioning import Partitioner
from t2t.trainer import init, monitors, reporting, steps

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


# How to train from step 0 on purpose in a directory whose checkpoints are all damaged.
_START_OVER_HINT = (
    "To train from step 0 on purpose, rerun with --start_over (t2t train) or bind "
    "t2t.runs.train.start_over = True; to keep {0} as it is, give MODEL_DIR a new directory."
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


class Trainer:
    """Trains `model` with `tx` on `partitioner`'s mesh, keeping its state in `model_dir`.

    Example:
      trainer = Trainer(model, optim.adafactor(schedule), partitioner, "/runs/demo",
                        InputPipeline(config), learning_rate=schedule, checkpoint_every=100)
      trainer.train(1000)   # restores /runs/demo's latest checkpoint first, if any
    """

    def __init__(
        self,
        model: Any,
        tx: optax.GradientTransformation,
        partitioner: Partitioner,
        model_dir: str,
        train_data: Iterator[Mapping[str, np.ndarray]],
        *,
        learning_rate: optax.Schedule | float | None = None,
        num_microbatches: int = 1,
        seed: int = 0,
        log_every: int = 100,
        checkpoint_every: int = 1000,
        keep_checkpoints: int | None = 3,
        best_metrics: Sequence[BestMetric] = (),
        eval_every: int | None = None,
        eval_data: Mapping[str, Callable[[], Iterable[Mapping[str, np.ndarray]]]] | None = None,
        evaluators: Sequence[Evaluator] = (),
        metadata: Mapping[str, Any] | None = None,
        init_checkpoint: str | None = None,
        finetuning: FineTuning | None = None,
        early_stopping: monitors.EarlyStopping | None = None,
        reduce_on_plateau: monitors.ReduceOnPlateau | None = None,
        async_checkpoints: bool = True,
        progress: bool = True,
        start_over: bool = False,
    ):
        """
        Args:
          model: a `t2t.models` wrapper (its `config`, `loss_fn`).
          tx: the optimizer.
          partitioner: the mesh and logical-axis rules of the run.
          model_dir: where checkpoints, TensorBoard events and the loss curve go.
          train_data: this host's numpy batches; with `save`/`restore` (an
            `InputPipeline`) its position is checkpointed.
          learning_rate: the schedule (or constant) `tx` uses, for logging only.
          num_microbatches: microbatches per step (gradient accumulation).
          seed: seeds random initialization and dropout.
          log_every: fetch metrics, log them and check them every this many steps.
          checkpoint_every: save every this many steps (and at the end).
          keep_checkpoints: how many recent checkpoints to keep (None: all).
          best_metrics: metrics (keys of the eval results) whose best checkpoint is kept.
          eval_every: evaluate every this many steps (and at the end); None: never.
          eval_data: eval set name -> function returning an iterable of numpy batches
            (`batches.eval_batches`).
          evaluators: callables `evaluator(params, step) -> {metric: value}` run at each
            evaluation (decoding metrics); they must not keep `params`.
          metadata: saved with every checkpoint besides the trainer's own keys (vocabulary,
            mixture_or_task, task_feature_lengths).
          init_checkpoint: start from this HF directory or t2t model directory when `model_dir`
            has no checkpoint.
          finetuning: what trains and how (`t2t.finetuning.FineTuning`: parameter subsets,
            re-initialized groups, gradual unfreezing, layer-wise rates); it wraps `tx`.
          early_stopping: stop after this many evaluations without improving a metric
            (`monitors.EarlyStopping`); its best checkpoint is kept.
          reduce_on_plateau: lower the updates' scale when a metric stops improving
            (`monitors.ReduceOnPlateau`).
          async_checkpoints: write checkpoints in the background.
          progress: show the console progress bar.
          start_over: train from step 0 although `model_dir` once held checkpoints that are
            all damaged (set aside in `damaged_checkpoints/`); without it such a directory is
            refused, so a retry never starts over silently.
        """
        for name, value in (("log_every", log_every), ("checkpoint_every", checkpoint_every)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}.")
        if eval_every is not None and (not isinstance(eval_every, int) or eval_every < 1):
            raise ValueError(f"eval_every must be a positive int or None, got {eval_every!r}.")
        self.model, self.partitioner = model, partitioner
        self.config: t2t_nn.TransformerConfig = model.config
        self.finetuning = finetuning or FineTuning()
        self.tx = self.finetuning.wrap(tx, depths_of_config(self.config))
        self.early_stopping, self.reduce_on_plateau = early_stopping, reduce_on_plateau
        for watcher in (early_stopping, reduce_on_plateau):
            if watcher is not None and eval_every is None:
                raise ValueError(f"{type(watcher).__name__} watches evaluations; set eval_every.")
        if reduce_on_plateau is not None:
            self.tx = optax.chain(self.tx, monitors.scale_by_plateau())
        if early_stopping is not None and early_stopping.metric not in {
            m.name for m in best_metrics
        }:
            best_metrics = [*best_metrics, BestMetric(early_stopping.metric, early_stopping.mode)]
        self.watches = {"early_stopping": monitors.Watch(), "reduce_on_plateau": monitors.Watch()}
        self.stopped_early: int | None = None  # the step training stopped early at
        self.model_dir = os.fspath(model_dir)
        self.train_data = train_data
        self.learning_rate = learning_rate
        self.num_microbatches = num_microbatches
        self.log_every, self.checkpoint_every, self.eval_every = (
            log_every,
            checkpoint_every,
            eval_every,
        )
        self.eval_data = dict(eval_data or {})
        self.evaluators = list(evaluators)
        self.metadata = dict(metadata or {})
        self.progress_enabled = progress
        self.is_chief = jax.process_index() == 0  # writes the run-level files
        self.rng = jax.random.PRNGKey(seed)
        self.manager = CheckpointManager(
            self.model_dir, keep=keep_checkpoints, best=best_metrics, async_save=async_checkpoints
        )
        config = self.config
        self.graphdef, self.abstract_params = partitioner.abstract_model(
            lambda: t2t_nn.build(config, nnx.Rngs(params=seed))
        )
        self.abstract_opt_state = partitioner.abstract_optimizer(self.tx, self.abstract_params)
        self.finetuning.check(self.abstract_params)
        self.metadata["finetuning"] = self.finetuning.describe(self.abstract_params)
        self._seed = seed
        self._train_step = None  # compiled at the first batch (its shapes are needed)
        self._eval_step = jax.jit(steps.make_eval_step(model))
        self.history: list[tuple[int, dict[str, float]]] = []  # (step, train scalars) this run
        self.eval_history: list[tuple[int, dict[str, float]]] = []
        self.compile_seconds: float | None = None
        self._evaluated_at: int | None = None  # the step of the latest evaluation
        self._saved_step: int | None = None  # the step of the latest checkpoint this run saved
        self._uncommitted: list[int] = []  # saved steps not yet reported as committed
        self._stop_signal: int | None = None  # SIGTERM or SIGINT received
        self._pending: list[tuple[int, dict[str, jax.Array]]] = []  # dispatched, not fetched
        self._window_start = time.perf_counter()
        self.init_description = self._initialize(init_checkpoint, start_over)
        self._writers = {
            name: (
                reporting.ScalarWriter(os.path.join(self.model_dir, name))
                if self.is_chief
                else reporting.NoWriter()
            )
            for name in ("train", "eval")
        }
        for writer in self._writers.values():
            writer.restart(self.step + 1)
        self._curve_train, self._curve_eval = self._earlier_curves()

    # -- state -----------------------------------------------------------------------------------

    def _initialize(self, init_checkpoint: str | None, start_over: bool) -> dict[str, Any]:
        """Restores the latest checkpoint of the model directory, or makes the first state.

        Raises:
          UserError: every checkpoint the directory holds, or held, is damaged (and
            `start_over` does not ask to train from step 0 regardless).
        """
        self.tokens_seen = self.examples_seen = 0
        latest = self.manager.latest_step()
        if latest is None and not start_over:
            self._refuse_silent_restart()
        if latest is not None:
            savable = hasattr(self.train_data, "save") and hasattr(self.train_data, "restore")
            try:
                restored = self.manager.restore(
                    abstract_params=self.abstract_params,
                    abstract_opt_state=self.abstract_opt_state,
                    data_iterator=self.train_data if savable else None,
                    on_damaged=self._set_aside,
                )
            except CorruptCheckpointError as error:
                if error.item != "every checkpoint":
                    raise
                raise UserError(f"{error} {_START_OVER_HINT.format(self.model_dir)}") from None
            self.params, self.opt_state, self.step = (
                restored.params,
                restored.opt_state,
                restored.step,
            )
            if restored.skipped and self.is_chief:
                print(
                    f"Resuming from step {restored.step}, the newest intact checkpoint.",
                    file=sys.stderr,
                    flush=True,
                )
            self.tokens_seen = int(restored.metadata.get("tokens_seen", 0))
            self.examples_seen = int(restored.metadata.get("examples_seen", 0))
            for name, seen in restored.metadata.get("watches", {}).items():
                self.watches[name] = monitors.Watch(**seen)
            self.stopped_early = restored.metadata.get("stopped_early")
            logging.info("Restored step %d from %s.", restored.step, self.model_dir)
            return {"kind": "resume", "step": restored.step}
        self.step = 0
        if init_checkpoint:
            self.params, description = init.load_params(
                init_checkpoint,
                self.config,
                self.abstract_params,
                partitioner=self.partitioner,
                reinit=self.finetuning.reinit,
                seed=self._seed,
                prompt_init=self.finetuning.prompt_init,
            )
        else:
            config, seed = self.config, self._seed
            module = self.partitioner.init_model(
                lambda: t2t_nn.build(config, nnx.Rngs(params=seed))
            )
            self.params = nnx.split(module)[1]
            description = {"kind": "random", "seed": seed}
        self.opt_state = self.partitioner.init_optimizer(self.tx, self.params)
        return description

    def _refuse_silent_restart(self) -> None:
        """Raises UserError when the directory once held checkpoints and none is intact now."""
        damaged = os.path.join(self.model_dir, DAMAGED_SUBDIR)
        held = sorted(os.listdir(damaged)) if os.path.isdir(damaged) else []
        if held:
            raise UserError(
                f"{self.model_dir} has no intact checkpoint: the ones it held are damaged and "
                f"were set aside in {damaged} ({', '.join(held)}). Training now would start over "
                f"from step 0. {_START_OVER_HINT.format(self.model_dir)}"
            )

    def _set_aside(self, error: CorruptCheckpointError) -> None:
        """Moves a damaged checkpoint out of the way of this run's saves (kept, not deleted)."""
        if self.is_chief:
            path = self.manager.set_aside(error.step)
            print(f"{error}\nMoved it to {path}.", file=sys.stderr, flush=True)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            multihost_utils.sync_global_devices(f"t2t set aside {error.step}")
            self.manager.reload()

    def _earlier_curves(self):
        """Loss-curve points an earlier (interrupted) run of this model directory logged."""
        if self.step == 0 or not self.is_chief:
            return [], {}
        train = reporting.read_scalars(os.path.join(self.model_dir, "train"), self.step)
        evals = reporting.read_scalars(os.path.join(self.model_dir, "eval"), self.step)
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
        first_step = self.step
        if self.stopped_early is not None:
            num_steps = self.step  # an early-stopped run stays stopped
        progress = reporting.Progress(
            num_steps,
            self.step,  # no bar when nothing is left
            enabled=self.progress_enabled and self.step < num_steps,
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
        first_step = self.step
        eval_results: dict[str, float] = {}
        while self.step < num_steps:
            try:
                local = next(self.train_data)
            except StopIteration:
                progress.note(f"The training data ran out at step {self.step}.")
                num_steps = self.step
                break
            except Exception as error:  # noqa: BLE001 (tf.data's InvalidArgumentError)
                if self.init_description.get("kind") == "resume" and "Incompatible shapes" in str(
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
            if self.stopped_early is not None:
                break
            if self._should_stop():
                self._preempt(progress)
        if self.step > first_step and self._saved_step != self.step:  # the data ran out
            self._flush(progress)
            self._save(eval_results if self._evaluated_at == self.step else None, progress)
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
        if self.step % self.log_every:
            return False  # hosts compare notes at log boundaries, keeping steps asynchronous
        from jax.experimental import multihost_utils

        received = multihost_utils.process_allgather(np.int32(self._stop_signal or 0))
        if int(np.max(received)) and self._stop_signal is None:
            self._stop_signal = int(np.max(received))
        return self._stop_signal is not None

    def _preempt(self, progress: reporting.Progress) -> None:
        """Saves this step (unless just saved), waits for the commit, raises Preempted."""
        self._flush(progress)
        if self._saved_step != self.step:
            self._save(None, progress)
        self._report_commits(progress, wait=True)
        raise Preempted(
            self.step, signal.Signals(self._stop_signal).name, os.fspath(self.manager.directory)
        )

    def _dispatch(self, local: Mapping[str, np.ndarray]) -> None:
        """Runs one train step on a host batch without waiting for it."""
        batch = self.partitioner.make_global_batch(local)
        step = np.int32(self.step)
        with self.partitioner.context():
            if self._train_step is None:
                self._train_step = self._compile(batch, step)
            self.params, self.opt_state, metrics = self._train_step(
                self.params, self.opt_state, batch, self.rng, step
            )
        self.step += 1
        self._pending.append((self.step, metrics))

    def _compile(self, batch, step) -> Callable:
        start = time.perf_counter()
        jitted = steps.jit_train_step(
            steps.make_train_step(
                self.model,
                self.tx,
                num_microbatches=self.num_microbatches,
                grad_shardings=steps.shardings_of(self.abstract_params),
            ),
            self.partitioner,
            self.abstract_params,
            self.abstract_opt_state,
            batch,
        )
        compiled = jitted.lower(self.params, self.opt_state, batch, self.rng, step).compile()
        self.compile_seconds = time.perf_counter() - start
        logging.info("Compiled the train step in %.1f s.", self.compile_seconds)
        self._window_start = time.perf_counter()
        return compiled

    def _boundary(self, num_steps: int, progress: reporting.Progress) -> dict[str, float] | None:
        """Logging, evaluation and checkpointing due after the step just dispatched."""
        step, last = self.step, self.step == num_steps
        checkpoint_due = last or step % self.checkpoint_every == 0
        eval_due = self.eval_every is not None and (last or step % self.eval_every == 0)
        if last or checkpoint_due or eval_due or step % self.log_every == 0:
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
        self.tokens_seen += tokens
        self.examples_seen += examples
        window = {
            "tokens_per_second": tokens / max(elapsed, 1e-9),
            "examples_per_second": examples / max(elapsed, 1e-9),
            "step_time": elapsed / len(steps_done),
            "tokens_seen": self.tokens_seen,
        }
        if self.learning_rate is not None:
            rate = self.learning_rate
            window["learning_rate"] = float(rate(steps_done[-1] - 1) if callable(rate) else rate)
        if self.reduce_on_plateau is not None:
            window["update_scale"] = monitors.plateau_scale(self.opt_state)
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
                        self._eval_step(self.params, self.partitioner.make_global_batch(local))
                    )
            if not sums:
                raise ValueError(f"The eval set {name!r} produced no batch.")
            totals = {k: sum(float(s[k]) for s in jax.device_get(sums)) for k in steps.EVAL_SUMS}
            for key, value in steps.eval_scalars(totals).items():
                results[f"{name}/{key}"] = value
            self._curve_eval.setdefault(name, []).append((self.step, results[f"{name}/loss"]))
        for evaluator in self.evaluators:
            results.update({k: float(v) for k, v in evaluator(self.params, self.step).items()})
        self._evaluated_at = self.step
        self.eval_history.append((self.step, results))
        self._writers["eval"].write(self.step, results)
        self._writers["eval"].flush()
        shown = ", ".join(
            f"{k} {v:.4g}"
            for k, v in results.items()
            if not k.endswith(("/target_tokens", "/z_loss"))
        )
        if not shown:  # no eval tasks and no evaluators: nothing to say
            pass
        elif progress is not None:
            progress.note(f"step {self.step} eval: {shown}")
        elif self.is_chief:
            print(f"step {self.step} eval: {shown}")
        return results

    def _watch(self, results: Mapping[str, float], progress: reporting.Progress) -> bool:
        """Hands an evaluation to the watchers and acts on their decisions; returns whether a
        checkpoint is due (a new best of the early-stopping metric, or the stop)."""
        stopping, plateau = self.early_stopping, self.reduce_on_plateau
        if plateau is not None:
            decision = plateau.decide(
                self.watches["reduce_on_plateau"],
                self.step,
                monitors.metric_value(results, plateau),
                monitors.plateau_scale(self.opt_state),
            )
            if decision.scale is not None:
                self.opt_state = monitors.with_plateau_scale(self.opt_state, decision.scale)
                progress.note(f"step {self.step}: {decision.note}")
        if stopping is None:
            return False
        decision = stopping.decide(
            self.watches["early_stopping"], self.step, monitors.metric_value(results, stopping)
        )
        if decision.stop:
            self.stopped_early = self.step
            progress.note(f"step {self.step}: {decision.note}")
        return decision.best or decision.stop

    # -- checkpoints -----------------------------------------------------------------------------

    def _save(self, metrics: Mapping[str, float] | None, progress: reporting.Progress) -> None:
        savable = hasattr(self.train_data, "save") and hasattr(self.train_data, "restore")
        self.manager.save(
            self.step,
            params=self.params,
            opt_state=self.opt_state,
            data_iterator=self.train_data if savable else None,
            metadata=self.checkpoint_metadata(),
            metrics=metrics,
        )
        self._saved_step = self.step
        self._uncommitted.append(self.step)
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
            "step": self.step,
            "config": self.config,
            "architecture": self.config.architecture,
            "tokens_seen": self.tokens_seen,
            "examples_seen": self.examples_seen,
            "initialized_from": self.init_description,
            "watches": {k: dataclasses.asdict(v) for k, v in self.watches.items()},
            "stopped_early": self.stopped_early,
        }

    def plot_loss_curve(self) -> str:
        """Redraws `<model_dir>/loss_curve.png` (process 0 only); returns its path."""
        path = os.path.join(self.model_dir, LOSS_CURVE_FILE)
        if not self.is_chief:
            return path
        reporting.plot_loss_curve(
            path,
            self._curve_train,
            self._curve_eval,
            title=os.path.basename(os.path.normpath(self.model_dir)),
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
            "last_step": self.step,
            "first_loss": losses[0] if losses else None,
            "last_loss": losses[-1] if losses else None,
            "compile_seconds": self.compile_seconds,
            "tokens_seen": self.tokens_seen,
            "eval": dict(eval_results),
            "stopped_early": self.stopped_early,
            "best": {
                name: {"value": w.best, "step": w.best_step}
                for name, w in self.watches.items()
                if w.best is not None
            },
        }
