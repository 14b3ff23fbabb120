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


LOOP_HLO = """HloModule jit_train_step

%body (p: (s32[], f32[8])) -> (s32[], f32[8]) {
  %p = (s32[], f32[8]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[8]{0} get-tuple-element(%p), index=1
  %loop_add_fusion.1 = f32[8]{0} fusion(%x), kind=kLoop, calls=%f, metadata={op_name="j/add" stack_frame_id=1}
  %cublas.1 = f32[8]{0} custom-call(%loop_add_fusion.1), custom_call_target="__cublas$lt$matmul"
  ROOT %t = (s32[], f32[8]{0}) tuple(%i, %cublas.1)
}

%cond (p.1: (s32[], f32[8])) -> pred[] {
  %p.1 = (s32[], f32[8]{0}) parameter(0)
  %i.1 = s32[] get-tuple-element(%p.1), index=0
  %n = s32[] constant(3)
  ROOT %lt = pred[] compare(%i.1, %n), direction=LT
}

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %z = s32[] constant(0)
  %init = (s32[], f32[8]{0}) tuple(%z, %a)
  %w = (s32[], f32[8]{0}) while(%init), condition=%cond, body=%body
  %out = f32[8]{0} get-tuple-element(%w), index=1
  %reduce.2 = f32[8]{0} fusion(%out), kind=kCustom, calls=%g, metadata={op_name="j/reduce_sum" stack_frame_id=2}, backend_config={"fusion_backend_config":{"kind":"__triton"}}
  %start = ((f32[8]{0}), f32[8]{0}) fusion-start(%reduce.2), kind=kLoop, calls=%h
  %done = f32[8]{0} fusion-done(%start)
  ROOT %copy.1 = f32[8]{0} copy(%done)
}

FileNames
1 "/somewhere/t2t/nn/layers.py"
2 "/site-packages/optax/_src/factorized.py"
FunctionNames
1 "Mlp.__call__"
2 "_update"
FileLocations
1 {file_name_id=1 function_name_id=1 line=362 end_line=362 column=1 end_column=2}
2 {file_name_id=2 function_name_id=2 line=181 end_line=181 column=1 end_column=2}
StackFrames
1 {file_location_id=1 parent_frame_id=0}
2 {file_location_id=2 parent_frame_id=0}
"""


def test_the_kernels_of_a_program_are_counted_from_its_text_loops_by_their_trips():
    found = gpu_profile.kernel_inventory(LOOP_HLO)
    # The loop body's fusion and GEMM run 3 times; the Triton reduction, the asynchronous
    # fusion (one kernel for its start/done pair) and the copy once each.
    assert found["by_kind"] == {
        "kLoop": 4,
        "__cublas$lt$matmul": 3,
        "__triton": 1,
        "copy": 1,
    }
    assert found["kernels"] == 9
    assert found["by_file"] == {"t2t/nn/layers.py": 3, "?": 5, "optax": 1}
