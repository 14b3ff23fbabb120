"""Where a run's first parameters come from when its model directory has no checkpoint yet.

A run starts from random initialization, from a HF T5 directory (`config.json` +
`model.safetensors`, imported with `t2t.checkpoints.hf`), or from the checkpoint of another t2t
run (its model directory; parameters only, the optimizer starts afresh). Whatever the source,
the parameters land directly in the shards the run's partitioner gives them, and a source whose
network differs from the run's configuration is refused with the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
from flax import nnx

from t2t import nn as t2t_nn
from t2t.checkpoints import hf
from t2t.checkpoints.manager import CHECKPOINTS_SUBDIR, CheckpointManager, config_from_metadata
from t2t.nn.config import TransformerConfig

HF = "hf"
T2T = "t2t"
# Fields a fine-tuning run may change without changing the parameters' meaning (the layer
# layout is converted, `t2t.nn.to_layout`).
_FREE_FIELDS = ("dropout_rate", "dtype", "param_dtype", "scan_layers", "remat_policy")


def checkpoint_kind(path: str) -> str:
    """"hf" for a HF T5 directory, "t2t" for a t2t model directory (or its checkpoints/).

    Raises:
      FileNotFoundError: when `path` is neither.
    """
    if os.path.exists(os.path.join(path, hf.CONFIG_FILE)) and (
        os.path.exists(os.path.join(path, hf.WEIGHTS_FILE))
        or os.path.exists(os.path.join(path, hf.WEIGHTS_INDEX_FILE))
    ):
        return HF
    if os.path.isdir(os.path.join(path, CHECKPOINTS_SUBDIR)):
        return T2T
    found = sorted(os.listdir(path)) if os.path.isdir(path) else "no such directory"
    raise FileNotFoundError(
        f"Cannot start from {path!r} (it holds: {found}). Expected a HF T5 directory "
        f"({hf.CONFIG_FILE} + {hf.WEIGHTS_FILE}) or a t2t model directory (with "
        f"{CHECKPOINTS_SUBDIR}/)."
    )


def _model_dir(path: str) -> str:
    """A t2t model directory given itself or its checkpoints/ subdirectory."""
    path = os.path.normpath(path)
    return os.path.dirname(path) if os.path.basename(path) == CHECKPOINTS_SUBDIR else path


def source_config(path: str, **overrides) -> TransformerConfig:
    """The network configuration of a HF directory or a t2t run, with `overrides` applied."""
    if checkpoint_kind(path) == HF:
        with open(os.path.join(path, hf.CONFIG_FILE)) as f:
            return hf.config_from_hf(json.load(f), **overrides)
    manager = CheckpointManager(_model_dir(path), read_only=True)
    return config_from_metadata(manager.read_metadata()).replace(**overrides)


def check_compatible(source: TransformerConfig, config: TransformerConfig, what: str) -> None:
    """Raises ValueError when `source` and `config` describe different networks.

    Dropout and dtypes may differ (fine-tuning changes them); every other field must match.
    """
    differ = [
        f"{f.name}: checkpoint {getattr(source, f.name)!r}, run {getattr(config, f.name)!r}"
        for f in dataclasses.fields(TransformerConfig)
        if f.name not in _FREE_FIELDS and getattr(source, f.name) != getattr(config, f.name)
    ]
    if differ:
        raise ValueError(
            f"The network of {what} differs from the run's model config: {'; '.join(differ)}. "
            "Use the matching model gin file, or leave the model config unset to take the "
            "checkpoint's."
        )


def load_params(path: str, config: TransformerConfig, abstract_params: nnx.State,
                step: int | None = None, *, partitioner: Any = None,
                ) -> tuple[nnx.State, dict[str, Any]]:
    """The parameters of a HF directory or t2t run, laid out as `abstract_params` says.

    A source in the other layer layout (scanned or not) is converted (`t2t.nn.to_layout`).

    Args:
      path: a HF T5 directory or a t2t model directory.
      config: the run's network configuration (checked against the source's).
      abstract_params: the run's parameter shapes carrying shardings.
      step: which checkpoint of a t2t run (default: its latest).
      partitioner: the run's partitioner; needed only to convert a t2t checkpoint of the other
        layout (it is restored in its own layout's shards first).

    Returns:
      (params, description) where description says what was loaded (for logs and metadata).
    """
    if checkpoint_kind(path) == HF:
        source, state = hf.import_hf(path, scan_layers=config.scan_layers)
        check_compatible(source, config, f"HF checkpoint {path}")
        values = nnx.to_pure_dict(state)
        params = jax.tree.map(lambda x: x, abstract_params)  # a new State to fill
        placed = jax.tree.map(
            lambda a, v: jax.device_put(np.asarray(v, a.dtype), a.sharding),
            nnx.to_pure_dict(abstract_params), values,
        )
        nnx.replace_by_pure_dict(params, placed)
        return params, {"kind": HF, "path": os.path.abspath(path)}
    manager = CheckpointManager(_model_dir(path), read_only=True)
    metadata = manager.read_metadata(step)
    source = config_from_metadata(metadata)
    check_compatible(source, config, f"the t2t run {path}")
    target = abstract_params
    if source.scan_layers != config.scan_layers:
        if partitioner is None:
            raise ValueError(
                f"The checkpoint {path} has scan_layers={source.scan_layers}, the run "
                f"{config.scan_layers}; converting needs the run's partitioner.")
        _, target = partitioner.abstract_model(lambda: t2t_nn.build(source, nnx.Rngs(params=0)))
    restored = manager.restore(metadata["step"], abstract_params=target)
    manager.close()
    params = restored.params
    if target is not abstract_params:
        shardings = jax.tree.map(lambda x: x.sharding, abstract_params)
        with partitioner.context():
            params = jax.jit(lambda p: t2t_nn.to_layout(p, config), out_shardings=shardings)(params)
    return params, {"kind": T2T, "path": os.path.abspath(path), "step": restored.step}
