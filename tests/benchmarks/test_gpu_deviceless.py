"""The H100 rates `t2t compile --topology=h100` estimates with: how they are derived from the
GPU benchmark's results, and that the library's constants are the committed results'
(`benchmarks/results/gpu_train_step*.json`; a rerun of the benchmark must update both)."""

import importlib.util
import json
import os

import pytest

from t2t.aot import targets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "gpu_deviceless", os.path.join(REPO, "benchmarks", "gpu_deviceless.py")
)
gpu_deviceless = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_deviceless)


def test_the_attention_rate_is_the_sites_flops_over_their_cudnn_time(tmp_path, monkeypatch):
    """Matmul and copy rates come as measured; attention's, when the matmul job did not
    measure it, is T5.1.1-base's encoder and cross-attention FLOPs (forward + backward, 14 B N
    H S_q S_k each: 512 x 512 and 114 x 512) over their two cuDNN times, computed here by hand."""
    (tmp_path / "gpu_train_step.json").write_text(
        json.dumps({"results": [{"measured_rates": {"matmul_flops_per_second": 6e14}}]})
    )
    sites = {
        "encoder self-attention": {"cudnn": {"ms": 2.0}},
        "cross-attention": {"cudnn": {"ms": 1.0}},
    }
    (tmp_path / "gpu_train_step_check_sites.json").write_text(
        json.dumps({"results": [{"side": "sites", "batch": 4, "sites": sites}]})
    )
    monkeypatch.setattr(gpu_deviceless, "RESULTS", str(tmp_path))
    rates = gpu_deviceless.committed_rates()
    by_hand = 14 * 4 * 12 * 64 * 512 * (512 + 114) / 3e-3
    assert rates["matmul_flops_per_second"] == 6e14
    assert rates["attention_flops_per_second"] == pytest.approx(by_hand, rel=1e-12)
    monkeypatch.setattr(gpu_deviceless, "RESULTS", str(tmp_path / "none"))
    assert gpu_deviceless.committed_rates() is None


def test_the_h100_rates_are_the_committed_measurements():
    committed = gpu_deviceless.committed_rates()
    rates = targets._MEASURED["h100"]
    assert rates.matmul_flops_per_second == pytest.approx(
        committed["matmul_flops_per_second"], rel=1e-3
    )
    assert rates.bytes_per_second == pytest.approx(committed["bytes_per_second"], rel=1e-3)
    assert rates.attention_flops_per_second == pytest.approx(
        committed["attention_flops_per_second"], rel=1e-3
    )


def test_the_h100_least_kernel_time_is_the_committed_traces():
    """`kernel_seconds`: the median duration of the committed H100 trace's non-matmul kernels
    under 1 MB (`gpu_profile.least_kernel_seconds`)."""
    import gzip

    spec = importlib.util.spec_from_file_location(
        "gpu_profile", os.path.join(REPO, "benchmarks", "gpu_profile.py")
    )
    gpu_profile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_profile)
    directory = os.path.join(REPO, "benchmarks", "results", "gpu_h100")
    with gzip.open(os.path.join(directory, "hlo_t5_1_1_base_128.txt.gz"), "rt") as f:
        text = f.read()
    trace = os.path.join(directory, "trace_t5_1_1_base_128.trace.json.gz")
    found = gpu_profile.least_kernel_seconds(trace, text)
    assert found["unmatched"] == 0 and found["kernels"] > 3 * 2000  # 3 steps traced
    assert targets.gpu_rates("h100").kernel_seconds == pytest.approx(found["seconds"], rel=0.01)
