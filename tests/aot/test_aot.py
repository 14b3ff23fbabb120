"""`t2t compile` and its parts: the collective census and out-of-memory parsing on known HLO
and compiler messages, matmul FLOPs counted through scans and remat, and the command itself on
fake CPU devices (fits; does not fit, with advice; JSON). A tiny model compiled for a TPU
topology runs only when libtpu is installed."""

import importlib.util
import json
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from t2t import cli
from t2t import nn as tn
from t2t.aot import analysis, flops, targets

HLO = """
ENTRY %main {
  %all-reduce.1 = f32[8,128]{1,0} all-reduce(f32[8,128]{1,0} %x), channel_id=1, to_apply=%add
  %all-gather-start.2 = (bf16[2,64]{1,0}, bf16[8,64]{1,0}) all-gather-start(bf16[2,64]{1,0} %y)
  %all-gather-done.2 = bf16[8,64]{1,0} all-gather-done(%all-gather-start.2)
  %reduce-scatter.3 = f32[4,32]{1,0} reduce-scatter(f32[16,32]{1,0} %z), dimensions={0}
  %all-to-all.4 = (f32[1,8]{1,0}, f32[1,8]{1,0}) all-to-all(%a, %b), dimensions={0}
  %fusion.5 = f32[8,128]{1,0} fusion(%all-reduce.1), kind=kLoop, calls=%fused
  %all-reduce.6 = (bf16[1,512]{1,0:T(8,128)(2,1)S(1)}, bf16[2,256]{1,0:T(8,128)(2,1)}, /*index=2*/f32[4]{0:T(256)}) all-reduce(%a, %b, %c), channel_id=7, replica_groups=mesh['axis_0'=4] {'axis_0'}, to_apply=%add
  ROOT %collective-permute-start.8 = (f32[16]{0}, f32[16]{0}, u32[], u32[]) collective-permute-start(%d), channel_id=8
}
"""


def test_collective_census_counts_results_once():
    census = analysis.collective_census(HLO)
    # One plain all-reduce, and one combined over a tuple written with layouts and comments.
    assert census["all-reduce"] == {"count": 2, "bytes": 8 * 128 * 4 + 2 * 512 * 2 + 4 * 4}
    assert census["all-gather"] == {"count": 1, "bytes": 8 * 64 * 2}  # the start, its result
    assert census["reduce-scatter"] == {"count": 1, "bytes": 4 * 32 * 4}
    assert census["all-to-all"] == {"count": 1, "bytes": 2 * 8 * 4}
    assert census["collective-permute"] == {"count": 1, "bytes": 16 * 4}


def test_out_of_memory_messages_of_libtpu_parse():
    # The two forms libtpu's compiler reports (seen compiling for v5e and v4 topologies).
    first = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO "
        "temporaries (251.48G) exceeds available HBM (15.75G)."
    )
    second = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory "
        "space hbm. Used 40.12G of 15.75G hbm. Exceeded hbm capacity by 24.37G."
    )
    gib = 2**30
    assert analysis.parse_out_of_memory(first) == (int(251.48 * gib), int(15.75 * gib))
    assert analysis.parse_out_of_memory(second) == (int(40.12 * gib), int(15.75 * gib))
    assert analysis.is_out_of_memory(first) and analysis.parse_out_of_memory("other") is None


def test_matmul_flops_count_scan_trips_and_remat_recompute():
    w = jnp.ones((3, 16, 32))  # three layers of [16, 32] (then [32, 16] below)
    v = jnp.ones((3, 32, 16))

    def forward(x, remat):
        def layer(h, ws):
            return jnp.tanh(jnp.tanh(h @ ws[0]) @ ws[1]), None

        body = jax.checkpoint(layer) if remat else layer
        return jax.lax.scan(body, x, (w, v))[0].sum()

    x = jnp.ones((4, 16))
    one_layer = 2 * (2 * 4 * 16 * 32)  # two matmuls of 4x16x32 (and 4x32x16)
    assert flops.matmul_flops(jax.make_jaxpr(lambda x: forward(x, False))(x)) == 3 * one_layer
    # The gradient w.r.t. x (the weights are constants): one backward matmul per forward one.
    backward = jax.make_jaxpr(jax.grad(lambda x: forward(x, False)))(x)
    assert flops.matmul_flops(backward) == 3 * one_layer * 2
    remat = jax.make_jaxpr(jax.grad(lambda x: forward(x, True)))(x)
    assert flops.matmul_flops(remat) == 3 * one_layer * 3  # the forward pass once more


