"""The H100 rates `t2t compile --topology=h100` estimates with are the ones the GPU benchmark
measured and committed (`benchmarks/results/gpu_train_step*.json`)."""

import importlib.util
import os

import pytest

from t2t.aot import targets

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "gpu_deviceless", os.path.join(REPO, "benchmarks", "gpu_deviceless.py")
)
gpu_deviceless = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_deviceless)


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
