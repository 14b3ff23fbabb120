"""The cost model counts what crosses device memory, kernel by kernel, loops by their trip
counts: a hand-written program whose bytes are worked out below, and real programs compiled on
the CPU whose traffic must scale as their shapes and loops do."""

import dataclasses

import jax
import jax.numpy as jnp
import pytest

from t2t.aot import cost_model, hlo

# One device's program, written the way XLA prints it. Bytes per kernel (f32 = 4, bf16 = 2):
# - fusion.1 (kLoop, no matmul): reads x f32[256,128] (131072) writes f32[256,128] (131072).
# - while.1 runs its body 12 times (the condition compares the counter with 12):
#   - fusion.2 reads only layer i of the stacked weights bf16[12,128,128] (a dynamic slice of
#     bf16[1,128,128] = 32768), the index i (4) and the carried f32[256,128] (131072), holds a
#     dot (a matmul kernel) and writes f32[256,128] (131072): 294916 per run.
#   - fusion.3 writes the carried f32[256,128] as bf16 into the stacked bf16[12,256,128] in
#     place: it reads the f32 rows (131072) and i (4), and writes only the update (65536):
#     196612 per run.
#   - copy-start.1 stages f32[128] (512) from device memory into on-chip memory S(1): 512.
#   - next = add(i, 1): three s32 scalars, 12.
# - all-reduce.1 of f32[256,128]: a collective, 131072 bytes over the interconnect.
# Device memory: 262144 + 12 * (294916 + 196612 + 512 + 12) = 6166768; matmul kernels
# 12 * 294916.
PROGRAM = """
HloModule jit_step, entry_computation_layout={(f32[256,128]{1,0})->f32[256,128]{1,0}}

%fused_exp (param_0: f32[256,128]) -> f32[256,128] {
  %param_0 = f32[256,128]{1,0} parameter(0)
  ROOT %exponential = f32[256,128]{1,0} exponential(%param_0), metadata={op_name="jit(step)/exp"}
}

%fused_dot (param_0.1: bf16[12,128,128], param_1.1: s32[], param_2: f32[256,128]) -> f32[256,128] {
  %param_0.1 = bf16[12,128,128]{2,1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  %constant.0 = s32[] constant(0)
  %dynamic-slice.1 = bf16[1,128,128]{2,1,0} dynamic-slice(%param_0.1, %param_1.1, %constant.0, %constant.0), dynamic_slice_sizes={1,128,128}
  %bitcast.1 = bf16[128,128]{1,0} bitcast(%dynamic-slice.1)
  %param_2 = f32[256,128]{1,0} parameter(2)
  %convert.1 = bf16[256,128]{1,0} convert(%param_2)
  %dot.1 = bf16[256,128]{1,0} dot(%convert.1, %bitcast.1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %convert.2 = f32[256,128]{1,0} convert(%dot.1)
}

%fused_update (param_0.2: bf16[12,256,128], param_1.2: f32[256,128], param_2.2: s32[]) -> bf16[12,256,128] {
  %param_0.2 = bf16[12,256,128]{2,1,0} parameter(0)
  %param_1.2 = f32[256,128]{1,0} parameter(1)
  %convert.3 = bf16[256,128]{1,0} convert(%param_1.2)
  %bitcast.2 = bf16[1,256,128]{2,1,0} bitcast(%convert.3)
  %param_2.2 = s32[] parameter(2)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[12,256,128]{2,1,0} dynamic-update-slice(%param_0.2, %bitcast.2, %param_2.2, %constant.1, %constant.1)
}

%body (p: (s32[], f32[256,128], bf16[12,128,128], bf16[12,256,128], f32[128])) -> (s32[], f32[256,128], bf16[12,128,128], bf16[12,256,128], f32[128]) {
  %p = (s32[], f32[256,128]{1,0}, bf16[12,128,128]{2,1,0}, bf16[12,256,128]{2,1,0}, f32[128]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %x = f32[256,128]{1,0} get-tuple-element(%p), index=1
  %w = bf16[12,128,128]{2,1,0} get-tuple-element(%p), index=2
  %stack = bf16[12,256,128]{2,1,0} get-tuple-element(%p), index=3
  %scale = f32[128]{0} get-tuple-element(%p), index=4
  %fusion.2 = f32[256,128]{1,0} fusion(%w, %i, %x), kind=kOutput, calls=%fused_dot, metadata={op_name="jit(step)/while/body/dot_general"}
  %fusion.3 = bf16[12,256,128]{2,1,0} fusion(%stack, %x, %i), kind=kLoop, calls=%fused_update, metadata={op_name="jit(step)/while/body/dynamic_update_slice"}
  %copy-start.1 = (f32[128]{0}, f32[128]{0:S(1)}, u32[]{:S(2)}) copy-start(%scale)
  %copy-done.1 = f32[128]{0:S(1)} copy-done(%copy-start.1)
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  ROOT %t = (s32[], f32[256,128]{1,0}, bf16[12,128,128]{2,1,0}, bf16[12,256,128]{2,1,0}, f32[128]{0}) tuple(%next, %fusion.2, %w, %fusion.3, %scale)
}

%cond (q: (s32[], f32[256,128], bf16[12,128,128], bf16[12,256,128], f32[128])) -> pred[] {
  %q = (s32[], f32[256,128]{1,0}, bf16[12,128,128]{2,1,0}, bf16[12,256,128]{2,1,0}, f32[128]{0}) parameter(0)
  %counter = s32[] get-tuple-element(%q), index=0
  %limit = s32[] constant(12)
  ROOT %lt = pred[] compare(%counter, %limit), direction=LT
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

ENTRY %main (x: f32[256,128], w: bf16[12,128,128], stack: bf16[12,256,128], scale: f32[128]) -> f32[256,128] {
  %x = f32[256,128]{1,0} parameter(0)
  %w = bf16[12,128,128]{2,1,0} parameter(1)
  %stack = bf16[12,256,128]{2,1,0} parameter(2)
  %scale = f32[128]{0} parameter(3)
  %fusion.1 = f32[256,128]{1,0} fusion(%x), kind=kLoop, calls=%fused_exp, metadata={op_name="jit(step)/exp"}
  %zero = s32[] constant(0)
  %init = (s32[], f32[256,128]{1,0}, bf16[12,128,128]{2,1,0}, bf16[12,256,128]{2,1,0}, f32[128]{0}) tuple(%zero, %fusion.1, %w, %stack, %scale)
  %while.1 = (s32[], f32[256,128]{1,0}, bf16[12,128,128]{2,1,0}, bf16[12,256,128]{2,1,0}, f32[128]{0}) while(%init), condition=%cond, body=%body
  %out = f32[256,128]{1,0} get-tuple-element(%while.1), index=1
  ROOT %all-reduce.1 = f32[256,128]{1,0} all-reduce(%out), replica_groups={}, to_apply=%add
}
"""


