"""Bounds checks, divergence detection, poisoning and launch/compile diagnostics."""

from __future__ import annotations

import re

import emu_msl_kernels as K
import pytest
import torch

from tilelang_metal.emulator import (
    EmulatorCompileError,
    EmulatorRuntimeError,
    check_source,
    compile_kernel,
    launch_counters,
)



def launch_fails(src: str, match: str, *launch_args, **launch_kwargs) -> None:
    """Compile `src`, launch it and expect an EmulatorRuntimeError whose text matches `match`."""
    k = compile_kernel(src)
    with pytest.raises(EmulatorRuntimeError, match=match):
        k.launch(*launch_args, **launch_kwargs)

def kernel(name: str, params: list[str], body: str, max_threads: int = 128, mpp: bool = False) -> str:
    sig = ",\n".join(f"  {p}" for p in params)
    return (
        K.header(name, mpp=mpp)
        + f"[[kernel, max_total_threads_per_threadgroup({max_threads})]] void {name}(\n{sig}) {{\n{body}}}\n"
    )


OUT = "device float* __restrict C [[ buffer(0) ]]"
BLOCK_IDX = "uint3 blockIdx [[threadgroup_position_in_grid]]"
THREAD_IDX = "uint3 threadIdx [[thread_position_in_threadgroup]]"
SIMD_ID = "uint __simd_group_id [[simdgroup_index_in_threadgroup]]"
LANE = "ushort __lane [[thread_index_in_simdgroup]]"


# ----------------------------------------------------------------- bounds checks


def test_out_of_bounds_write_names_buffer_and_index():
    src = kernel("oob_write", [OUT, BLOCK_IDX, THREAD_IDX], "  C[((((int)blockIdx.x) * 128) + ((int)threadIdx.x))] = 1.000000e+00f;\n")
    k = compile_kernel(src)
    c = torch.zeros(4000)
    with pytest.raises(EmulatorRuntimeError) as ei:
        k.launch([c], grid=(32, 1, 1), block=(128, 1, 1))
    msg = str(ei.value)
    assert "'C'" in msg
    assert "element index 4000" in msg
    assert "extent 4000" in msg
    assert "threadgroup (31,0,0)" in msg and "thread (32,0,0)" in msg
    # the in-bounds part of the run still happened
    assert torch.equal(c, torch.ones(4000))


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_reported_bounds_error_does_not_depend_on_workers(workers):
    src = kernel("oob_many", [OUT, BLOCK_IDX, THREAD_IDX], "  C[((((int)blockIdx.x) * 128) + ((int)threadIdx.x)) + 64] = 1.000000e+00f;\n")
    launch_fails(src, re.escape("element index 1024, buffer extent 1024"), [torch.zeros(1024)], grid=(8, 1, 1), block=(128, 1, 1), workers=workers)


def test_vector_access_partially_outside_buffer():
    k = compile_kernel(K.add_half4())
    a = torch.zeros(4094, dtype=torch.float16)
    b = torch.zeros(4096, dtype=torch.float16)
    c = torch.zeros(4096, dtype=torch.float16)
    with pytest.raises(EmulatorRuntimeError) as ei:
        k.launch([a, b, c], grid=(8, 1, 1), block=(128, 1, 1))
    msg = str(ei.value)
    assert "device buffer 'A'" in msg and "4-element vector at element index 4092" in msg and "extent 4094" in msg


def test_misaligned_vector_access_is_reported():
    src = kernel(
        "misaligned",
        ["const device half* __restrict A [[ buffer(0) ]]", "device half* __restrict B [[ buffer(1) ]]", THREAD_IDX],
        "  *(device half4*)(B + (((int)threadIdx.x) * 4)) = *(const device half4*)(A + ((((int)threadIdx.x) * 4) + 2));\n",
    )
    launch_fails(src, r"misaligned vector access to device buffer 'A'.*element index 2", [torch.zeros(64, dtype=torch.float16), torch.zeros(64, dtype=torch.float16)], (1, 1, 1), (8, 1, 1))


PACKED_COPY = (
    "  half4 v = half4(*(const device packed_half4*)(A + ((((int)threadIdx.x) * 4) + 1)));\n"
    "  *(device packed_half4*)(B + ((((int)threadIdx.x) * 4) + 3)) = v;\n"
)
PACKED_PARAMS = ["const device half* __restrict A [[ buffer(0) ]]", "device half* __restrict B [[ buffer(1) ]]", THREAD_IDX]


