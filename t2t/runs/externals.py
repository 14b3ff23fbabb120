"""The library callables gin files name (`@t2t.optim.adafactor()`, `@t2t.nn.get_preset()`, ...),
registered as external configurables, and every pretraining objective's knobs.

Library modules carry no gin; what gin binds that is not a run function is registered here, once,
when `t2t.runs` is imported.
"""

from __future__ import annotations

from collections.abc import Callable

import gin
import optax

from t2t import decoding, models, optim
from t2t import nn as t2t_nn
from t2t.finetuning import FineTuning
from t2t.nn.config import TransformerConfig
from t2t.trainer import monitors, options


def checkpoint_model_config(path: str, **overrides) -> TransformerConfig:
    """The network of a checkpoint to start from, with field overrides (e.g. dropout_rate).

    Args:
      path: a HF T5 directory (read from its `config.json`) or a t2t model directory (read
        from its latest checkpoint's metadata).
    """
    from t2t.trainer import sources

    return sources.source_config(path, **overrides)


def _register_externals() -> dict[str, Callable]:
    registered = {}
    for module, functions in (
        ("t2t.nn", (t2t_nn.get_preset,)),
        ("t2t.decoding", (decoding.DecodingConfig,)),
        (
            "t2t.optim",
            (
                optim.adafactor,
                optim.inverse_sqrt,
                optim.constant,
                optim.warmup_linear_decay,
                optim.warmup_cosine_decay,
                optim.slanted_triangular,
            ),
        ),
        ("t2t.finetuning", (FineTuning,)),
        ("t2t.trainer", (monitors.EarlyStopping, monitors.ReduceOnPlateau)),
        ("t2t.models", (models.EncoderDecoderModel, models.DecoderOnlyModel, models.model_for)),
        ("optax", (optax.adamw, optax.sgd)),
        (
            "t2t.runs",
            (
                checkpoint_model_config,
                options.DataOptions,
                options.CheckpointOptions,
                options.EvalOptions,
                options.LoopOptions,
            ),
        ),
    ):
        for function in functions:
            name = function.__name__
            registered[f"{module}.{name}"] = gin.external_configurable(function, name, module)
    return registered


EXTERNALS = _register_externals()


def decoding_config(
    config: decoding.DecodingConfig | None = None, **fields
) -> decoding.DecodingConfig:
    """`config` when given, else a `DecodingConfig` with the gin files' bindings
    (`t2t.decoding.DecodingConfig.beam_size = 4`) and `fields` over them: how a run function
    turns gin's decoding options into the one config the library takes."""
    if config is not None:
        return decoding.DecodingConfig.of(config, **fields)
    return EXTERNALS["t2t.decoding.DecodingConfig"](**fields)


def _register_objectives() -> None:
    """Every pretraining objective's knobs bindable from gin, for every task built on it
    (built-in corpus, text files, C4, the C4 pipeline's output): `span_corruption.noise_density
    = 0.5`, `span_corruption.mean_noise_span_length = 10.0`, `bert_style.mask_rate = 0.8`.
    Knobs a task was registered with (the C4 sweep tasks) take precedence."""
    import preprocessors
    from t2t.data.tasks import text

    for name in text.OBJECTIVES:
        wrapper = gin.external_configurable(getattr(preprocessors, name), name, "preprocessors")
        text.set_objective_implementation(name, wrapper)


_register_objectives()