def test_the_parser_reads_shapes_memory_spaces_and_called_computations():
    module = hlo.parse_module(PROGRAM)
    assert module.entry == "main"
    loop = module.entry_computation.by_name["while.1"]
    assert loop.called == {"condition": "cond", "body": "body"}
    assert module.computations["fused_dot"].root.opcode == "convert"
    staged = hlo.arrays(module.computations["body"].by_name["copy-start.1"].shape)
    assert [(a.dims, a.memory_space) for a in staged] == [((128,), 0), ((128,), 1), ((), 2)]
    assert hlo.device_memory_bytes("(f32[2,3]{1,0}, bf16[4]{0:T(128)(2,1)S(1)})") == 24
    assert module.computations["fused_dot"].by_name["param_2"].parameter_index == 2


def test_the_worked_example_counts_every_kernel():
    found = cost_model.traffic(PROGRAM)
    by_name = {k.name: k for k in found.kernels}
    assert by_name["fusion.1"].bytes == 2 * 131072 and not by_name["fusion.1"].matmul
    assert by_name["fusion.2"].bytes == 12 * (32768 + 4 + 131072 + 131072)
    assert by_name["fusion.2"].matmul and by_name["fusion.2"].runs == 12
    assert by_name["fusion.3"].bytes == 12 * (131072 + 4 + 65536)
    assert by_name["copy-start.1"].bytes == 12 * 512
    assert found.matmul_bytes == 12 * 294916
    assert found.matmul_bytes + found.other_bytes == 6166768
    assert (found.collective_count, found.collective_bytes) == (1, 131072)
    assert found.not_modeled == []


