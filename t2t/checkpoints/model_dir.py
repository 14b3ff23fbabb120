"""Reading a model directory: which checkpoints it holds, their network, vocabulary and weights.

`t2t train` writes a model directory (`checkpoints/<step>/` through `CheckpointManager`,
`config.gin`, `model_config.json`, TensorBoard logs). Evaluation, inference, averaging and
release all start from one: they rebuild the network from the checkpoint's `config` metadata,
the vocabulary from its `vocabulary` metadata, and restore the parameters, optionally straight
into the shards of a `t2t.partitioning.Partitioner`. This module is that one shared reader.

    model_dir = ModelDir("/runs/t5_small")
    loaded = model_dir.load()                      # the newest intact step
    model = t2t.models.model_for(loaded.config)    # the caller builds the model wrapper
    tokens = model.predict_batch(loaded.params, batch)

The storage layer knows networks (their configs and parameter trees), not model wrappers.

`load_members` loads several checkpoints (steps of one run, or other runs) as an ensemble.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import jax
import seqio
from flax import nnx

from t2t import files
from t2t import nn as t2t_nn
from t2t.checkpoints import manager as manager_lib

CONFIG_GIN = "config.gin"
MODEL_CONFIG_JSON = "model_config.json"
# The run's SentencePiece model, copied in so the directory is self-contained (moved, copied to
# another machine, it still evaluates and infers with no flags).
VOCABULARY_FILE = "spiece.model"


@dataclasses.dataclass
class Loaded:
    """One restored checkpoint: its step, its network's config, the parameters and the
    metadata. `t2t.models.model_for(loaded.config)` is its model wrapper."""

    step: int
    config: t2t_nn.TransformerConfig
    params: nnx.State
    metadata: dict[str, Any]


class ModelDir:
    """A model directory, opened read-only.

    Attributes:
      path: the directory.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)
        checkpoints = files.join(self.path, manager_lib.CHECKPOINTS_SUBDIR)
        if not files.isdir(checkpoints):
            found = files.listdir(self.path) if files.isdir(self.path) else None
            raise FileNotFoundError(
                f"{self.path} is not a t2t model directory: expected {checkpoints}/ with Orbax "
                f"checkpoints (written by `t2t train`); "
                + (f"the directory holds {found}." if found is not None else "it does not exist.")
            )
        self._manager = manager_lib.CheckpointManager(self.path, read_only=True, async_save=False)

    # -- what is there -------------------------------------------------------------------------

    def steps(self) -> list[int]:
        """The saved steps, ascending."""
        return self._manager.all_steps()

    def resolve_step(self, step: int | None) -> int:
        """`step` itself when saved, the latest step for None; a clear error otherwise."""
        steps = self.steps()
        if not steps:
            raise FileNotFoundError(f"{self.path} holds no checkpoint yet.")
        if step is None:
            return steps[-1]
        if step not in steps:
            raise ValueError(f"{self.path} has no checkpoint of step {step}; saved steps: {steps}.")
        return step

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        """The metadata JSON of `step` (default: the latest), without reading arrays."""
        return self._manager.read_metadata(self.resolve_step(step))

    def config(self, step: int | None = None) -> t2t_nn.TransformerConfig:
        """The network config of `step`: its metadata, else `model_config.json`."""
        metadata = self.metadata(step)
        if "config" in metadata:
            return manager_lib.config_from_metadata(metadata)
        path = files.join(self.path, MODEL_CONFIG_JSON)
        if files.exists(path):
            return t2t_nn.TransformerConfig(**json.loads(files.read_text(path)))
        return manager_lib.config_from_metadata(metadata)  # raises, explaining what is missing

    def vocabulary_file(self, step: int | None = None) -> tuple[str, int]:
        """The SentencePiece model file and number of extra ids the checkpoint was trained with:
        the directory's own copy (`spiece.model`) when it has one, else the recorded path."""
        entry = self.metadata(step).get("vocabulary")
        own = files.join(self.path, VOCABULARY_FILE)
        if not isinstance(entry, dict) or "sentencepiece_model_file" not in entry:
            if files.exists(own):
                return own, 100
            raise ValueError(
                f"The checkpoint metadata in {self.path} names no vocabulary (expected "
                "'vocabulary': {'sentencepiece_model_file': PATH, 'extra_ids': 100}) and the "
                f"directory has no {VOCABULARY_FILE}; pass the vocabulary explicitly (e.g. "
                "--vocabulary_file=PATH)."
            )
        extra_ids = int(entry.get("extra_ids", 100))
        if files.exists(own):
            return own, extra_ids
        path = entry["sentencepiece_model_file"]
        if not files.is_remote(path) and not files.exists(path):
            raise FileNotFoundError(
                f"The vocabulary {path} recorded in {self.path}'s checkpoint metadata does not "
                f"exist on this machine, and the directory has no copy ({VOCABULARY_FILE}, "
                "written by runs since the copy was added); pass one explicitly (e.g. "
                f"--vocabulary_file=PATH) or copy it to {own}."
            )
        return path, extra_ids

    def vocabulary(self, step: int | None = None) -> seqio.SentencePieceVocabulary:
        """The checkpoint's seqio vocabulary."""
        path, extra_ids = self.vocabulary_file(step)
        return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)

    def gin_config_path(self) -> str | None:
        """`<model_dir>/config.gin` when the run wrote one."""
        path = files.join(self.path, CONFIG_GIN)
        return path if files.exists(path) else None

    # -- weights -------------------------------------------------------------------------------

    def restore_params(
        self,
        step: int | None = None,
        *,
        config: t2t_nn.TransformerConfig | None = None,
        partitioner: Any = None,
    ) -> tuple[nnx.State, dict[str, Any]]:
        """The parameters and metadata of `step` (default: the latest).

        Args:
          step: the step to restore.
          config: the network config (default: the checkpoint's own).
          partitioner: a `t2t.partitioning.Partitioner` to restore straight into its shards;
            None puts every array on the default device.
        """
        step = self.resolve_step(step)
        config = config or self.config(step)
        build = lambda: t2t_nn.build(config, nnx.Rngs(params=0))  # noqa: E731
        if partitioner is None:
            # Every array on this process's first device, whatever mesh wrote it (a pod
            # slice's checkpoint read on one machine): Orbax would otherwise ask for the
            # saved devices.
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                nnx.split(nnx.eval_shape(build))[1],
            )
        else:
            abstract = partitioner.abstract_model(build)[1]
        restored = self._manager.restore(step, abstract_params=abstract)
        return restored.params, restored.metadata

    def load(self, step: int | None = None, *, partitioner: Any = None) -> Loaded:
        """The network config and parameters of `step` (default: the newest intact checkpoint).

        With `step=None`, a checkpoint that cannot be read or fails its checksums is skipped
        for the one before it, with a warning on stderr naming what was damaged.

        Args:
          step: the step to restore.
          partitioner: see `restore_params`.

        Raises:
          CorruptCheckpointError: `step` is damaged (or, for None, every checkpoint is).
        """
        if step is not None:
            return self._load(self.resolve_step(step), partitioner)
        skipped = []
        for candidate in reversed(self.steps()):
            try:
                loaded = self._load(candidate, partitioner)
            except manager_lib.CorruptCheckpointError as error:
                skipped.append(error)
                print(f"{error}\nTrying the checkpoint before it.", file=sys.stderr, flush=True)
                continue
            if skipped:
                print(
                    f"Using step {candidate} of {self.path}, the newest intact checkpoint.",
                    file=sys.stderr,
                    flush=True,
                )
            return loaded
        if not skipped:
            raise FileNotFoundError(f"{self.path} holds no checkpoint yet.")
        raise manager_lib.CorruptCheckpointError(
            self.path,
            skipped[0].step,
            "every checkpoint",
            "no intact checkpoint is left (`t2t check` lists what is damaged)",
        )

    def _load(self, step: int, partitioner: Any) -> Loaded:
        config = self.config(step)
        params, metadata = self.restore_params(step, config=config, partitioner=partitioner)
        return Loaded(step, config, params, metadata)

    def check(self, report: Any = None) -> dict[int, tuple[str, list[str]]]:
        """Verifies every checkpoint against its checksums (`CheckpointManager.verify`).

        Args:
          report: called with (step, status, problems) as each checkpoint is done.

        Returns:
          {step: (status, problems)}, status "ok", "damaged" or "unverified".
        """
        results = {}
        for step in self.steps():
            results[step] = self._manager.verify(step)
            if report is not None:
                report(step, *results[step])
        return results


