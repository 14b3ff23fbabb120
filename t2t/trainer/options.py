"""A training run's options in four typed groups: its data, its checkpoints, its evaluations,
and how its loop steps and reports.

Each group is a frozen dataclass whose fields are the options, each documented beside it, and
which refuses a bad value when it is built, before anything else is (a count that is not a
positive int, an unknown best-metric mode). gin binds them by field at the edge, where
`t2t.runs` registers them (`t2t.runs.CheckpointOptions.every = 500`); the library takes them
as values:

    data = DataOptions(mixture_or_task="builtin_span_corruption",
                       task_feature_lengths={"inputs": 128, "targets": 32}, batch_size=32)
    checkpoints = CheckpointOptions(every=100, keep=2)
    evaluation = EvalOptions(every=100, tasks=("builtin_order",))
    loop = LoopOptions(log_every=10, progress=False)

Each group flows whole to where its options are used (`t2t.runs.train` -> `Trainer`), so an
option is declared, defaulted and checked once: here.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from t2t.trainer import monitors


class Count(enum.Enum):
    """What a count option accepts (an int, never a bool)."""

    POSITIVE = "a positive int"
    POSITIVE_OR_NONE = "a positive int or None"
    NON_NEGATIVE = "a non-negative int"


def check_count(binding: str, value: Any, kind: Count, macro: str | None = None) -> None:
    """Refuses a count that is not an int of the kind asked (e.g. TRAIN_STEPS = 0, or a
    string), naming the gin binding and what to give."""
    if value is None and kind is Count.POSITIVE_OR_NONE:
        return
    if isinstance(value, int) and not isinstance(value, bool):
        if value > 0 or (value == 0 and kind is Count.NON_NEGATIVE):
            return
    named = binding + (f" (the gin macro {macro})" if macro else "")
    raise ValueError(
        f"{named} must be {kind.value}; got {value!r} ({type(value).__name__}). "
        f"Example: --gin.{macro or binding}=100"
    )


def _check_counts(options: Any, kinds: Mapping[str, Count], macros=None) -> None:
    group = type(options).__name__
    for name, kind in kinds.items():
        binding = f"t2t.runs.{group}.{name}"
        check_count(binding, getattr(options, name), kind, (macros or {}).get(name))


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataOptions:
    """The training data: which task, how long, how many rows per step."""

    mixture_or_task: str = ""
    """The registered seqio task or mixture to train on (the gin macro MIXTURE_OR_TASK;
    required)."""
    task_feature_lengths: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """E.g. {"inputs": 512, "targets": 114} (the gin macro TASK_FEATURE_LENGTHS; required)."""
    batch_size: int = 128
    """The global batch: rows per step over all hosts (BATCH_SIZE)."""
    pack: bool = True
    """Pack several examples into each row."""
    use_cached: bool = False
    """Read the tasks' seqio caches (`t2t cache`) instead of preprocessing on the fly."""
    max_examples: int | None = None
    """Train on a subset of this many examples, chosen by the run's seed (None: all); recorded
    in the checkpoints' metadata as `train_subset`."""

    def __post_init__(self):
        _check_counts(
            self,
            {"batch_size": Count.POSITIVE, "max_examples": Count.POSITIVE_OR_NONE},
            macros={"batch_size": "BATCH_SIZE"},
        )
        if not isinstance(self.mixture_or_task, str) or not self.mixture_or_task:
            raise ValueError(
                "t2t.runs.DataOptions.mixture_or_task (the gin macro MIXTURE_OR_TASK) must name "
                f"a registered task or mixture; got {self.mixture_or_task!r}. Example: "
                "--gin.MIXTURE_OR_TASK=\"'builtin_span_corruption'\""
            )
        lengths = self.task_feature_lengths
        if not isinstance(lengths, Mapping) or not lengths:
            raise ValueError(
                "t2t.runs.DataOptions.task_feature_lengths (the gin macro TASK_FEATURE_LENGTHS) "
                f"must map features to lengths; got {lengths!r}. Example: "
                "--gin.TASK_FEATURE_LENGTHS=\"{'inputs': 512, 'targets': 114}\""
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CheckpointOptions:
    """When checkpoints are written and which are kept."""

    every: int = 1000
    """Save every this many steps (and at the end, and on SIGTERM or Ctrl-C)."""
    keep: int | None = 3
    """How many recent checkpoints to keep (None: all)."""
    best_metrics: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """{metric: "max" | "min"} whose best checkpoint is kept besides the recent ones, e.g.
    {"builtin_package/token_accuracy": "max"}."""
    async_save: bool = True
    """Write checkpoints in the background while training goes on."""
    start_over: bool = False
    """Train from step 0 in a model directory whose checkpoints are all damaged (set aside in
    `damaged_checkpoints/`; `t2t train --start_over`); without it such a directory is refused,
    so a retry never starts over silently."""

    def __post_init__(self):
        _check_counts(self, {"every": Count.POSITIVE, "keep": Count.POSITIVE_OR_NONE})
        for metric, mode in dict(self.best_metrics or {}).items():
            if mode not in ("max", "min"):
                raise ValueError(
                    f"t2t.runs.CheckpointOptions.best_metrics: the mode of {metric!r} must be "
                    f"'max' or 'min'; got {mode!r}."
                )


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalOptions:
    """What is evaluated during training, how often, and what acts on the results."""

    every: int | None = None
    """Evaluate every this many steps and at the end (None: never)."""
    tasks: Sequence[str] = ()
    """Tasks whose teacher-forced loss and token accuracy are measured (EVAL_TASKS)."""
    split: str = "validation"
    """The split of `tasks` (and of the printed predictions)."""
    steps: int | None = 10
    """Batches per eval task (None: the whole split)."""
    evaluators: Sequence[Callable[..., Callable]] = ()
    """Factories `factory(model=..., partitioner=...)` returning `evaluator(params, step) ->
    {metric: value}` (decoding metrics: `@t2t.evaluation.task_evaluator`)."""
    early_stopping: monitors.EarlyStopping | None = None
    """`@t2t.trainer.EarlyStopping()`: stop after `patience` evaluations without improving its
    metric (its best checkpoint is kept)."""
    reduce_on_plateau: monitors.ReduceOnPlateau | None = None
    """`@t2t.trainer.ReduceOnPlateau()`: lower the update scale when its metric stops
    improving."""
    num_predictions: int = 0
    """Decode and print this many examples of the split at the end of the run."""

    def __post_init__(self):
        _check_counts(
            self,
            {
                "every": Count.POSITIVE_OR_NONE,
                "steps": Count.POSITIVE_OR_NONE,
                "num_predictions": Count.NON_NEGATIVE,
            },
        )
        for watcher in (self.early_stopping, self.reduce_on_plateau):
            if watcher is not None and self.every is None:
                raise ValueError(
                    f"{type(watcher).__name__} watches evaluations: set "
                    "t2t.runs.EvalOptions.every (how often to evaluate)."
                )


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoopOptions:
    """How the training loop steps and reports."""

    log_every: int = 100
    """Fetch, log and check (finite?) the training metrics every this many steps, and before
    every evaluation and checkpoint."""
    num_microbatches: int = 1
    """Split each step's batch into this many microbatches and accumulate their gradients
    (the same update with less activation memory)."""
    progress: bool = True
    """Show the console progress bar."""

    def __post_init__(self):
        _check_counts(self, {"log_every": Count.POSITIVE, "num_microbatches": Count.POSITIVE})