def test_a_slice_taken_inside_a_nested_fusion_counts_as_the_slice():
    # TPU matmul fusions take a stacked loop operand whole and slice it in a fusion of their
    # own; counted whole, a backward loop over 12 layers read each stacked residual 12 times.
    nested = PROGRAM.replace(
        """  %dynamic-slice.1 = bf16[1,128,128]{2,1,0} dynamic-slice(%param_0.1, %param_1.1, %constant.0, %constant.0), dynamic_slice_sizes={1,128,128}
  %bitcast.1 = bf16[128,128]{1,0} bitcast(%dynamic-slice.1)
""",
        """  %bitcast.1 = bf16[128,128]{1,0} fusion(%param_0.1, %param_1.1), kind=kLoop, calls=%fused_slice
""",
    ).replace(
        "%fused_dot (",
        """%fused_slice (param_0.9: bf16[12,128,128], param_1.9: s32[]) -> bf16[128,128] {
  %param_0.9 = bf16[12,128,128]{2,1,0} parameter(0)
  %param_1.9 = s32[] parameter(1)
  %constant.9 = s32[] constant(0)
  %dynamic-slice.9 = bf16[1,128,128]{2,1,0} dynamic-slice(%param_0.9, %param_1.9, %constant.9, %constant.9), dynamic_slice_sizes={1,128,128}
  ROOT %bitcast.9 = bf16[128,128]{1,0} bitcast(%dynamic-slice.9)
}

%fused_dot (""",
    )
    assert "fused_slice" in nested and "dynamic-slice.1" not in nested
    by_name = {k.name: k for k in cost_model.traffic(nested).kernels}
    assert by_name["fusion.2"].bytes == 12 * (32768 + 4 + 131072 + 131072)
    # Read whole inside the nested fusion (a sum over every layer), it counts whole.
    whole = nested.replace(
        "ROOT %bitcast.9 = bf16[128,128]{1,0} bitcast(%dynamic-slice.9)",
        "%sum.9 = bf16[128,128]{1,0} reduce(%param_0.9, %constant.9), dimensions={0}, "
        "to_apply=%add\n  ROOT %bitcast.9 = bf16[128,128]{1,0} bitcast(%sum.9)",
    )
    by_name = {k.name: k for k in cost_model.traffic(whole).kernels}
    assert by_name["fusion.2"].bytes == 12 * (12 * 32768 + 4 + 131072 + 131072)


def test_the_estimate_adds_other_kernels_to_the_matmuls_or_their_traffic():
    rates = cost_model.Rates(matmul_flops_per_second=1e12, bytes_per_second=1e9)
    matmul_bytes, other_bytes = 12 * 294916, 6166768 - 12 * 294916
    # Compute-bound matmuls: 1e10 FLOPs take 10 ms, more than their operands' 3.5 ms.
    slow = cost_model.estimate(PROGRAM, 1e10, rates)
    assert slow["step_seconds"] == pytest.approx(1e10 / 1e12 + other_bytes / 1e9)
    assert slow["bound"] == "matmul compute"
    # Few FLOPs: the matmul kernels take as long as their traffic, and the rest is added.
    fast = cost_model.estimate(PROGRAM, 1e6, rates)
    assert fast["step_seconds"] == pytest.approx((matmul_bytes + other_bytes) / 1e9)
    assert fast["bound"] == "matmul kernels' memory traffic"
    assert [op["source"] for op in fast["largest_memory_bound"]] == [
        "while/dynamic_update_slice",
        "exp",
        "(copies and prefetches, no JAX source)",
    ]