def test_packed_vectors_need_only_element_alignment():
    """MSL's packed_half4 at odd element offsets: the same cast to half4 is reported above; the packed
    one copies, and counts one 8-byte access per load and per store."""
    src = kernel("packed_copy", PACKED_PARAMS, PACKED_COPY)
    k = compile_kernel(src)
    a = torch.arange(64, dtype=torch.float16)
    b = torch.zeros(64, dtype=torch.float16)
    k.launch([a, b], (1, 1, 1), (8, 1, 1))
    expected = torch.zeros(64, dtype=torch.float16)
    for t in range(8):
        expected[4 * t + 3 : 4 * t + 7] = a[4 * t + 1 : 4 * t + 5]
    assert torch.equal(b[:35], expected[:35])
    counts = launch_counters(src, [a, torch.zeros(64, dtype=torch.float16)], (1, 1, 1), (8, 1, 1)).total
    assert counts["device_load_instructions"] == 8 and counts["device_load_bytes"] == 64, counts
    assert counts["narrow_device_loads"] == 0 and counts["device_store_instructions"] == 8, counts


def test_packed_vector_partially_outside_the_buffer_is_reported():
    a = torch.zeros(32, dtype=torch.float16)  # thread 7 reads elements 29..32
    launch_fails(kernel("packed_oob", PACKED_PARAMS, PACKED_COPY), r"device buffer 'A'.*4-element vector at element index 29",
                 [a, torch.zeros(64, dtype=torch.float16)], (1, 1, 1), (8, 1, 1))


def test_threadgroup_array_bounds_are_checked():
    src = kernel(
        "tg_oob",
        [OUT, THREAD_IDX],
        "  threadgroup float S[64];\n"
        "  S[((int)threadIdx.x)] = 1.000000e+00f;\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n"
        "  C[((int)threadIdx.x)] = S[((int)threadIdx.x)];\n",
    )
    launch_fails(src, r"threadgroup array 'S': element index 64, buffer extent 64", [torch.zeros(128)], (1, 1, 1), (128, 1, 1))


@pytest.mark.parametrize("index", [4, -1000, 100000000])
def test_thread_array_bounds_are_checked(index):
    """A runtime index outside a thread array is reported in checked builds (it wrote over the
    emulated thread's stack: silently for 4 and -1000, a segfault of Python for 1e8), in range it
    runs; vector accesses through the array are checked as a whole."""
    src = kernel(
        "local_oob",
        ["device int* __restrict I [[ buffer(0) ]]", "device float* __restrict C [[ buffer(1) ]]", THREAD_IDX],
        "  float acc[4];\n"
        "  *(thread float4*)(acc + 0) = float4(0.000000e+00f);\n"
        "  acc[I[((int)threadIdx.x)]] = 5.000000e+00f;\n"
        "  C[((int)threadIdx.x)] = acc[(((int)threadIdx.x) & 3)];\n",
    )
    c = torch.zeros(64)
    compile_kernel(src).launch([torch.full((64,), 2, dtype=torch.int32), c], (1, 1, 1), (64, 1, 1))
    assert c.tolist() == [5.0 if t % 4 == 2 else 0.0 for t in range(64)]
    launch_fails(src, rf"thread array 'acc': element index {index}, buffer extent 4", [torch.full((64,), index, dtype=torch.int32), c],
                 (1, 1, 1), (64, 1, 1))


def test_simdgroup_store_out_of_bounds():
    src = kernel(
        "sg_store_oob",
        [OUT, LANE],
        "  simdgroup_float8x8 F = make_filled_simdgroup_matrix<float, 8, 8>(1.000000e+00f);\n"
        "  simdgroup_store(F, C + 8, 8, ulong2(0, 0), false);\n",
        max_threads=32,
    )
    # a lane's two adjacent elements are one access: the first lane past the end reports its pair
    launch_fails(src, r"device buffer 'C': 2-element vector at element index 64, buffer extent 64", [torch.zeros(64)], (1, 1, 1), (32, 1, 1))


# ----------------------------------------------------------------- divergence


