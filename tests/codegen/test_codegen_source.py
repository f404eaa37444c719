"""Source-shape properties the spec names (sections 1.4, 2.2, 4.3, 5.8), checked on the plugin's MSL."""

import re

import pytest
from gemm_support import lower_source

import tilelang_metal
from tilelang_metal import kernels as E
from tilelang_metal.codegen.artifact import strip_artifact


def k_loop(source: str) -> str:
    """The body of the K loop (`for (int k_outer ...) { ... }`)."""
    start = source.index("for (int k_outer")
    depth, i = 0, source.index("{", start)
    for j in range(i, len(source)):
        depth += {"{": 1, "}": -1}.get(source[j], 0)
        if depth == 0:
            return source[i : j + 1]
    raise AssertionError("unbalanced K loop")


@pytest.fixture(scope="module")
def fast_path_fp16():
    # spec 1.4: M=128, N=256, K=128, block 64x128, 128 threads, fp16 in/out
    return lower_source(E.gemm_direct_global(128, 256, 128, out_dtype="float16"), E.metal4_target())


def test_banner_names_plugin_and_version(fast_path_fp16):
    assert fast_path_fp16.splitlines()[0] == f"// tilelang_metal {tilelang_metal.__version__}: main_kernel"


def test_const_and_restrict_parameters(fast_path_fp16):
    assert "const device half* __restrict A [[ buffer(0) ]]" in fast_path_fp16
    assert "const device half* __restrict B [[ buffer(1) ]]" in fast_path_fp16
    assert "  device half* __restrict C [[ buffer(2) ]]" in fast_path_fp16


def test_execution_attributes(fast_path_fp16):
    assert "max_total_threads_per_threadgroup(128)" in fast_path_fp16
    assert "uint __simd_group_id [[simdgroup_index_in_threadgroup]]" in fast_path_fp16
    assert "const ushort __lane = __metal_get_thread_index_in_simdgroup(ushort());" in fast_path_fp16
    # lane and simdgroup are not re-derived from threadIdx
    assert "threadIdx" not in fast_path_fp16


def test_mpp_descriptor_and_destination_elision(fast_path_fp16):
    assert "mpp::tensor_ops::matmul2d_descriptor(16, 32, 16, false, false, true" in fast_path_fp16
    assert "metal::execution_simdgroup" in fast_path_fp16
    # 64x128 tile, 2x2 simdgroups, each 32x64 = 2x2 fragments -> 4 destination tensors
    assert len(re.findall(r"auto C_accum_ct\d = __ct_op\.get_destination_cooperative_tensor", fast_path_fp16)) == 4
    assert re.search(r"\bfloat \w+\[\d+\];", fast_path_fp16) is None  # no thread array for C
    loop = k_loop(fast_path_fp16)
    assert loop.count("__ct_op.run(") == 4
    assert "C_accum_ct3);" in loop


def test_direct_global_has_no_threadgroup_memory_or_barrier(fast_path_fp16):
    assert "threadgroup " not in fast_path_fp16.replace("[[threadgroup_position_in_grid]]", "")
    assert "threadgroup_barrier" not in fast_path_fp16


def test_fp32_accumulation_with_fp16_store_cast(fast_path_fp16):
    assert "half4(*(thread float4*)(&C_accum_ct0[0]))" in fast_path_fp16
    fp32 = lower_source(E.gemm_direct_global(128, 256, 128, out_dtype="float32"), E.metal4_target())
    assert "device float* __restrict C" in fp32 and "half4(" not in fp32


def test_affine_addresses_with_hoisted_position_offsets(fast_path_fp16):
    """base + tile offset + simdgroup offset + K induction, with the position part computed once."""
    hoisted = dict(re.findall(r"const int (__off\d+) = (.*);", fast_path_fp16))
    loop = k_loop(fast_path_fp16)
    # spec 1.4: one tile pointer per operand and K step, the loads are constant offsets from it
    tile = re.search(r"const device half\* (__src\w*) = \(A \+ \((__off\d+) \+ \(k_outer \* 16\)\)\);", loop)
    assert tile, loop[:400]
    definition = hoisted[tile.group(2)]
    assert "blockIdx.y" in definition and "__simd_group_id" in definition and "__lane" in definition
    a_loads = [line for line in loop.splitlines() if "A_frag +" in line]
    assert len(a_loads) == 4, loop[:400]
    for line in a_loads:
        assert re.search(r"= \*\(const device half4\*\)\(" + tile.group(1) + r" \+ \(\d+\)\);$", line), line
    assert "blockIdx" not in loop and "__lane" not in loop  # nothing position-dependent recomputed per step


def test_aligned_kernel_has_no_edge_predicates(fast_path_fp16):
    loop = k_loop(fast_path_fp16)
    assert "?" not in loop and "if (" not in loop
    assert "if (" not in fast_path_fp16


def test_edge_kernel_predicates_loads_and_stores():
    source = lower_source(E.gemm_direct_global(100, 200, 64), E.metal4_target())
    # interior threadgroups (one threadgroup-uniform branch) run the aligned body; edge ones the guarded body
    interior, edge = source.split("} else {  // threadgroup-uniform", 1)
    assert interior.count("{  // threadgroup-uniform") == 1
    assert "?" not in k_loop(interior) and "if (" not in k_loop(interior)
    loop = k_loop(edge)
    assert "?" in loop  # zero-filled operand loads outside the buffer
    assert "if (" in edge.split("for (int k_outer")[1].split("\n    }\n", 1)[1]  # predicated C stores


def test_shared_path_keeps_staging_and_elides_fragment(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")  # staging-only buffers would be bypassed on metal4
    source = lower_source(E.gemm_shared(128, 128, 128), E.metal4_target())
    assert re.search(r"threadgroup uchar buf_dyn_shmem\[\d+\];", source)
    assert "threadgroup_barrier(mem_flags::mem_threadgroup);" in source
    assert "__ct_op.run(__ct_a, __ct_b, C_acc_ct0);" in source
    assert re.search(r"\bfloat C_acc\[", source) is None


def test_simdgroup_path_shape():
    source = lower_source(E.gemm_shared(128, 128, 128), E.plain_metal_target())
    assert "MetalPerformancePrimitives" not in source and "mpp::" not in source
    assert "simdgroup_load(A_sg[0], (A_s +" in source
    assert "simdgroup_multiply_accumulate(C_acc[0], A_sg[0], B_sg[0], C_acc[0]);" in source
    assert "simdgroup_float8x8 C_acc[" in source


def test_swizzle_maps_tiles_once():
    source = lower_source(E.gemm_direct_global(1000, 256, 64, swizzle_panel=4), E.metal4_target())
    assert source.count("const int __tile_x = ") == 1 and source.count("const int __tile_y = ") == 1
    assert "return;" not in source  # 16 tile rows fill 4 panels of 4: no padding threadgroups
    body = strip_artifact(source).split("const int __tile_y = ", 1)[1].split("\n", 1)[1]
    assert "__physical_blockIdx" not in body  # no physical-index arithmetic after the prelude
    assert "uint3 __physical_blockIdx [[threadgroup_position_in_grid]]" in source
