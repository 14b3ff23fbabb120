"""The GPU benchmark's kernel-time breakdown sorts a profiler trace's device kernels into
matmul, fused attention and other (host events and copies left out), per step."""

import gzip
import importlib.util
import json
import os

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location(
    "gpu_profile", os.path.join(REPO, "benchmarks", "gpu_profile.py")
)
gpu_profile = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gpu_profile)


@pytest.mark.parametrize(
    "name, args, kind",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64", {}, "matmul"),
        ("nvjet_tst_256x128_64x4_1x2_h_bz_coopA_NNT", {}, "matmul"),
        ("gemm_fusion_dot_17", {"hlo_op": "gemm_fusion_dot.17"}, "matmul"),
        ("custom-call.3", {"long_name": 'custom_call_target="__cublas$lt$matmul"'}, "matmul"),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", {}, "attention"),
        ("loop_add_fusion_12", {"hlo_op": "loop_add_fusion.12"}, "other"),
        ("input_reduce_fusion_3", {"long_name": "jit(train_step)/reduce_sum"}, "other"),
        ("MemcpyDtoD", {}, "memcpy"),
    ],
)
def test_kernels_are_sorted_by_name_and_operation(name, args, kind):
    assert gpu_profile.classify(name, args) == kind


def test_a_trace_is_summed_per_step_over_device_kernels_only(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 1, "name": "PjitFunction(train_step)", "dur": 900000},
        {"ph": "X", "pid": 2, "name": "nvjet_tst_128x256", "dur": 60000},
        {"ph": "X", "pid": 2, "name": "cudnn_sdpa_flash_bprop", "dur": 8000},
        {"ph": "X", "pid": 2, "name": "loop_add_fusion_3", "dur": 30000},
        {"ph": "X", "pid": 2, "name": "loop_add_fusion_4", "dur": 10000},
        {"ph": "X", "pid": 2, "name": "MemcpyHtoD", "dur": 5000},
    ]
    directory = tmp_path / "plugins" / "profile" / "run"
    directory.mkdir(parents=True)
    with gzip.open(directory / "host.trace.json.gz", "wt") as f:
        json.dump({"traceEvents": events}, f)
    found = gpu_profile.kernel_breakdown(str(tmp_path), steps=2)
    assert found["matmul_ms"] == pytest.approx(30.0)
    assert found["attention_ms"] == pytest.approx(4.0)
    assert found["other_ms"] == pytest.approx(20.0)
    assert found["total_ms"] == pytest.approx(54.0)
    assert found["largest_other"] == [("loop_add_fusion", 20.0)]
    assert found["largest"][0][:3] == ["matmul", "nvjet_tst_128x256", 30.0]


HLO = """HloModule jit_train_step

ENTRY %main {
  %loop_add_fusion.3 = bf16[4]{0} fusion(%p), metadata={op_name="j/jvp()/add" stack_frame_id=2}
  %loop_add_fusion.4 = bf16[4]{0} fusion(%p), metadata={op_name="j/jvp()/mul" stack_frame_id=1}
}

FileNames
1 "/somewhere/t2t/nn/layers.py"
FunctionNames
1 "RMSNorm.__call__"
2 "Mlp.__call__"
FileLocations
1 {file_name_id=1 function_name_id=1 line=314 end_line=314 column=1 end_column=2}
2 {file_name_id=1 function_name_id=2 line=362 end_line=362 column=1 end_column=2}
StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=0}
"""


def test_non_matmul_kernel_time_is_attributed_to_lines_of_t2t(tmp_path):
    events = [
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/device:GPU:0"}},
        {"ph": "X", "pid": 2, "name": "nvjet_tst_128x256", "dur": 60000},
        {"ph": "X", "pid": 2, "name": "loop_add_fusion_3", "dur": 30000},
        {"ph": "X", "pid": 2, "name": "loop_add_fusion_4", "dur": 10000},
        {"ph": "X", "pid": 2, "name": "loop_add_fusion_3", "dur": 2000},
        {"ph": "X", "pid": 2, "name": "mystery_kernel", "dur": 1000},
    ]
    path = tmp_path / "x.trace.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)
    rows = gpu_profile.by_source(str(path), HLO, steps=2)
    assert rows == [
        [16.0, 1.0, "t2t/nn/layers.py:362 Mlp.__call__", "add"],
        [5.0, 0.5, "t2t/nn/layers.py:314 RMSNorm.__call__", "mul"],
        [0.5, 0.5, "?", "(not in the program)"],
    ]
