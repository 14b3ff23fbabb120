"""`t2t compile`: a run's train step (and decoding) compiled for a target, and what it costs.

`compile_run` takes what a training run is made of (the network, the batch, the mesh and sharding
mode, microbatches, the optimizer) and a `Target`, compiles the real programs on abstract inputs,
and returns a `Report`: memory per device against the device's capacity, compile time, compiled
FLOPs against the model's exact FLOPs (`t2t.nn.flops`), the collectives, the compute dtype and
the attention implementation each site runs, an estimate of the step's time from its matmul FLOPs
and memory traffic (`t2t.aot.cost_model`) with what bounds it and its largest memory-bound
operations, and, when the step does not fit, which settings would make it fit.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np
import optax

from t2t import models
from t2t.aot import analysis, cost_model, programs
from t2t.aot.targets import GIB, Target
from t2t.nn import attention_ops
from t2t.nn import flops as nn_flops
from t2t.nn.config import TransformerConfig
from t2t.partitioning import Partitioner, make_partitioner

# Fraction of a device's memory a plan should leave free (fragmentation, the input pipeline's
# buffers, compiler estimates); advice aims below 1 - this.
HEADROOM = 0.1


@dataclasses.dataclass(frozen=True)
class RunShape:
    """The parts of a training run that decide its programs.

    Attributes:
      config: the network.
      batch_size: global rows per step.
      task_feature_lengths: e.g. {"inputs": 512, "targets": 114}.
      mesh_shape: (data, model), one may be -1.
      sharding_mode: "data_parallel", "tensor_parallel" or "fsdp".
      num_microbatches: gradient-accumulation microbatches per step.
      pack: packed rows (training) or one example per row.
    """

    config: TransformerConfig
    batch_size: int
    task_feature_lengths: Mapping[str, int]
    mesh_shape: tuple[int, int] = (-1, 1)
    sharding_mode: str = "tensor_parallel"
    num_microbatches: int = 1
    pack: bool = True

    def lengths(self) -> tuple[int, int]:
        """(input length, target length) for the FLOP count."""
        lengths = self.task_feature_lengths
        return int(lengths.get("inputs", 0)), int(lengths["targets"])


@dataclasses.dataclass
class Report:
    """What `compile_run` found; `to_json()` gives it as plain data."""

    target: dict[str, Any]
    run: dict[str, Any]
    train_step: dict[str, Any]
    decode: dict[str, Any] | None = None
    advice: list[str] = dataclasses.field(default_factory=list)

    @property
    def fits(self) -> bool | None:
        """Whether the train step (and decoding, if compiled) fit; None when capacity is unknown."""
        verdicts = [self.train_step.get("fits")]
        if self.decode is not None:
            verdicts.append(self.decode.get("fits"))
        if any(v is False for v in verdicts):
            return False
        return None if any(v is None for v in verdicts) else True

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "fits": self.fits}


def _state_bytes_per_device(tree: Any) -> int:
    """Bytes of one device's shards of a tree of sharded shapes."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shard = leaf.sharding.shard_shape(leaf.shape)
        total += int(np.prod(shard, dtype=np.int64)) * leaf.dtype.itemsize
    return total


def _summary(config: TransformerConfig, params: Any) -> dict[str, Any]:
    count = sum(int(np.prod(x.shape, dtype=np.int64)) for x in jax.tree.leaves(params))
    return {**dataclasses.asdict(config), "parameters": count}


def _memory_entry(memory: analysis.Memory, capacity: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"memory": dataclasses.asdict(memory) | {"total": memory.total}}
    entry["fits"] = None if capacity is None else memory.total <= capacity
    if capacity is not None:
        entry["memory_fraction"] = memory.total / capacity
    return entry


def _program_entry(result: programs.Compiled, capacity: int | None) -> dict[str, Any]:
    compiled = result.compiled
    entry = _memory_entry(analysis.Memory.of(compiled), capacity)
    text = compiled.as_text()
    entry["hlo_text"] = text  # read by the cost model, dropped from the report
    xla = analysis.costs(compiled)
    # XLA's own counts (all operations, a loop body counted once), for reference.
    entry["xla_flops"] = xla["flops"]
    entry["xla_bytes_accessed"] = xla["bytes_accessed"]
    entry["program_flops"] = result.matmul_flops
    entry["program_attention_flops"] = result.attention_flops
    entry["collectives"] = analysis.collective_census(text)
    entry["lower_seconds"] = result.lower_seconds
    entry["compile_seconds"] = result.compile_seconds
    return entry