class ReleasedDir:
    """A checkpoint another framework released (T5X, T5X on Orbax, Mesh TensorFlow) read as a
    model directory of one checkpoint, for `t2t eval` and `t2t infer`; it carries no
    vocabulary (tasks bring theirs; files need `--vocabulary_file`) and is never written to.

    Attributes:
      path: the folder given.
    """

    writable = False

    def __init__(self, path: str | os.PathLike):
        from t2t.checkpoints import released

        self.path = os.fspath(path)
        self._opened = released.open_checkpoint(self.path, dropout_rate=0.0)

    def steps(self) -> list[int]:
        return [self._opened.step]

    def resolve_step(self, step: int | None) -> int:
        if step is not None and step != self._opened.step:
            raise ValueError(
                f"{self._opened.path} is the checkpoint of step {self._opened.step}, not {step}; "
                "give the folder of that step."
            )
        return self._opened.step

    def metadata(self, step: int | None = None) -> dict[str, Any]:
        origin = {"kind": self._opened.format, "path": self._opened.path}
        return {"step": self.resolve_step(step), "initialized_from": origin}

    def config(self, step: int | None = None) -> t2t_nn.TransformerConfig:
        self.resolve_step(step)
        return self._opened.config

    def vocabulary_file(self, step: int | None = None) -> tuple[str, int]:
        raise ValueError(
            f"{self.path} is a {self._opened.format} checkpoint, which carries no vocabulary; "
            "pass its SentencePiece model (--vocabulary_file=PATH; docs/model.md lists the "
            "releases' vocabularies)."
        )

    def vocabulary(self, step: int | None = None) -> seqio.SentencePieceVocabulary:
        path, extra_ids = self.vocabulary_file(step)
        return seqio.SentencePieceVocabulary(path, extra_ids=extra_ids)

    def gin_config_path(self) -> str | None:
        return None

    def load(self, step: int | None = None, *, partitioner: Any = None) -> Loaded:
        from t2t.checkpoints import hf, stored

        step = self.resolve_step(step)
        config = self._opened.config
        if partitioner is None:
            device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
            abstract = jax.tree.map(
                lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=device),
                hf.abstract_state(config),
            )
        else:
            abstract = partitioner.abstract_model(lambda: t2t_nn.build(config, nnx.Rngs(0)))[1]
        arrays = stored.match(self._opened.params, hf.abstract_state(config), self._opened.path)
        return Loaded(step, config, stored.place(arrays, abstract), self.metadata(step))