def test_divergent_barrier_inside_branch():
    src = kernel(
        "div_barrier",
        [OUT, THREAD_IDX],
        "  if (((int)threadIdx.x) < 96) {\n    threadgroup_barrier(mem_flags::mem_threadgroup);\n  }\n"
        "  C[((int)threadIdx.x)] = 1.000000e+00f;\n",
    )
    k = compile_kernel(src)
    with pytest.raises(EmulatorRuntimeError) as ei:
        k.launch([torch.zeros(128)], grid=(2, 1, 1), block=(128, 1, 1))
    assert (
        "divergent barrier: 96 of 128 threads of threadgroup (0,0,0) reached threadgroup_barrier; thread 96 returned"
        in str(ei.value)
    )


def test_early_return_before_barrier():
    src = kernel(
        "early_return",
        [OUT, BLOCK_IDX, THREAD_IDX],
        "  if ((((int)threadIdx.x) == 17) && (((int)blockIdx.x) == 1)) {\n    return;\n  }\n"
        "  threadgroup_barrier(mem_flags::mem_threadgroup);\n  C[((int)threadIdx.x)] = 1.000000e+00f;\n",
    )
    launch_fails(src, re.escape("127 of 128 threads of threadgroup (1,0,0) reached threadgroup_barrier; thread 17 returned"), [torch.zeros(128)], grid=(3, 1, 1), block=(128, 1, 1))


def test_simd_collective_reached_by_half_a_simdgroup():
    src = kernel(
        "div_simd",
        [OUT, THREAD_IDX, LANE],
        "  float v = 1.000000e+00f;\n  if (((int)__lane) < 16) {\n    v = simd_sum(v);\n  }\n  C[((int)threadIdx.x)] = v;\n",
    )
    launch_fails(src, re.escape("16 of 32 lanes of simdgroup 0 of threadgroup (0,0,0) reached simd_sum; thread 16 returned"), [torch.zeros(64)], (1, 1, 1), (64, 1, 1))


def test_different_collectives_in_one_simdgroup():
    src = kernel(
        "mixed_simd",
        [OUT, THREAD_IDX, LANE],
        "  float v = 1.000000e+00f;\n  if (((int)__lane) < 16) {\n    v = simd_sum(v);\n  } else {\n    v = simd_max(v);\n  }\n"
        "  C[((int)threadIdx.x)] = v;\n",
    )
    launch_fails(src, r"reached simd_sum; lane 16 \(thread 16\) reached simd_max", [torch.zeros(32)], (1, 1, 1), (32, 1, 1))


def test_matrix_op_needs_a_full_simdgroup():
    src = kernel(
        "partial_mma",
        [OUT, LANE],
        "  simdgroup_float8x8 F = make_filled_simdgroup_matrix<float, 8, 8>(1.000000e+00f);\n"
        "  simdgroup_multiply_accumulate(F, F, F, F);\n  simdgroup_store(F, C, 8, ulong2(0, 0), false);\n",
    )
    launch_fails(src, "needs a full simdgroup of 32 lanes", [torch.zeros(64)], (1, 1, 1), (16, 1, 1))


# ----------------------------------------------------------------- poisoning


def test_threadgroup_read_before_write_is_nan():
    """Without the barrier, thread t reads slot 127 - t before its writer ran (fibers run in order)."""
    k = compile_kernel(K.reverse_tile(with_barrier=False))
    a = torch.randn(2 * 128)
    b = torch.zeros(2 * 128)
    k.launch([a, b], grid=(2, 1, 1), block=(128, 1, 1))
    b = b.view(2, 128)
    assert b[:, :64].isnan().all()
    assert torch.equal(b[:, 64:], a.view(2, 128).flip(1)[:, 64:])


def test_threadgroup_memory_is_repoisoned_for_every_threadgroup():
    k = compile_kernel(K.first_group_writes_shared())
    out = torch.zeros(4 * 128)
    k.launch([out], grid=(4, 1, 1), block=(64, 1, 1), workers=1)  # one worker reuses its arena
    out = out.view(4, 2, 64)
    assert torch.equal(out[0, 0], torch.ones(64)) and torch.equal(out[0, 1], torch.full((64,), 2.0))
    assert out[1:].isnan().all()


