"""Where a run's first parameters come from when its model directory has no checkpoint: a HF
T5 directory (`config.json` + `model.safetensors`, imported with `t2t.checkpoints.hf`), a
checkpoint Google or another framework released (T5X, T5X on Orbax, Mesh TensorFlow:
`t2t.checkpoints.released`), or the checkpoint of another t2t run (its model directory,
optionally `DIR@STEP`, `DIR@last` or `DIR@best:METRIC`; parameters only). Whatever the source,
the parameters land directly in the shards the run's partitioner gives them, and a source whose
network differs from the run's configuration is refused with the fields that differ.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from t2t import files
from t2t import nn as t2t_nn
from t2t.checkpoints import hf, released, stored
from t2t.checkpoints.manager import CHECKPOINTS_SUBDIR, CheckpointManager, config_from_metadata
from t2t.nn.config import TransformerConfig

HF = "hf"
T2T = "t2t"
# Fields a fine-tuning run may change without changing the parameters' meaning (the layer
# layout is converted, `t2t.nn.to_layout`).
_FREE_FIELDS = (
    "dropout_rate",
    "dtype",
    "param_dtype",
    "scan_layers",
    "unroll_layers",
    "remat_policy",
)


def checkpoint_kind(path: str) -> str:
    """ "hf" for a HF T5 directory, "t2t" for a t2t model directory (or its checkpoints/), or
    the format of a released checkpoint (`released.FORMATS`: "t5x", "t5x_orbax", "mtf").

    Raises:
      FileNotFoundError: when `path` is none of them.
    """
    if files.exists(files.join(path, hf.CONFIG_FILE)) and (
        files.exists(files.join(path, hf.WEIGHTS_FILE))
        or files.exists(files.join(path, hf.WEIGHTS_INDEX_FILE))
    ):
        return HF
    if files.isdir(files.join(path, CHECKPOINTS_SUBDIR)):
        return T2T
    kind = released.detect(path)
    if kind is not None:
        return kind
    found = files.listdir(path) if files.isdir(path) else "no such directory"
    raise FileNotFoundError(
        f"Cannot start from {path!r} (it holds: {found}). Expected a HF T5 directory "
        f"({hf.CONFIG_FILE} + {hf.WEIGHTS_FILE}), a t2t model directory (with "
        f"{CHECKPOINTS_SUBDIR}/), a T5X checkpoint (a checkpoint_<step>/ folder holding a "
        "msgpack `checkpoint` or an Orbax `state/`, or the directory of such folders) or a "
        "Mesh TensorFlow checkpoint (model.ckpt-<step>.index and its .data-* shards)."
    )


def _model_dir(path: str) -> str:
    """A t2t model directory given itself or its checkpoints/ subdirectory."""
    path = files.normalize(path)
    return files.parent(path) if files.basename(path) == CHECKPOINTS_SUBDIR else path


# A checkpoint spec's step suffix: "@1200", "@last", "@best:METRIC" (see `resolve`).
_STEP_SUFFIX = re.compile(r"^(?P<path>.+)@(?P<which>\d+|last|best:.+)$")


def resolve(spec: str) -> tuple[str, int | None]:
    """A checkpoint spec -> (directory, step or None for the latest).

    `spec` is a HF T5 directory or a t2t model directory, optionally followed by which
    checkpoint of the latter: `DIR@1200` (that step), `DIR@last`, or `DIR@best:METRIC` (the
    step whose saved evaluation has the best METRIC; lower is better for losses and
    perplexities, higher for everything else). A chain of training stages starts each stage
    from `PREVIOUS@best:METRIC`, so every stage is an ordinary `t2t train` command.

    Raises:
      ValueError: no checkpoint of DIR has METRIC (the message lists the metrics it has).
    """
    match = _STEP_SUFFIX.match(os.fspath(spec))
    if match is None or files.exists(spec):
        return os.fspath(spec), None
    path, which = match.group("path"), match.group("which")
    if which == "last":
        return path, None
    if which.isdigit():
        return path, int(which)
    return path, best_step(path, which[len("best:") :])


def best_step(path: str, metric: str) -> int:
    """The step of a t2t model directory whose saved metrics have the best `metric`."""
    from t2t.evaluation import higher_is_better

    manager = CheckpointManager(_model_dir(path), read_only=True)
    try:
        found = {step: (manager.metrics(step) or {}) for step in manager.all_steps()}
    finally:
        manager.close()
    scored = {step: values[metric] for step, values in found.items() if metric in values}
    if not scored:
        known = sorted({name for values in found.values() for name in values})
        raise ValueError(
            f"No checkpoint of {path} was saved with {metric!r} (steps {sorted(found)}; their "
            f"metrics: {known or 'none'}). Track it with t2t.runs.CheckpointOptions.best_metrics = "
            f"{{'{metric}': 'max'}} and evaluate at checkpoint steps (t2t.runs.EvalOptions.every = "
            "t2t.runs.CheckpointOptions.every), or start from @last."
        )
    sign = 1.0 if higher_is_better(metric) else -1.0
    return max(scored, key=lambda step: (sign * scored[step], -step))


def source_config(path: str, **overrides) -> TransformerConfig:
    """The network configuration of a HF directory or a t2t run (a `resolve` spec), with
    `overrides` applied."""
    path, step = resolve(path)
    kind = checkpoint_kind(path)
    if kind == HF:
        return hf.config_from_hf(
            json.loads(files.read_text(files.join(path, hf.CONFIG_FILE))), **overrides
        )
    if kind in released.FORMATS:
        opened = released.open_checkpoint(path, step, **overrides)
        logging.info("%s", opened.describe())
        return opened.config
    manager = CheckpointManager(_model_dir(path), read_only=True)
    return config_from_metadata(manager.read_metadata(step)).replace(**overrides)


# Fields of networks that add parameters to the pretrained one (`TransformerConfig.additions`).
_ADDITION_FIELDS = ("adapter_size", "lora_rank", "lora_alpha", "lora_targets", "prompt_length")


def check_compatible(
    source: TransformerConfig,
    config: TransformerConfig,
    what: str,
    *,
    reinit: bool = False,
    assumed: Sequence[str] = (),
) -> None:
    """Raises ValueError when `source` and `config` describe different networks.

    Dropout, dtypes and the layer layout may differ (fine-tuning changes them), and the run may
    add adapters, LoRA or a soft prompt the source lacks. With `reinit` (some parameters start
    afresh) any field may differ: every parameter that is loaded is checked by shape instead.
    `assumed` names fields the source does not record (a released checkpoint's activation, say),
    which the run decides.
    """
    if reinit:
        return
    differ = [
        f"{f.name}: checkpoint {getattr(source, f.name)!r}, run {getattr(config, f.name)!r}"
        for f in dataclasses.fields(TransformerConfig)
        if f.name not in (*_FREE_FIELDS, *_ADDITION_FIELDS, *assumed)
        and getattr(source, f.name) != getattr(config, f.name)
    ]
    dropped = sorted(set(source.additions) - {"lora_rank"} - set(config.additions))
    if dropped:
        differ.append(f"the checkpoint has {dropped} (fine-tuned additions) the run does not")
    if differ:
        raise ValueError(
            f"The network of {what} differs from the run's model config: {'; '.join(differ)}. "
            "Use the matching model gin file, or leave the model config unset to take the "
            "checkpoint's."
        )


def load_params(
    path: str,
    config: TransformerConfig,
    abstract_params: nnx.State,
    step: int | None = None,
    *,
    partitioner: Any = None,
    reinit: Sequence[str] = (),
    seed: int = 0,
    prompt_init: str = "vocabulary",
) -> tuple[nnx.State, dict[str, Any]]:
    """The parameters of a HF directory or t2t run, laid out as `abstract_params` says.

    A source in the other layer layout (scanned or not) is converted (`t2t.nn.to_layout`). When
    the run's network adds parameters the source lacks (adapters, LoRA, a soft prompt) or
    `reinit` names groups to start afresh, those come from the run's random initialization
    (`seed`) and the rest from the source; a source's LoRA updates the run does not have are
    merged into its kernels.

    Args:
      path: a HF T5 directory or a t2t model directory, optionally with a step, `DIR@1200`,
        `DIR@last` or `DIR@best:METRIC` (`resolve`).
      config: the run's network configuration (checked against the source's).
      abstract_params: the run's parameter shapes carrying shardings.
      step: which checkpoint of a t2t run (default: its latest).
      partitioner: the run's partitioner; needed to convert a t2t checkpoint of the other
        layout, and to initialize added or re-initialized parameters.
      reinit: `t2t.finetuning` specs of parameters to initialize instead of load.
      seed: the random initialization's seed.
      prompt_init: "vocabulary" (a new soft prompt copies the embeddings of sampled
        vocabulary tokens) or "random".

    Returns:
      (params, description) where description says what was loaded (for logs and metadata).
    """
    reinit = list(reinit)
    path, spec_step = resolve(path)
    step = spec_step if step is None else step
    kind = checkpoint_kind(path)
    if kind == HF or kind in released.FORMATS:
        source, arrays, description = _read_lazily(kind, path, step, config, bool(reinit))
        if config.scan_layers:
            arrays = stored.stack_layers(arrays)
        if not (reinit or config.additions):
            return stored.place(arrays, abstract_params), description
        values = stored.read_values(arrays)
    else:
        source, values, loaded_step = _restore_t2t(
            path, step, config, abstract_params, partitioner, bool(reinit)
        )
        description = {"kind": T2T, "path": files.absolute(path), "step": loaded_step}
        if isinstance(values, nnx.State):  # the same network: already in the run's shards
            return values, description
    if source.lora_rank and not config.lora_rank:
        values, source = t2t_nn.merge_lora(values, source)
        description["merged_lora"] = True
    merged = _with_fresh(values, config, partitioner, reinit, seed, prompt_init, description)
    return _place(merged, abstract_params), description


def _read_lazily(kind: str, path: str, step: int | None, config: TransformerConfig, reinit: bool):
    """(source config, path -> `StoredArray` in the unscanned layout, description) of a HF
    directory or a released checkpoint, checked against the run's network, nothing read yet."""
    if kind == HF:
        source, named = hf.open_hf(path)
        what = f"HF checkpoint {path}"
        check_compatible(source, config, what, reinit=reinit)
        description: dict[str, Any] = {"kind": HF, "path": files.absolute(path)}
        return (
            source,
            stored.match(named, hf.abstract_state(source.replace(scan_layers=False)), what),
            description,
        )
    opened = released.open_checkpoint(path, step)
    if jax.process_index() == 0:
        print(f"Starting from {opened.describe()}", flush=True)
    what = f"the {kind} checkpoint {opened.path}"
    # The shapes are checked parameter by parameter below (naming the first that differs);
    # here only what the checkpoint records and no shape shows.
    unchecked = (*opened.assumed, *released.SHAPE_FIELDS)
    check_compatible(opened.config, config, what, reinit=reinit, assumed=unchecked)
    description = {"kind": kind, "path": files.absolute(opened.path), "step": opened.step}
    plain = config.replace(scan_layers=False, adapter_size=0, lora_rank=0, prompt_length=0)
    shapes = hf.abstract_state(opened.config if reinit else plain)
    return opened.config, stored.match(opened.params, shapes, what), description