def _failed_entry(error: Exception, capacity: int | None, seconds: float) -> dict[str, Any]:
    message = str(error)
    parsed = analysis.parse_out_of_memory(message)
    entry: dict[str, Any] = {
        "fits": False,
        "compile_seconds": seconds,
        "error": message.strip().splitlines()[0][:500],
    }
    if parsed is not None:
        required, available = parsed
        entry["memory"] = {"total": required}
        entry["memory_fraction"] = required / available
        entry["capacity"] = available
    elif capacity is not None:
        entry["capacity"] = capacity
    return entry


def _compile_or_oom(compile_fn, capacity: int | None) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        result = compile_fn()
    except Exception as error:  # noqa: BLE001 (only the compiler's out-of-memory is reported)
        if not analysis.is_out_of_memory(str(error)):
            raise
        return _failed_entry(error, capacity, time.perf_counter() - start)
    return _program_entry(result, capacity)


def compile_run(
    shape: RunShape,
    target: Target,
    *,
    model: models.BaseModel | None = None,
    tx: optax.GradientTransformation | None = None,
    decode: bool = True,
    progress: bool = True,
) -> Report:
    """Compiles the run's train step (and greedy decoding) for `target` and reports the costs.

    Args:
      shape: the run.
      target: the devices (`tpu_target`, `cpu_target`).
      model: the model wrapper (default `models.model_for(shape.config)`).
      tx: the optimizer (default T5's Adafactor).
      decode: also compile greedy decoding of one batch of unpacked inputs.
      progress: show the elapsed time while compiling.

    Returns:
      The report; `report.fits` says whether the programs fit the target's memory.

    Raises:
      ValueError: when the mesh does not fit the target's devices, or the batch the mesh.
    """
    from t2t import optim

    config = shape.config
    model = model or models.model_for(config)
    tx = tx or optim.adafactor(optim.inverse_sqrt())
    partitioner = make_partitioner(
        *shape.mesh_shape, mode=shape.sharding_mode, devices=target.devices
    )
    _check_batch(shape, partitioner)
    capacity = target.chip.memory_bytes if target.chip else None
    params, opt_state = programs.abstract_state(model, tx, partitioner)
    batch = programs.batch_shapes(
        model, shape.task_feature_lengths, shape.batch_size, pack=shape.pack
    )
    train = _compile_or_oom(
        lambda: programs.compile_train_step(
            model,
            tx,
            partitioner,
            batch,
            num_microbatches=shape.num_microbatches,
            progress=progress,
        ),
        capacity,
    )
    input_length, target_length = shape.lengths()
    model_flops = (
        nn_flops.training_flops(config, input_length, target_length)
        * shape.batch_size
        / target.num_devices
    )
    train["model_flops"] = model_flops
    train["state_bytes"] = {
        "params": _state_bytes_per_device(params),
        "optimizer": _state_bytes_per_device(opt_state),
    }
    hlo_text = train.pop("hlo_text", None)
    if "program_flops" in train:
        _add_program_costs(train, hlo_text, target, model_flops)
    decoded = None
    if decode:
        decoded = _compile_or_oom(
            lambda: programs.compile_decode(
                model, partitioner, _decode_shapes(config, shape), target_length, progress=progress
            ),
            capacity,
        )
        decoded.pop("hlo_text", None)
    report = Report(
        target=_target_entry(target),
        run={**_run_entry(shape, partitioner), "model": _summary(config, params)},
        train_step=train,
        decode=decoded,
    )
    report.advice = advise(report, shape, partitioner)
    return report


def _add_program_costs(train: dict, hlo_text: str | None, target: Target, model_flops) -> None:
    """The compiled step's FLOPs per device beside the model's, and on a known chip the cost
    model's step time and MFU from the program's text."""
    train["flops"] = train["program_flops"] / target.num_devices
    train["flops_ratio"] = train["flops"] / model_flops
    if hlo_text is not None and target.chip and target.chip.peak_flops:
        rates = target.chip.rates or cost_model.Rates(
            target.chip.peak_flops, target.chip.memory_bandwidth
        )
        attention_flops = train.get("program_attention_flops", 0) / target.num_devices
        estimate = cost_model.estimate(
            hlo_text, train["flops"], rates, attention_flops=attention_flops
        )
        estimate["mfu"] = model_flops / (estimate["step_seconds"] * target.chip.peak_flops)
        train["cost_model"] = estimate


def _check_batch(shape: RunShape, partitioner: Partitioner) -> None:
    data = partitioner.mesh.shape["data"]
    rows = shape.batch_size // shape.num_microbatches
    if shape.batch_size % shape.num_microbatches or rows % data:
        raise ValueError(
            f"batch_size={shape.batch_size} in {shape.num_microbatches} microbatches gives "
            f"{shape.batch_size / shape.num_microbatches:g} rows per microbatch, which the data "
            f"axis ({data}) must divide. Choose a batch size that is a multiple of "
            f"{shape.num_microbatches * data}."
        )


