"""The GPU benchmark's t2t side at micro scale on the CPU: it builds the step from the parts of
t2t a bare GPU machine can import, times it, and puts the cost model's prediction beside the
measured step."""

import argparse
import dataclasses
import importlib.util
import math
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "gpu_train_step_bench", os.path.join(REPO, "benchmarks", "gpu_train_step_bench.py")
)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_the_t2t_side_times_the_step_and_predicts_it(tmp_path):
    # As the parent starts a job: `smoke` comes in the job, not on the child's command line.
    job = {"kind": "t2t", "preset": "tiny", "batch": 2, "predict": True, "smoke": True}
    args = argparse.Namespace(steps=2, warmup=1, smoke=False, out=str(tmp_path / "results.json"))
    result = bench._summarize(bench.child(job, args))
    # The tiny batch of in-vocabulary ids (full-length random ids past the tiny vocabulary gave
    # a NaN loss): the model learns it.
    assert math.isfinite(result["loss"]) and 0 < result["loss"] < math.log(2048)
    # Three windows of back-to-back steps (one step each here), and the steps waited for alone.
    assert len(result["step_seconds"]) == 3 and result["median_seconds"] > 0
    assert len(result["blocked_step_seconds"]) == 2
    assert result["tokens_per_second"] == pytest.approx(2 * (32 + 8) / result["median_seconds"])
    assert set(result["attention"].values()) == {"xla"}  # the CPU runs XLA attention
    prediction = result["prediction"]["measured"]
    assert prediction["step_seconds"] > 0 and prediction["matmul_flops"] > 0
    assert prediction["error_vs_measured"] == pytest.approx(
        prediction["step_seconds"] / result["median_seconds"] - 1
    )
    assert result["measured_rates"]["bytes_per_second"] > 0


def test_the_hf_side_trains_the_same_shapes_with_the_shared_peer_setup():
    """The peer (HF T5 with `common.hf_t5_config` and `common.hf_t5_adafactor`) on the CPU, at
    the tiny shape: the job's steps run and its loss is finite."""
    result = bench.run_hf({"kind": "hf", "preset": "tiny", "batch": 2}, 1, 1, True)
    assert result["side"] == "hf" and math.isfinite(result["loss"])
    assert len(result["step_seconds"]) == 3 and len(result["blocked_step_seconds"]) == 1


@pytest.fixture
def flash_in_the_interpreter(monkeypatch):
    """The attention jobs on t2t's TPU flash kernels, in Pallas's interpreter on the CPU, at
    input lengths the kernels tile (128; the 8 targets are left to XLA)."""
    from jax.experimental.pallas import tpu as pltpu

    from t2t.nn import attention_ops

    monkeypatch.setattr(attention_ops, "current_platform", lambda: "tpu")
    monkeypatch.setattr(bench, "lengths", lambda smoke: (128, 8))
    with pltpu.force_tpu_interpret_mode():
        yield


def test_the_check_job_records_the_shipped_check(monkeypatch):
    """The job runs `attention_check.check` on the kernel's platform, unpacked and packed, and
    records each site's errors, or the mismatch that would stop a run (the check itself:
    tests/nn/test_attention_check.py)."""
    from t2t.nn import attention_check

    calls = []
    site = attention_check.Result("encoder self-attention", "cudnn", {"output": 0.004}, {})

    def check(config, platform, lengths, *, packed):
        calls.append((config.attention_impl, config.dtype, platform, lengths, packed))
        if packed:
            raise attention_check.KernelMismatch("its bias gradient is 122.0% off")
        return [site]

    monkeypatch.setattr(attention_check, "check", check)
    result = bench.run_check({"kind": "check", "preset": "tiny"}, True)
    assert calls == [("cudnn", "bfloat16", "gpu", (32, 8), p) for p in (False, True)]
    assert result["cases"]["unpacked"] == {
        "passes": True,
        "sites": {"encoder self-attention": dataclasses.asdict(site)},
    }
    assert result["cases"]["packed"] == {
        "passes": False,
        "error": "its bias gradient is 122.0% off",
    }
    assert bench._line(result).startswith("check: unpacked ok, packed {'passes': False")


def test_the_sites_job_times_every_site_and_the_kernels_errors(flash_in_the_interpreter):
    result = bench.run_sites(
        {"kind": "sites", "preset": "tiny", "batch": 2, "kernel": "flash", "repeats": 2}, True
    )
    sites = result["sites"]
    assert list(sites) == ["encoder self-attention", "decoder self-attention", "cross-attention"]
    assert set(sites["encoder self-attention"]) == {"xla", "flash", "flash_gradient_errors"}
    assert sites["cross-attention"].keys() == {"xla"}  # left to XLA: timed once
    assert all(entry["xla"]["ms"] > 0 for entry in sites.values())
    # q, k, v and the bias: flash's bfloat16 gradients near XLA's
    errors = sites["encoder self-attention"]["flash_gradient_errors"]
    assert len(errors) == 4 and max(errors) < 0.05