def _with_fresh(values, config, partitioner, reinit, seed, prompt_init, description) -> dict:
    """`values` with the parameters the source lacks, or `reinit` names, from the run's random
    initialization (a new soft prompt from sampled vocabulary embeddings with "vocabulary");
    what was initialized is added to `description`."""
    if partitioner is None:
        raise ValueError(
            "Initializing added or re-initialized parameters needs the run's partitioner."
        )
    fresh = nnx.to_pure_dict(
        nnx.split(partitioner.init_model(lambda: t2t_nn.build(config, nnx.Rngs(params=seed))))[1]
    )
    merged, started = _fill(fresh, values, reinit)
    if started:
        description["initialized"] = started
    if config.prompt_length and prompt_init == "vocabulary" and "prompt/embedding" in started:
        merged["prompt"]["embedding"], tokens = _prompt_from_vocabulary(
            merged["token_embedder"]["embedding"], config.prompt_length, seed
        )
        description["prompt_tokens"] = tokens
    return merged


def same_network(source: TransformerConfig, config: TransformerConfig) -> bool:
    """Whether two configs have the same parameters (layout, dropout and dtypes aside)."""
    free = {name: getattr(config, name) for name in _FREE_FIELDS}
    return source.replace(**free) == config


def _restore_t2t(path, step, config, abstract_params, partitioner, reinit):
    """(source config, params, step) of a t2t run's checkpoint, in the run's layer layout.

    The params are an `nnx.State` in the run's shards when the networks are the same, else a
    pure dict of the source network's parameters (to fill the run's from).
    """
    manager = CheckpointManager(_model_dir(path), read_only=True)
    metadata = manager.read_metadata(step)
    source = config_from_metadata(metadata)
    check_compatible(source, config, f"the t2t run {path}", reinit=reinit)
    same = not reinit and same_network(source, config)
    target = abstract_params
    if not same or source.scan_layers != config.scan_layers:
        if partitioner is None:
            raise ValueError(
                f"The checkpoint {path} is another network or layout (scan_layers="
                f"{source.scan_layers}, run {config.scan_layers}); converting needs the run's "
                "partitioner."
            )
        _, target = partitioner.abstract_model(lambda: t2t_nn.build(source, nnx.Rngs(params=0)))
    if same and source.scan_layers == config.scan_layers:
        params = _read_in_shards(path, metadata, abstract_params)
        if params is not None:
            manager.close()
            return source, params, metadata["step"]
    try:
        restored = manager.restore(metadata["step"], abstract_params=target)
    finally:
        manager.close()
    params = restored.params
    if source.scan_layers != config.scan_layers:
        layout = source.replace(scan_layers=config.scan_layers)
        shardings = jax.tree.map(lambda x: x.sharding, abstract_params) if same else None
        with partitioner.context():
            params = jax.jit(lambda p: t2t_nn.to_layout(p, layout), out_shardings=shardings)(params)
        source = layout
    if same:
        return source, params, restored.step
    return source, nnx.to_pure_dict(params), restored.step