def open_model_dir(path: str | os.PathLike) -> ModelDir | ReleasedDir:
    """The model directory at `path`: a t2t one, or a released checkpoint read as one."""
    from t2t.checkpoints import released

    if not files.isdir(files.join(os.fspath(path), manager_lib.CHECKPOINTS_SUBDIR)):
        if released.detect(os.fspath(path)) is not None:
            return ReleasedDir(path)
    return ModelDir(path)


def load_members(
    model_dir: str | None,
    checkpoints: Sequence[str | int] = (),
    *,
    step: int | None = None,
    partitioner: Any = None,
) -> tuple[Loaded, nnx.State | tuple[nnx.State, ...]]:
    """The network config and parameters of one checkpoint or of an ensemble.

    Args:
      model_dir: the model directory (its `step`, default the latest, when no `checkpoints`).
      checkpoints: ensemble members, each a step of `model_dir` (`1000`) or another model
        directory, optionally with a step (`/runs/b` or `/runs/b@1000`).
      step: the step of `model_dir` for a single checkpoint.
      partitioner: restore into its shards.

    Returns:
      `(loaded, params)`: the first member's `Loaded` (network config, metadata) and
      its params, or a tuple of every member's params.

    Raises:
      ValueError: members of different networks, or nothing to load.
    """
    if not checkpoints:
        if model_dir is None:
            raise ValueError("Pass model_dir (and optionally step), or checkpoints.")
        loaded = open_model_dir(model_dir).load(step, partitioner=partitioner)
        return loaded, loaded.params
    members = []
    for spec in checkpoints:
        path, member_step = parse_member(spec, model_dir)
        members.append(open_model_dir(path).load(member_step, partitioner=partitioner))
    for member, spec in zip(members[1:], checkpoints[1:]):
        if member.config != members[0].config:
            raise ValueError(
                f"Ensemble member {spec!r} is a different network from {checkpoints[0]!r} "
                "(configs differ); an ensemble averages the logits of one architecture and "
                "vocabulary."
            )
    return members[0], tuple(m.params for m in members)


def parse_member(spec: str | int, model_dir: str | None) -> tuple[str, int | None]:
    """An ensemble member spec -> (model directory, step or None for the latest).

    Example: "2000" -> (model_dir, 2000); "/runs/b@3000" -> ("/runs/b", 3000); "/runs/b" ->
    ("/runs/b", None).
    """
    text = str(spec).strip()
    if text.isdigit():
        if model_dir is None:
            raise ValueError(f"Ensemble member {spec!r} is a step; pass model_dir too.")
        return model_dir, int(text)
    path, _, step = text.rpartition("@") if "@" in text else (text, "", "")
    if step and not step.isdigit():
        raise ValueError(f"Ensemble member {spec!r}: expected DIR or DIR@STEP or STEP.")
    return path, int(step) if step else None
