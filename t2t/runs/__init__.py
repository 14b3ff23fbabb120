"""The gin edge: run functions configured from `gin/` files, and the library callables gin names.

Library modules carry no gin; everything gin binds is registered here. Run functions, each thin,
calling library code:

- `train` (`t2t train`): pretraining or fine-tuning (`t2t.trainer`);
- `evaluate` (`t2t eval`): seqio evaluation of one, some or all checkpoints of a model
  directory, and the best checkpoint per task (`t2t.evaluation`);
- `seqio_evaluator`: the same evaluation as a factory `factory(model=..., partitioner=...)` the
  trainer calls every `EvalOptions.every` steps (`t2t.runs.EvalOptions.evaluators =
  [@t2t.runs.seqio_evaluator]`);
- `infer` (`t2t infer`): predict or score a file or task, single model or ensemble
  (`t2t.inference`);
- `export` (`t2t export`): a HF-format release directory (`t2t.release`);
- `average` (`t2t average`): the mean of checkpoints (`t2t.checkpoints.averaging`);
- `compile_train` (`t2t compile`): the training run's programs compiled ahead of time for a TPU
  slice or CPU devices, with their memory, FLOPs and collectives (`t2t.aot`).

External configurables for what gin files reference: `t2t.nn.get_preset`, the `t2t.optim`
optimizer and schedules, the `t2t.models` wrappers, and `checkpoint_model_config` (the network
of a HF or t2t checkpoint to fine-tune).

Gin names are module-qualified as in Python (`@t2t.optim.inverse_sqrt()`,
`t2t.runs.DataOptions.batch_size = 128`); the short names (`DataOptions.batch_size`) work too
when unique. A training run's options are `train`'s arguments and four groups bound by field,
`DataOptions`, `CheckpointOptions`, `EvalOptions` and `LoopOptions` (`t2t.trainer.options`).
Every argument of evaluate/infer/export/average can also come from the CLI's flags. A training
run writes its operative gin config to `<model_dir>/config.gin` and the network's configuration
to `<model_dir>/model_config.json`.

The package's modules: `externals` (what gin files name), `gin_files` (parsing), `helpers`,
and one module per group of run functions (`train_run`, `decode_runs`, `checkpoint_runs`,
`compile_run`). Importing the package registers everything with gin.
"""

from t2t.runs.checkpoint_runs import average, convert, export
from t2t.runs.compile_run import compile_train
from t2t.runs.decode_runs import evaluate, infer, seqio_evaluator
from t2t.runs.externals import EXTERNALS, checkpoint_model_config
from t2t.runs.gin_files import configure, default_search_paths
from t2t.runs.helpers import import_task_modules, use_carried_vocabulary
from t2t.runs.train_run import train, write_run_files

__all__ = [
    "EXTERNALS",
    "average",
    "checkpoint_model_config",
    "compile_train",
    "convert",
    "configure",
    "default_search_paths",
    "evaluate",
    "export",
    "import_task_modules",
    "infer",
    "seqio_evaluator",
    "train",
    "use_carried_vocabulary",
    "write_run_files",
]