def _read_in_shards(path: str, metadata: dict, abstract_params: nnx.State) -> nnx.State | None:
    """A t2t checkpoint's parameters read array by array straight into the run's shards, as a
    released checkpoint's are (Orbax's own restore holds more beside them), their checksums
    verified; None when anything is off, for Orbax's restore to read it and say what."""
    from t2t.checkpoints import integrity, t5x

    item = files.join(_model_dir(path), CHECKPOINTS_SUBDIR, str(metadata["step"]), "params")
    expected = (metadata.get("checksums") or {}).get("params")
    try:
        named = t5x.read_orbax_item(item)
        params = stored.place(stored.match(named, abstract_params, item), abstract_params)
    except (ValueError, OSError):
        return None
    if expected is not None and integrity.mismatches(expected, nnx.to_pure_dict(params)):
        return None
    return params


def _place(values: Any, abstract_params: nnx.State) -> nnx.State:
    """A pure dict of arrays (host or device) as a State in the shards of `abstract_params`."""
    params = jax.tree.map(lambda x: x, abstract_params)  # a new State to fill
    placed = jax.tree.map(
        lambda a, v: jax.device_put(v.astype(a.dtype), a.sharding),
        nnx.to_pure_dict(abstract_params),
        values,
    )
    nnx.replace_by_pure_dict(params, placed)
    return params


