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