def _site_lengths(shape: RunShape) -> tuple[int, int]:
    inputs, targets = shape.lengths()
    return inputs, targets


def _decode_shapes(config: TransformerConfig, shape: RunShape) -> dict[str, tuple[int, int]]:
    """One decoding batch: unpacked inputs (encoder-decoder) or prompts (decoder-only)."""
    input_length, target_length = shape.lengths()
    if config.is_decoder_only:
        width = input_length + target_length
        return {
            "decoder_input_tokens": (shape.batch_size, width),
            "decoder_causal_attention": (shape.batch_size, width),
        }
    return {"encoder_input_tokens": (shape.batch_size, input_length)}


def _target_entry(target: Target) -> dict[str, Any]:
    chip = target.chip
    return {
        "name": target.name,
        "platform": target.platform,
        "devices": target.num_devices,
        "chips": target.num_chips,
        "hosts": target.num_devices // target.devices_per_host,
        "device_memory_bytes": chip.memory_bytes if chip else None,
        "peak_flops_per_device": chip.peak_flops if chip and chip.peak_flops else None,
        "memory_bandwidth_per_device": (
            chip.memory_bandwidth if chip and chip.memory_bandwidth else None
        ),
    }


def _run_entry(shape: RunShape, partitioner: Partitioner) -> dict[str, Any]:
    return {
        "batch_size": shape.batch_size,
        "task_feature_lengths": dict(shape.task_feature_lengths),
        "mesh": {"data": partitioner.mesh.shape["data"], "model": partitioner.mesh.shape["model"]},
        "sharding_mode": shape.sharding_mode,
        "num_microbatches": shape.num_microbatches,
        "remat_policy": shape.config.remat_policy,
        "scan_layers": shape.config.scan_layers,
        "unroll_layers": shape.config.unroll_layers,
        "pack": shape.pack,
        "attention": attention_ops.describe(
            shape.config, partitioner.mesh.devices.flat[0].platform, lengths=_site_lengths(shape)
        ),
    }


# -- advice ------------------------------------------------------------------------------------


def _gib(n: float) -> str:
    if n < GIB / 10:
        return f"{n / 2**20:.1f} MiB"
    return f"{n / GIB:.2f} GiB"


def _flop(n: float) -> str:
    for unit, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if n >= scale:
            return f"{n / scale:,.2f} {unit}"
    return f"{n:,.0f} FLOP"


def advise(report: Report, shape: RunShape, partitioner: Partitioner) -> list[str]:
    """Settings that would make a step that does not fit fit (estimates; compile to confirm).

    The step's memory is split into state (parameters and optimizer statistics, known exactly
    from their shards) and the rest (activations, gradients, temporaries). Rematerialization
    and microbatches shrink the rest; FSDP and a larger model axis shrink the state (and the
    rest's weight-sized part).
    """
    train = report.train_step
    capacity = train.get("capacity") or report.target["device_memory_bytes"]
    total = (train.get("memory") or {}).get("total")
    if capacity is None or total is None or total <= capacity:
        return []
    budget = capacity * (1 - HEADROOM)
    state = sum(train["state_bytes"].values())
    rest = max(total - state, 0)
    tips = [
        f"The train step needs {_gib(total)} per device, {_gib(capacity)} is available: "
        f"{_gib(state)} parameters and optimizer state, {_gib(rest)} activations, gradients "
        "and temporaries."
    ]
    if state < budget and rest > 0:
        if shape.config.remat_policy != "full":
            tips.append(
                "remat_policy='full' (t2t.nn.get_preset.remat_policy or "
                "--remat_policy=full): the backward pass keeps only each layer's input and "
                "recomputes the rest, for about 4/3 the FLOPs; it shrinks the activations most."
            )
        k = shape.num_microbatches
        needed = k * 2 ** math.ceil(math.log2(max(rest / max(budget - state, 1), 1)))
        rows = shape.batch_size // max(needed, 1)
        if needed > k and rows >= partitioner.mesh.shape["data"]:
            tips.append(
                f"num_microbatches={needed}: activations of {shape.batch_size // needed} rows "
                f"at a time, about {_gib(state + rest * k / needed)} per device."
            )
    data, model = partitioner.mesh.shape["data"], partitioner.mesh.shape["model"]
    if shape.sharding_mode != "fsdp" and data > 1:
        tips.append(
            f"sharding_mode='fsdp': parameters and optimizer statistics split over the data "
            f"axis ({data}) as well, {_gib(state)} -> about {_gib(state / data)} per device."
        )
    tips.append(
        f"A larger model axis (mesh_shape=(-1, {model * 2})) splits heads, feed-forward units "
        "and the vocabulary over twice the devices; or more chips (a larger topology)."
    )
    return tips


