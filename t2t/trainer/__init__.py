"""Training: the jitted train and eval steps, the loop around them, and what it reports.

- `steps`: the pure train step (microbatched gradients, optimizer update) and the teacher-forced
  eval step, jitted with explicit shardings; host-side metric derivation from summed values;
- `loop`: `Trainer`, which is handed a state and steps, logs, evaluates, checkpoints,
  and stops on non-finite values (`NonFiniteError`);
- `options`: a run's data, checkpoint and evaluation options (typed groups gin binds by field);
- `init`: the run's state, `TrainState`, restored or made (`init_or_restore`);
- `sources`: the first parameters of a run from a HF T5 directory or another run's checkpoint;
- `monitors`: early stopping and reduce-on-plateau on a validation metric;
- `reporting`: TensorBoard scalars, the console progress bar, the loss-curve PNG;
- `predictions`: a few decoded examples shown at the end of a run.
"""

from t2t.trainer.loop import LOSS_CURVE_FILE, NonFiniteError, Trainer
from t2t.trainer.monitors import EarlyStopping, ReduceOnPlateau

__all__ = ["LOSS_CURVE_FILE", "EarlyStopping", "NonFiniteError", "ReduceOnPlateau", "Trainer"]