def test_fused_attention_flops_can_run_at_a_rate_of_their_own():
    rates = cost_model.Rates(matmul_flops_per_second=1e12, bytes_per_second=1e9)
    other_bytes = 6166768 - 12 * 294916
    # Without an attention rate every matmul FLOP runs at the matmul rate, attention or not.
    same = cost_model.estimate(PROGRAM, 1e10, rates, attention_flops=4e9)
    assert same["step_seconds"] == pytest.approx(1e10 / 1e12 + other_bytes / 1e9)
    assert same["attention_seconds"] == 0.0
    # With one, the attention's share leaves the GEMMs' time and takes its own: 6 ms of GEMMs,
    # 4e9 / 1e11 = 40 ms of fused attention, which now bounds the step.
    slow_attention = cost_model.Rates(1e12, 1e9, attention_flops_per_second=1e11)
    split = cost_model.estimate(PROGRAM, 1e10, slow_attention, attention_flops=4e9)
    assert split["matmul_seconds"] == pytest.approx(6e9 / 1e12)
    assert split["attention_seconds"] == pytest.approx(0.04)
    assert split["step_seconds"] == pytest.approx(6e-3 + 0.04 + other_bytes / 1e9)
    assert split["bound"] == "fused attention"


def test_each_other_kernel_takes_at_least_the_least_kernel_time():
    """With `kernel_seconds`, a non-matmul kernel takes max(its bytes / bandwidth, that time)
    per run; matmuls are unaffected."""
    rates = cost_model.Rates(matmul_flops_per_second=1e12, bytes_per_second=1e9)
    kernels = [k for k in cost_model.traffic(PROGRAM).kernels if not k.matmul]
    floor = 2 * max(k.bytes / k.runs for k in kernels) / 1e9  # longer than any kernel's bytes
    plain = cost_model.estimate(PROGRAM, 1e10, rates)
    floored = cost_model.estimate(PROGRAM, 1e10, dataclasses.replace(rates, kernel_seconds=floor))
    runs = sum(k.runs for k in kernels)
    assert floored["other_kernels"] == plain["other_kernels"] == runs
    assert floored["other_seconds"] == pytest.approx(runs * floor)
    assert floored["matmul_seconds"] == plain["matmul_seconds"]
    assert floored["step_seconds"] == pytest.approx(
        plain["step_seconds"] - plain["other_seconds"] + runs * floor
    )
    # A floor below every kernel's time changes nothing.
    tiny = cost_model.estimate(PROGRAM, 1e10, dataclasses.replace(rates, kernel_seconds=1e-12))
    assert tiny["other_seconds"] == pytest.approx(plain["other_seconds"])


ASYNC_PROGRAM = """
HloModule jit_step

%fused_update (param_0: bf16[12,256,128], param_1: s32[], param_2: bf16[256,128]) -> bf16[12,256,128] {
  %param_0 = bf16[12,256,128]{2,1,0} parameter(0)
  %param_2 = bf16[256,128]{1,0} parameter(2)
  %bitcast.1 = bf16[1,256,128]{2,1,0} bitcast(%param_2)
  %param_1 = s32[] parameter(1)
  %constant.1 = s32[] constant(0)
  ROOT %dynamic-update-slice.1 = bf16[12,256,128]{2,1,0} dynamic-update-slice(%param_0, %bitcast.1, %param_1, %constant.1, %constant.1)
}

ENTRY %main (stack: bf16[12,256,128], i: s32[], x: bf16[256,128]) -> bf16[12,256,128] {
  %stack = bf16[12,256,128]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %x = bf16[256,128]{1,0} parameter(2)
  %fusion-start.1 = ((bf16[12,256,128]{2,1,0}, s32[], bf16[256,128]{1,0}), bf16[12,256,128]{2,1,0}, u32[]) fusion-start(%stack, %i, %x), kind=kLoop, calls=%fused_update
  ROOT %fusion-done.1 = bf16[12,256,128]{2,1,0} fusion-done(%fusion-start.1)
}
"""


