"""The programs of a run, lowered and compiled on abstract inputs: nothing is allocated or run.

`compile_train_step` builds exactly what `t2t train` runs (`t2t.trainer.steps`: the model
wrapper's loss, microbatched gradients, the optimizer update, donated parameters and optimizer
state) with every input a `jax.ShapeDtypeStruct` carrying the sharding the trainer gives it;
`compile_decode` does the same for greedy decoding of a batch (`predict_batch`, the cache
included). Both show the elapsed time while the compiler works.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from t2t import models
from t2t import nn as t2t_nn
from t2t.aot import flops
from t2t.partitioning import Partitioner


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A compiled program and how long each phase took."""

    compiled: Any  # jax.stages.Compiled
    lower_seconds: float  # tracing and lowering
    compile_seconds: float
    matmul_flops: int  # of the whole (global) program, loops counted (`t2t.aot.flops`)
    attention_flops: int = 0  # the part of matmul_flops in cuDNN's fused attention


@contextlib.contextmanager
def ticking(label: str, *, enabled: bool = True, every: float = 5.0) -> Iterator[None]:
    """Shows "label ... N s" on stderr, updated every `every` seconds, until the block ends."""
    if not enabled:
        yield
        return
    start = time.perf_counter()
    done = threading.Event()
    interactive = sys.stderr.isatty()

    def tick():
        while not done.wait(every if interactive else max(every, 30.0)):
            line = f"{label} ... {time.perf_counter() - start:.0f} s"
            print(
                f"\r{line}" if interactive else line,
                end="" if interactive else "\n",
                file=sys.stderr,
                flush=True,
            )

    thread = threading.Thread(target=tick, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()
        end = "\n" if interactive else ""
        print(
            f"{'' if not interactive else chr(13)}{label}: {time.perf_counter() - start:.1f} s",
            end=end if interactive else "\n",
            file=sys.stderr,
            flush=True,
        )


def batch_shapes(
    model: models.BaseModel | str,
    task_feature_lengths: Mapping[str, int],
    batch_size: int,
    *,
    pack: bool = True,
) -> dict[str, tuple[int, ...]]:
    """The model features of one global training batch and their shapes (all int32), from the
    model wrapper's converter (an architecture name stands for its model).

    Example: encoder-decoder, {"inputs": 512, "targets": 114}, 128 rows, packed ->
    encoder_input_tokens / _segment_ids / _positions (128, 512) and decoder_input_tokens /
    _target_tokens / _loss_weights / _segment_ids / _positions (128, 114).
    """
    from t2t.data import features  # imports seqio and TensorFlow (data only, no device)

    has_inputs = "inputs" in task_feature_lengths
    if isinstance(model, str):
        converter = features.feature_converter(model, has_inputs=has_inputs, pack=pack)
    else:
        converter = model.feature_converter(pack=pack, has_inputs=has_inputs)
    lengths = features.model_feature_lengths(converter, task_feature_lengths)
    return {name: (batch_size, length) for name, length in lengths.items()}


def _abstract_batch(partitioner: Partitioner, shapes: Mapping[str, tuple[int, ...]]) -> dict:
    return {
        name: jax.ShapeDtypeStruct(
            shape, jnp.int32, sharding=partitioner.batch_sharding(len(shape))
        )
        for name, shape in shapes.items()
    }


def _lower_and_compile(label: str, trace: Callable[[], Any], progress: bool) -> Compiled:
    start = time.perf_counter()
    traced = trace()
    lowered = traced.lower()
    lowered_at = time.perf_counter()
    with ticking(f"compiling the {label}", enabled=progress):
        compiled = lowered.compile()
    return Compiled(
        compiled,
        lowered_at - start,
        time.perf_counter() - lowered_at,
        flops.matmul_flops(traced.jaxpr),
        flops.fused_attention_flops(traced.jaxpr),
    )


def abstract_state(
    model: models.BaseModel, tx: optax.GradientTransformation, partitioner: Partitioner
) -> tuple[Any, Any]:
    """The run's parameters and optimizer state as sharded shapes (no memory)."""
    config = model.config
    _, params = partitioner.abstract_model(lambda: t2t_nn.build(config, nnx.Rngs(params=0)))
    return params, partitioner.abstract_optimizer(tx, params)


def compile_train_step(
    model: models.BaseModel,
    tx: optax.GradientTransformation,
    partitioner: Partitioner,
    shapes: Mapping[str, tuple[int, ...]],
    *,
    num_microbatches: int = 1,
    progress: bool = True,
) -> Compiled:
    """The trainer's jitted train step for these batch shapes, compiled for the partitioner's
    devices (`t2t.trainer.steps.jit_train_step`)."""
    from t2t.trainer import steps

    params, opt_state = abstract_state(model, tx, partitioner)
    batch = _abstract_batch(partitioner, shapes)
    jitted = steps.jit_train_step(
        steps.make_train_step(
            model, tx, num_microbatches=num_microbatches, grad_shardings=steps.shardings_of(params)
        ),
        partitioner,
        params,
        opt_state,
        batch,
    )
    key = jax.eval_shape(lambda: jax.random.PRNGKey(0))
    rng = jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=partitioner.replicated)
    step = jax.ShapeDtypeStruct((), jnp.int32, sharding=partitioner.replicated)

    def trace():
        with partitioner.context():
            return jitted.trace(params, opt_state, batch, rng, step)

    return _lower_and_compile("train step", trace, progress)


def compile_decode(
    model: models.BaseModel,
    partitioner: Partitioner,
    shapes: Mapping[str, tuple[int, ...]],
    max_decode_length: int,
    *,
    progress: bool = True,
) -> Compiled:
    """Greedy decoding of one batch of these input shapes (`predict_batch`, cache included),
    compiled for the partitioner's devices with the parameters in their training shards."""
    config = model.config
    _, params = partitioner.abstract_model(lambda: t2t_nn.build(config, nnx.Rngs(params=0)))
    batch = _abstract_batch(partitioner, shapes)
    shardings = jax.tree.map(lambda x: x.sharding, params)

    def predict(params, batch):
        return model.predict_batch(
            params, batch, method="greedy", max_decode_length=max_decode_length
        )

    jitted = jax.jit(
        predict,
        in_shardings=(shardings, partitioner.batch_shardings(batch)),
        out_shardings=partitioner.replicated,
    )

    def trace():
        with partitioner.context():
            return jitted.trace(params, batch)

    return _lower_and_compile("decoding", trace, progress)