# -- formatting -----------------------------------------------------------------------------------


def format_report(report: Report) -> str:
    """The report as a few readable lines."""
    t, run, train = report.target, report.run, report.train_step
    model = run["model"]
    lines = [
        f"target {t['name']}: {t['devices']} devices ({t['chips']} chips, {t['hosts']} "
        f"host{'s' if t['hosts'] > 1 else ''})"
        + (f", {_gib(t['device_memory_bytes'])} per device" if t["device_memory_bytes"] else ""),
        f"run: {model['parameters'] / 1e6:,.1f}M parameters ({model['architecture']}, compute "
        f"{model['dtype']}, parameters {model['param_dtype']}), batch {run['batch_size']} x "
        f"{run['task_feature_lengths']}, mesh "
        f"data={run['mesh']['data']} model={run['mesh']['model']} {run['sharding_mode']}, "
        f"microbatches {run['num_microbatches']}, remat {run['remat_policy']}, "
        f"scan {run['scan_layers']}"
        + (" (unrolled)" if run.get("unroll_layers") and run["scan_layers"] else ""),
        f"attention ({model['attention_impl']} on {t['platform']}): "
        + ", ".join(f"{site} {impl}" for site, impl in run["attention"].items()),
    ]
    lines += _format_program("train step", train)
    if "flops_ratio" in train:
        lines.append(
            f"  matmul FLOPs per device: program {_flop(train['flops'])}, model "
            f"{_flop(train['model_flops'])} (ratio {train['flops_ratio']:.3f})"
        )
    if train.get("cost_model"):
        lines += format_cost_model(train["cost_model"])
    if report.decode is not None:
        lines += _format_program("greedy decoding", report.decode)
    lines += [f"  - {tip}" for tip in report.advice]
    verdict = {True: "fits", False: "DOES NOT FIT", None: "no memory limit to check"}
    lines.append(f"verdict: {verdict[report.fits]}")
    return "\n".join(lines)


def format_cost_model(estimate: Mapping[str, Any], *, largest: int = 4) -> list[str]:
    """The cost model's estimate as report lines."""
    ms = 1e3
    lines = [
        f"  estimated step: {estimate['step_seconds'] * ms:.1f} ms at the chip's "
        f"{estimate['rates']['source']} rates, bound by {estimate['bound']} (matmuls "
        f"{estimate['matmul_seconds'] * ms:.1f} ms, their operands "
        f"{estimate['matmul_memory_seconds'] * ms:.1f} ms; "
        + (
            f"fused attention {estimate['attention_seconds'] * ms:.1f} ms; "
            if estimate.get("attention_seconds")
            else ""
        )
        + "other kernels "
        f"{estimate['other_seconds'] * ms:.1f} ms), MFU ~ {estimate['mfu']:.1%}",
        f"  memory traffic per step: {estimate['hbm_bytes'] / 1e9:,.1f} GB (matmul kernels "
        f"{estimate['matmul_bytes'] / 1e9:,.1f} GB, other kernels "
        f"{estimate['other_bytes'] / 1e9:,.1f} GB)",
    ]
    if estimate["largest_memory_bound"]:
        lines.append(
            "  largest memory-bound: "
            + "; ".join(
                f"{op['source']} {op['bytes'] / 1e9:,.1f} GB ({op['seconds'] * ms:.1f} ms)"
                for op in estimate["largest_memory_bound"][:largest]
            )
        )
    lines.append("  not modeled: " + "; ".join(estimate["not_modeled"]))
    return lines


def _format_program(name: str, entry: Mapping[str, Any]) -> list[str]:
    memory = entry.get("memory") or {}
    head = f"{name}: compiled in {entry['compile_seconds']:.1f} s"
    if "error" in entry:
        where = ""
        if "memory_fraction" in entry:
            where = f" ({_gib(memory['total'])} of {_gib(entry['capacity'])})"
        return [head, f"  out of memory{where}: {entry['error']}"]
    lines = [
        head,
        (
            f"  memory per device: {_gib(memory['total'])}"
            + (
                f" = {entry['memory_fraction']:.0%} of the device"
                if "memory_fraction" in entry
                else ""
            )
            + f" (arguments {_gib(memory['arguments'])}, outputs {_gib(memory['outputs'])}, of them "
            f"in place {_gib(memory['aliased'])}, temporaries {_gib(memory['temporaries'])}, code "
            f"{_gib(memory['code'])})"
        ),
    ]
    census = {k: v for k, v in entry.get("collectives", {}).items() if v["count"]}
    if census:
        lines.append(
            "  collectives: "
            + ", ".join(
                f"{k} {v['count']} ({v['bytes'] / 2**20:,.1f} MiB)" for k, v in census.items()
            )
        )
    return lines
