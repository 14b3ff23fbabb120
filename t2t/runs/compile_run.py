"""`t2t compile`: the configured training run's programs compiled ahead of time (`t2t.aot`) for
a TPU slice or CPU devices, read from the bindings `t2t train` would run with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import gin

from t2t import files
from t2t.runs.helpers import resolve_model_config
from t2t.runs.train_run import train
from t2t.trainer.options import DataOptions, LoopOptions

# The arguments of `train`, and the fields of its option groups, that decide its programs.
_TRAIN_PROGRAM_ARGS = (
    "model_config",
    "init_checkpoint",
    "mesh_shape",
    "sharding_mode",
    "model_fn",
    "optimizer",
    "learning_rate",
)
_GROUP_PROGRAM_FIELDS = (
    (DataOptions, ("batch_size", "task_feature_lengths", "pack")),
    (LoopOptions, ("num_microbatches",)),
)


def _train_bindings() -> dict[str, Any]:
    """The program-deciding options `train` would run with under the current gin
    configuration (its bindings over its defaults)."""
    import dataclasses
    import inspect

    defaults = {name: p.default for name, p in inspect.signature(train).parameters.items()}
    bound = gin.get_bindings("t2t.runs.train")
    run = {name: bound.get(name, defaults[name]) for name in _TRAIN_PROGRAM_ARGS}
    for group, names in _GROUP_PROGRAM_FIELDS:
        fields = {f.name: f for f in dataclasses.fields(group)}
        bound = gin.get_bindings(f"t2t.runs.{group.__name__}")
        for name in names:
            field = fields[name]
            default = (
                field.default_factory() if field.default is dataclasses.MISSING else field.default
            )
            run[name] = bound.get(name, default)
    return run


@gin.configurable(module="t2t.runs")
def compile_train(
    topology: str | None = None,
    *,
    cpu_devices: int | None = None,
    device_memory_gib: float | None = None,
    batch_size: int | None = None,
    mesh_shape: Sequence[int] | None = None,
    sharding_mode: str | None = None,
    num_microbatches: int | None = None,
    remat_policy: str | None = None,
    scan_layers: bool | None = None,
    unroll_layers: bool | None = None,
    attention_impl: str | None = None,
    decode: bool = True,
    output_json: str | None = None,
    progress: bool = True,
):
    """Compiles the configured training run's programs ahead of time and reports their costs.

    The run is what `t2t train` would run under the same gin files (`t2t.runs.train`'s network,
    mesh, sharding mode, microbatches and optimizer; `t2t.runs.DataOptions`' batch, lengths and
    packing); the arguments here
    override those. Nothing is allocated or executed, and no data is read.

    Args:
      topology: a Cloud TPU slice as libtpu names it, e.g. "v5e:4x4", "v5p:4x4x4" (needs the
        `tpu` extra); or
      cpu_devices: compile for this many CPU devices of this process instead.
      device_memory_gib: the memory per CPU device to check against (TPU: the chip's own).
      batch_size, mesh_shape, sharding_mode, num_microbatches: override the run's.
      remat_policy, scan_layers, unroll_layers, attention_impl: override the network's
        (`TransformerConfig`).
      decode: also compile greedy decoding of one batch.
      output_json: write the report there as JSON.
      progress: show the elapsed time while compiling.

    Returns:
      The `t2t.aot.Report`.
    """
    from t2t import aot

    _check_one_target(topology, cpu_devices)
    run = _train_bindings()
    given = dict(
        batch_size=batch_size,
        mesh_shape=mesh_shape,
        sharding_mode=sharding_mode,
        num_microbatches=num_microbatches,
    )
    run.update({name: value for name, value in given.items() if value is not None})
    if not run["task_feature_lengths"]:
        raise ValueError(
            "The run binds no task_feature_lengths; include the gin file of a run "
            "(gin/runs/pretrain.gin and an objective) or bind it."
        )
    network = dict(
        remat_policy=remat_policy,
        scan_layers=scan_layers,
        unroll_layers=unroll_layers,
        attention_impl=attention_impl,
    )
    config = resolve_model_config(run["model_config"], run["init_checkpoint"]).replace(
        **{name: value for name, value in network.items() if value is not None}
    )
    report = aot.compile_run(
        _run_shape(run, config),
        _target(topology, cpu_devices, device_memory_gib),
        model=run["model_fn"](config),
        tx=run["optimizer"](learning_rate=run["learning_rate"]),
        decode=decode,
        progress=progress,
    )
    print(aot.format_report(report), flush=True)
    if output_json:
        files.write_text(output_json, json.dumps(report.to_json(), indent=2))
        print(f"wrote {output_json}")
    return report


def _check_one_target(topology: str | None, cpu_devices: int | None) -> None:
    if (topology is None) == (cpu_devices is None):
        raise ValueError(
            "Give exactly one target: --topology=v5e:4x4 (a TPU slice) or --cpu_devices=N."
        )


def _target(topology: str | None, cpu_devices: int | None, device_memory_gib: float | None):
    """The `t2t.aot` target: a TPU slice or GPU topology by name, or `cpu_devices` CPUs."""
    from t2t import aot

    if topology is None:
        return aot.cpu_target(cpu_devices, device_memory_gib)
    if aot.targets.is_gpu_topology(topology):
        return aot.gpu_target(topology)
    return aot.tpu_target(topology)


def _run_shape(run: dict[str, Any], config):
    """The `t2t.aot.RunShape` of the run's bindings (with the overrides) and network."""
    from t2t import aot

    return aot.RunShape(
        config,
        run["batch_size"],
        dict(run["task_feature_lengths"]),
        mesh_shape=tuple(run["mesh_shape"]),
        sharding_mode=run["sharding_mode"],
        num_microbatches=run["num_microbatches"],
        pack=run["pack"],
    )