def test_matmul_flops_count_a_shard_map_body_once_per_device():
    """A `shard_map` body holds one device's shapes: its FLOPs count once per device, so a
    product split over a mesh counts what it counts unsplit."""
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()[:4]
    if len(devices) < 4:
        pytest.skip("needs 4 devices")
    mesh = jax.sharding.Mesh(np.array(devices).reshape(2, 2), ("a", "b"))
    x = jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P("a", "b")))
    split = jax.shard_map(
        lambda x: x @ jnp.ones((x.shape[1], 32)),
        mesh=mesh,
        in_specs=P("a", "b"),
        out_specs=P("a", "b"),
    )
    # Each of the 4 devices multiplies its [4, 8] block by [8, 32]: 2 * 4 * 8 * 32 each.
    assert flops.matmul_flops(jax.make_jaxpr(split)(x)) == 4 * 2 * 4 * 8 * 32


def test_matmul_flops_count_cudnn_fused_attention(monkeypatch):
    """cuDNN's attention is one primitive with no dot_general inside: traced (no GPU needed once
    JAX's cuDNN checks are answered), its forward counts q k and p v, its backward five products."""
    fused = pytest.importorskip("jax._src.cudnn.fused_attention_stablehlo")
    monkeypatch.setattr(fused, "check_cudnn_version", lambda: 91000)
    monkeypatch.setattr(fused, "check_compute_capability", lambda *a, **k: True, raising=False)
    b, n, length, h = 2, 4, 128, 64
    q = jnp.ones((b, length, n, h), jnp.bfloat16)
    bias = jnp.ones((1, n, length, length), jnp.bfloat16)

    def loss(q, bias, causal=False):
        out = jax.nn.dot_product_attention(
            q, q, q, bias=bias, is_causal=causal, implementation="cudnn"
        )
        return out.astype(jnp.float32).sum()

    unit = b * n * length * length * h
    assert flops.matmul_flops(jax.make_jaxpr(loss)(q, bias)) == 4 * unit
    assert flops.matmul_flops(jax.make_jaxpr(jax.grad(loss))(q, bias)) == 14 * unit
    causal = jax.make_jaxpr(jax.grad(lambda q, bias: loss(q, bias, True)))(q, bias)
    assert flops.matmul_flops(causal) == 7 * unit
    # The fused attention's share, alone: none of the projections around it.
    w = jnp.ones((h, h), jnp.bfloat16)
    projected = jax.make_jaxpr(jax.grad(lambda q, bias: loss(q @ w, bias)))(q, bias)
    assert flops.fused_attention_flops(projected) == 14 * unit
    assert flops.matmul_flops(projected) == 14 * unit + 2 * (2 * b * length * n * h * h)


def test_topology_names_are_checked():
    assert targets.parse_topology("v5p:4x4x4") == ("v5p", (4, 4, 4))
    with pytest.raises(ValueError, match="v3:16x32"):
        targets.parse_topology("v5litepod-16")
    with pytest.raises(ValueError, match="GENERATION"):
        targets.parse_topology("v9:2x2")


def test_a_slice_shape_libtpu_has_none_of_is_a_message(monkeypatch):
    import types

    from jax.experimental import topologies

    from t2t.errors import UserError

    def no_such_slice(**kwargs):  # what libtpu answers for v5e:3x3
        raise jax.errors.JaxRuntimeError(
            'INVALID_ARGUMENT: Topology layout "v5e:3x3" is not divisible by the given (or '
            'default) chips_per_host_bounds "2x2x1"'
        )

    monkeypatch.setitem(sys.modules, "libtpu", types.ModuleType("libtpu"))
    monkeypatch.setattr(topologies, "get_topology_desc", no_such_slice)
    with pytest.raises(UserError, match="libtpu has no TPU slice 'v5e:3x3': INVALID_ARGUMENT"):
        targets.tpu_target("v5e:3x3")