def _fill(fresh: dict, source: dict, reinit: Sequence[str]) -> tuple[dict, list[str]]:
    """The run's parameters: the source's where it has them, `fresh` where `reinit` selects
    them or where they are additions the source lacks.

    Returns:
      (the merged pure dict, the paths taken from `fresh`, in whole or in part).

    Raises:
      ValueError: a parameter the source lacks (or has in another shape) that is neither an
        addition nor re-initialized.
    """
    from t2t.finetuning import groups
    from t2t.nn.additions import is_added

    masks = {
        path: mask
        for (path, _), mask in zip(
            groups.leaf_shapes(fresh), groups.masks_of(groups.select(fresh, reinit))
        )
    }
    flat_source = {"/".join(k): v for k, v in _flatten(source)}
    started, problems = [], []

    def pick(path: str, new):
        old = flat_source.get(path)
        mask = masks[path]
        fits = old is not None and tuple(old.shape) == tuple(new.shape)
        if isinstance(mask, np.ndarray):  # some layers of a stacked parameter start afresh
            if not fits:
                problems.append(
                    f"{path}: checkpoint {None if old is None else old.shape}, run {new.shape}"
                )
                return new
            started.append(path)
            keep = mask.reshape((-1,) + (1,) * (new.ndim - 1))
            return jnp.where(keep, new, old.astype(new.dtype))
        if mask or (not fits and old is None and is_added(path)):
            started.append(path)
            return new
        if not fits:
            problems.append(
                f"{path}: checkpoint {None if old is None else tuple(old.shape)}, "
                f"run {tuple(new.shape)}"
            )
            return new
        return old

    merged = _map_paths(pick, fresh)
    if problems:
        raise ValueError(
            "The checkpoint cannot fill these parameters of the run's network: "
            f"{'; '.join(problems[:6])}{' ...' if len(problems) > 6 else ''}. Re-initialize "
            "them (FineTuning.reinit, e.g. ['decoder']) or use the checkpoint's network."
        )
    return merged, started


def _flatten(tree: dict, prefix: tuple[str, ...] = ()):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from _flatten(value, prefix + (str(key),))
        else:
            yield prefix + (str(key),), value


def _map_paths(fn, tree: dict, prefix: str = "") -> dict:
    return {
        key: (
            _map_paths(fn, value, f"{prefix}{key}/")
            if isinstance(value, dict)
            else fn(f"{prefix}{key}", value)
        )
        for key, value in tree.items()
    }


# Lester et al. (2021) sample prompt initializations from the 5,000 most common tokens; the
# ids of a SentencePiece unigram vocabulary are roughly in that order (0-2: pad, EOS, unk).
_PROMPT_VOCABULARY = (3, 5000)


def _prompt_from_vocabulary(embedding, length: int, seed: int):
    """P rows of the embedding table [V, D] of distinct sampled tokens: -> ([P, D], ids)."""
    low, high = _PROMPT_VOCABULARY
    high = min(high, embedding.shape[0])
    ids = np.random.default_rng(seed).choice(
        np.arange(low, high), length, replace=high - low < length
    )
    return jnp.take(jnp.asarray(embedding), jnp.asarray(ids), axis=0), [int(i) for i in ids]