def test_threadgroup_memory_limit():
    src = kernel(
        "too_much_shared",
        [OUT, THREAD_IDX],
        "  threadgroup float S[9000];\n  S[((int)threadIdx.x)] = 1.000000e+00f;\n  C[((int)threadIdx.x)] = S[((int)threadIdx.x)];\n",
    )
    launch_fails(src, "threadgroup memory of 36000 bytes exceeds the limit of 32768", [torch.zeros(32)], (1, 1, 1), (32, 1, 1))


# ----------------------------------------------------------------- launch arguments


def test_dtype_mismatch_names_parameter():
    k = compile_kernel(K.add_half4())
    a = torch.zeros(512, dtype=torch.float16)
    with pytest.raises(EmulatorRuntimeError) as ei:
        k.launch([a, torch.zeros(512), a.clone()], (1, 1, 1), (128, 1, 1))
    msg = str(ei.value)
    assert "'B'" in msg and "torch.float16" in msg and "torch.float32" in msg


def test_launch_argument_errors():
    k = compile_kernel(K.add_half4())
    a = torch.zeros(512, dtype=torch.float16)
    with pytest.raises(EmulatorRuntimeError, match="takes 3 buffer"):
        k.launch([a, a], (1, 1, 1), (128, 1, 1))
    with pytest.raises(EmulatorRuntimeError, match="contiguous"):
        k.launch([a, torch.zeros(1024, dtype=torch.float16)[::2], a], (1, 1, 1), (128, 1, 1))
    with pytest.raises(EmulatorRuntimeError, match="max_total_threads_per_threadgroup is 128"):
        k.launch([a, a, a], (1, 1, 1), (256, 1, 1))


# ----------------------------------------------------------------- compile diagnostics


def test_check_source_accepts_contract_kernels():
    for src in (K.add_half4(), K.reverse_tile(), K.simd_collectives(), K.simdgroup_gemm("bfloat"), K.mpp_gemm("half")):
        check_source(src)


def test_compile_error_reports_diagnostics_and_source_line():
    src = kernel("broken", [OUT, THREAD_IDX], "  float v = 1.000000e+00f;\n  C[((int)threadIdx.x)] = (v + undeclared_value);\n")
    with pytest.raises(EmulatorCompileError) as ei:
        check_source(src)
    msg = str(ei.value)
    assert "undeclared_value" in msg and "error" in msg
    line_no = src.splitlines().index("  C[((int)threadIdx.x)] = (v + undeclared_value);") + 1
    assert f"{line_no:5d} |   C[((int)threadIdx.x)] = (v + undeclared_value);" in msg
    with pytest.raises(EmulatorCompileError):
        compile_kernel(src)


def test_swapped_destination_operand_types_do_not_compile():
    src = K.mpp_gemm("half").replace("decltype(__ct_a), decltype(__ct_b)", "decltype(__ct_b), decltype(__ct_a)")
    with pytest.raises(EmulatorCompileError, match="first template argument must be the left input tensor type"):
        check_source(src)


def test_unsupported_shapes_are_rejected():
    with pytest.raises(EmulatorCompileError, match="no kernel found"):
        check_source("int main() { return 0; }")
    nested = kernel(
        "nested_tg",
        [OUT, THREAD_IDX],
        "  if (((int)threadIdx.x) == 0) { threadgroup float S[4]; S[0] = 1.0f; }\n  C[0] = 1.0f;\n",
    )
    with pytest.raises(EmulatorCompileError, match="unsupported threadgroup declaration"):
        check_source(nested)
    texture = kernel("texture_param", ["texture2d<float> t [[ texture(0) ]]", THREAD_IDX], "")
    with pytest.raises(EmulatorCompileError, match="unsupported kernel parameter"):
        check_source(texture)
    vector_scalar = kernel("vector_scalar", ["constant float4& v [[ buffer(0) ]]", THREAD_IDX], "")
    with pytest.raises(EmulatorCompileError, match="scalar parameter 'v': unsupported type 'float4'"):
        check_source(vector_scalar)
    wrong_index = kernel("wrong_index", ["device float* __restrict C [[ buffer(1) ]]"], "  C[0] = 1.0f;\n")
    with pytest.raises(EmulatorCompileError, match="buffer indices must be 0..n-1"):
        check_source(wrong_index)
    with pytest.raises(EmulatorCompileError, match="only matmul2d_descriptor"):
        check_source(K.mpp_gemm("half").replace("matmul2d_descriptor(16, 32, 16", "matmul2d_descriptor(16, 16, 16"))