def test_an_asynchronous_fusion_counts_as_the_fusion_it_wraps():
    # GPUs run a scanned loop's in-place slice update as fusion-start/fusion-done: it reads
    # the row block x (65536 bytes) and the index (4), and writes only the update (65536), not
    # the whole stacked array (786432) it appears to take and return.
    found = cost_model.traffic(ASYNC_PROGRAM)
    assert [(k.opcode, k.bytes) for k in found.kernels] == [("fusion", 65536 + 4 + 65536)]


# A Pallas kernel on a TPU: one custom call whose operands and result are 3 x 262144 bytes,
# declaring (its cost estimate) the 1310720 bytes its blocks move, k and v read twice.
PALLAS_PROGRAM = """
HloModule jit_attend, entry_computation_layout={(bf16[8,128,128]{2,1,0})->bf16[8,128,128]{2,1,0}}

ENTRY %main (q: bf16[8,128,128], k: bf16[8,128,128]) -> bf16[8,128,128] {
  %q = bf16[8,128,128]{2,1,0} parameter(0)
  %k = bf16[8,128,128]{2,1,0} parameter(1)
  ROOT %attend = bf16[8,128,128]{2,1,0} custom-call(%q, %k), custom_call_target="tpu_custom_call", backend_config={"custom_call_config":{"body":"TUzvUg==","cost_estimate":{"flops":"1024","transcendentals":"0","bytes_accessed":"1310720","remote_bytes_transferred":"0"},"needs_layout_passes":true}}
}
"""


def test_a_pallas_kernel_counts_the_bytes_it_declares():
    found = cost_model.traffic(PALLAS_PROGRAM)
    assert [(k.opcode, k.bytes, k.matmul) for k in found.kernels] == [
        ("custom-call", 1310720, True)
    ]
    # Without a declaration: its operands and result, once each.
    undeclared = PALLAS_PROGRAM.replace('"bytes_accessed":"1310720"', '"bytes_accessed":"0"')
    assert [k.bytes for k in cost_model.traffic(undeclared).kernels] == [3 * 262144]


def _traffic_of(fn, *args):
    return cost_model.traffic(jax.jit(fn).lower(*args).compile().as_text())


def test_a_compiled_elementwise_kernel_reads_and_writes_its_arrays_once():
    x = jax.ShapeDtypeStruct((512, 1024), jnp.float32)
    found = _traffic_of(lambda x: jnp.exp(x) * 2.0 + 1.0, x)
    assert found.other_bytes == pytest.approx(2 * 512 * 1024 * 4, rel=0.01)
    assert found.matmul_bytes == 0


def test_a_compiled_loop_counts_its_body_once_per_trip():
    def layers(x, w, count):
        return jax.lax.scan(lambda h, wi: (jnp.tanh(h @ wi), None), x, w[:count])[0]

    x = jax.ShapeDtypeStruct((256, 256), jnp.float32)
    w = jax.ShapeDtypeStruct((8, 256, 256), jnp.float32)
    four = _traffic_of(lambda x, w: layers(x, w, 4), x, w)
    eight = _traffic_of(lambda x, w: layers(x, w, 8), x, w)
    assert four.matmul_bytes > 0
    assert eight.matmul_bytes == pytest.approx(2 * four.matmul_bytes, rel=0.1)