@pytest.mark.parametrize(
    "name, gpu", [("h100", True), ("h200:8", True), ("H100:4x8", True), ("v5e:4x4", False)]
)
def test_gpu_topologies_are_told_from_tpu_slices(name, gpu):
    assert targets.is_gpu_topology(name) is gpu


def test_a_gpu_target_says_what_is_missing(monkeypatch):
    with pytest.raises(ValueError, match="h100:8 \\(one host of 8\\)"):
        targets.gpu_target("a100:8")
    # Without JAX's CUDA plugin (as in CI), the message says how to install it.
    monkeypatch.setattr(targets, "has_cuda_plugin", lambda: False)
    with pytest.raises(ValueError, match=re.escape("pip install -e '.[cuda]'")):
        targets.gpu_target("h100:8")


def test_a_gpu_compile_keeps_other_xla_flags_and_turns_off_triton_gemms(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    monkeypatch.delenv("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", raising=False)
    targets.prepare_gpu_compile()
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_enable_triton_gemm=false"
    assert os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] == "1"


RUN_GIN = """
include 'models/tiny.gin'
include 'runs/pretrain.gin'
MIXTURE_OR_TASK = "not_read"
TASK_FEATURE_LENGTHS = {"inputs": 32, "targets": 8}
BATCH_SIZE = 16
t2t.nn.get_preset.vocab_size = 512
"""


@pytest.fixture
def run_gin(tmp_path):
    path = tmp_path / "run.gin"
    path.write_text(RUN_GIN)
    return str(path)


def compile_cli(run_gin, *flags):
    return cli.main(["compile", f"--gin_file={run_gin}", "--cpu_devices=8", *flags])


def test_compile_reports_a_run_that_fits(run_gin, tmp_path, capsys):
    out = tmp_path / "report.json"
    assert (
        compile_cli(
            run_gin,
            "--mesh_shape=2,4",
            "--sharding_mode=fsdp",
            "--device_memory_gib=4",
            f"--output_json={out}",
        )
        == 0
    )
    printed = capsys.readouterr().out
    assert "verdict: fits" in printed and "collectives:" in printed
    assert "compute float32, parameters float32" in printed
    assert "attention (auto on cpu): encoder self-attention xla" in printed
    report = json.loads(out.read_text())
    assert report["fits"] is True
    assert report["run"]["mesh"] == {"data": 2, "model": 4}
    assert report["run"]["batch_size"] == 16 and report["run"]["model"]["vocab_size"] == 512
    train = report["train_step"]
    # No recomputation: the program's matmuls are exactly the model's FLOPs.
    # The program's matmuls are the model's, plus the relative-bias table's gradient as a
    # one-hot matmul ([N, L*S] @ [L*S, 32], about 1e-4 of the step here).
    assert train["flops_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert train["flops_ratio"] >= 1.0
    assert train["memory"]["total"] <= 4 * 2**30 and train["collectives"]["all-gather"]["count"]
    assert report["decode"]["fits"] is True


def test_full_remat_costs_a_third_more_flops_under_scan(run_gin, tmp_path):
    out = tmp_path / "report.json"
    assert (
        compile_cli(
            run_gin, "--scan_layers", "--remat_policy=full", "--no_decode", f"--output_json={out}"
        )
        == 0
    )
    report = json.loads(out.read_text())
    assert report["run"]["scan_layers"] is True and report["decode"] is None
    # The layers' forward pass runs twice; the logits and loss once: a bit under 4/3.
    assert 1.15 < report["train_step"]["flops_ratio"] < 4 / 3


def test_compile_says_what_would_make_a_step_fit(run_gin, tmp_path, capsys):
    out = tmp_path / "report.json"
    flags = (
        "--mesh_shape=8,1",
        "--sharding_mode=tensor_parallel",
        "--no_decode",
        f"--output_json={out}",
    )
    assert compile_cli(run_gin, *flags) == 0  # no limit: measure the step first
    train = json.loads(out.read_text())["train_step"]
    state = sum(train["state_bytes"].values())
    # Room for the parameters and optimizer state, and 60% of the rest: two microbatches fit.
    limit = (state + 0.6 * (train["memory"]["total"] - state)) / 2**30
    capsys.readouterr()
    assert compile_cli(run_gin, *flags, f"--device_memory_gib={limit}") == 1
    printed = capsys.readouterr().out
    assert "verdict: DOES NOT FIT" in printed
    assert "remat_policy='full'" in printed and "num_microbatches=" in printed
    assert "sharding_mode='fsdp'" in printed and "mesh_shape=(-1, 2)" in printed
    assert json.loads(out.read_text())["fits"] is False


def test_compile_refuses_bad_targets(run_gin, capsys):
    assert cli.main(["compile", f"--gin_file={run_gin}", "--topology=v5litepod-16"]) == 2
    assert "Unknown TPU topology" in capsys.readouterr().err
    assert compile_cli(run_gin, "--batch_size=12") == 2  # 12 rows on a data axis of 8
    assert "multiple of 8" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is not None, reason="libtpu installed")
