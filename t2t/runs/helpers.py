"""What several run functions share: task names and their registration modules, the tokenizer a
checkpoint carries, the network to build, the mesh, the messages for missing arguments, and the
rule that no command writes over one of its own inputs."""

from __future__ import annotations

import importlib
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from t2t import files
from t2t.errors import UserError
from t2t.nn.config import TransformerConfig
from t2t.runs.externals import checkpoint_model_config


def partitioner_for(mesh_shape: Sequence[int] | None, sharding_mode: str):
    """None (one device) without a mesh shape, else a Partitioner over (data, model)."""
    if mesh_shape is None:
        return None
    from t2t import partitioning

    partitioning.initialize_distributed()
    return partitioning.make_partitioner(*mesh_shape, mode=sharding_mode)


def task_names(tasks: str | Sequence[str] | None, what: str) -> list[str]:
    if tasks is None:
        raise ValueError(f"{what} needs tasks: --tasks=NAME[,NAME] or {what}.tasks = [...] in gin.")
    names = [t.strip() for t in tasks.split(",")] if isinstance(tasks, str) else list(tasks)
    names = [n for n in names if n]
    if not names:
        raise ValueError(f"{what}: the task list {tasks!r} names no task.")
    return names


def import_task_modules(modules: Sequence[str] = (), names: Sequence[str] = ()) -> None:
    """Imports registration modules, then, for a name still missing, the one module of
    `t2t.data.tasks` that owns it (`t2t.data.tasks.import_for`; nothing else is imported).

    Args:
      modules: modules to import first, e.g. ["t2t.data.tasks.glue"].
      names: the task or mixture names the run needs.
    """
    import seqio

    for module in modules:
        importlib.import_module(module)
    registered = set(seqio.TaskRegistry.names()) | set(seqio.MixtureRegistry.names())
    missing = [name for name in names if name not in registered]
    if missing:
        from t2t.data import tasks

        imported = tasks.import_for(missing)
        logging.info("Imported %s to find %s.", imported, missing)


def require(value: Any, flag: str, binding: str) -> Any:
    if value is None:
        raise ValueError(
            f"Missing {flag}: pass the flag, or bind {binding} in gin (the files "
            "in gin/runs/ take it from a macro, e.g. --gin.MODEL_DIR=\"'/path'\")."
        )
    return value


def resolve_model_config(
    model_config: TransformerConfig | None, init_checkpoint: str | None
) -> TransformerConfig:
    if model_config is not None:
        if not isinstance(model_config, TransformerConfig):
            raise TypeError(
                "train.model_config must be a TransformerConfig (e.g. @t2t.nn.get_preset()), got "
                f"{type(model_config).__name__}."
            )
        return model_config
    if init_checkpoint is None:
        raise ValueError(
            "No model: bind train.model_config (include a gin/models/ file) or set "
            "train.init_checkpoint to take the network of a checkpoint."
        )
    return checkpoint_model_config(init_checkpoint)


def use_carried_vocabulary(*directories: str | None) -> str | None:
    """Makes the tasks registered with the default vocabulary (`t2t.data.vocab`) tokenize with
    the SentencePiece model the first of `directories` carries (`spiece.model`: a t2t model
    directory's copy, a HF directory's tokenizer), so a checkpoint is read with its own
    tokenizer wherever it was moved. Returns the file used, or None when none carries one."""

    from t2t.checkpoints import model_dir as model_dir_lib
    from t2t.data import vocab

    for directory in directories:
        if not directory or not isinstance(directory, str):
            continue
        path = files.join(directory.split("@")[0], model_dir_lib.VOCABULARY_FILE)
        if files.exists(path):
            if vocab.default_vocabulary_path() != path:
                logging.info("Tasks with the default vocabulary use %s.", path)
            vocab.set_default_vocabulary(path)
            return path
    return None


# What a model directory holds that a command reads: a command's output may go beside them
# (`eval/results.json`), never over them.
_MODEL_DIR_INPUTS = ("checkpoints", "config.gin", "model_config.json", "spiece.model")


def refuse_overwriting_inputs(
    outputs: Mapping[str, str | None],
    inputs: Mapping[str, str | None] | None = None,
    model_dirs: Mapping[str, str | None] | None = None,
) -> None:
    """Raises UserError when an output path is one of the command's inputs, contains one, or
    lies inside a model directory's checkpoints.

    Args:
      outputs: flag -> the path the command writes (a file or a directory).
      inputs: flag -> a file or directory the command reads.
      model_dirs: flag -> a model directory the command reads (an ensemble member may carry
        "@STEP"); its checkpoints and run files count as inputs.

    Raises:
      UserError: naming both flags, and asking for a path outside the inputs.
    """
    read = {flag: _real(path) for flag, path in (inputs or {}).items() if path}
    for flag, path in (model_dirs or {}).items():
        if path:
            root = _real(str(path).split("@")[0])
            read[flag] = root
            read.update({f"{flag} ({name})": files.join(root, name) for name in _MODEL_DIR_INPUTS})
    for out_flag, out_path in outputs.items():
        target = _real(out_path) if out_path else None
        for in_flag, source in read.items() if target else ():
            if target == source:
                problem = "is"
            elif source.startswith(target.rstrip("/") + "/"):
                problem = "contains"
            elif in_flag.endswith("(checkpoints)") and target.startswith(source.rstrip("/") + "/"):
                problem = "is inside"
            else:
                continue
            raise UserError(
                f"{out_flag} {out_path} {problem} the input {in_flag} {source}: writing it would "
                f"destroy what the command reads. Give {out_flag} a path outside the inputs."
            )


def _real(path: str) -> str:
    return files.real(str(path))