def test_compile_for_tpu_says_how_to_get_libtpu(run_gin, capsys):
    assert cli.main(["compile", f"--gin_file={run_gin}", "--topology=v5e:2x2"]) == 2
    assert "pip install -e '.[tpu]'" in capsys.readouterr().err


@pytest.mark.skipif(targets.has_cuda_plugin(), reason="JAX's CUDA plugin is installed")
def test_compile_for_gpus_says_how_to_get_the_cuda_plugin(run_gin, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", os.environ.get("XLA_FLAGS", ""))  # restored afterwards
    assert cli.main(["compile", f"--gin_file={run_gin}", "--topology=h100:8"]) == 2
    assert "pip install -e '.[cuda]'" in capsys.readouterr().err


@pytest.mark.skipif(
    not targets.has_cuda_plugin(), reason="needs JAX's CUDA plugin: pip install -e '.[cuda]'"
)
def test_tiny_run_compiles_for_two_described_gpus(tmp_path):
    # A process of its own: the plugin must start without looking for a driver.
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "t2t.cli", "compile", "--topology=h100:2", "--mesh_shape=2,1"]
    command += ["--gin_file=gin/experiments/tiny_builtin_demo.gin", "--no_decode"]
    done = subprocess.run([*command, f"--output_json={out}"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert (report["target"]["platform"], report["target"]["devices"]) == ("gpu", 2)
    assert report["train_step"]["cost_model"]["rates"]["attention_flops_per_second"] > 0


@pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="needs libtpu: pip install -e '.[tpu]'"
)
def test_tiny_model_compiles_for_a_tpu_topology():
    from t2t import aot

    shape = aot.RunShape(
        tn.get_preset("tiny", dtype="bfloat16", scan_layers=True),
        64,
        {"inputs": 128, "targets": 32},
        mesh_shape=(-1, 2),
        sharding_mode="fsdp",
    )
    report = aot.compile_run(shape, aot.tpu_target("v5e:2x2"), progress=False)
    assert report.fits is True
    assert report.target["devices"] == 4 and report.target["device_memory_bytes"] > 15 * 2**30
    assert report.train_step["flops_ratio"] == pytest.approx(1.0, abs=1e-3)  # + the one-hot
    estimate = report.train_step["cost_model"]
    assert estimate["step_seconds"] >= estimate["matmul_seconds"] > 0
    assert estimate["hbm_bytes"] > 0 and 0 < estimate["mfu"] < 1
    assert set(report.run["attention"].values()) == {"xla"}


def test_the_compile_flag_offers_every_attention_implementation():
    import argparse

    from t2t.cli import run_commands
    from t2t.nn.config import ATTENTION_IMPLS

    parser = argparse.ArgumentParser()
    run_commands.add_compile(parser.add_subparsers())
    compile_parser = parser._subparsers._group_actions[0].choices["compile"]
    flag = next(a for a in compile_parser._actions if a.dest == "attention_impl")
    assert tuple(flag.choices) == ATTENTION_IMPLS
