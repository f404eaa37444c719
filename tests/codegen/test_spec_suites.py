"""The source properties TileLang's own Metal codegen suites check (spec section 5.8: the gemm_v2
Linux tests, the simdgroup direct-store tests, the bf16 packed-copy tests), written for this repo.

- a register (`local.fragment`) accumulator on the simdgroup path is zeroed with
  `make_filled_simdgroup_matrix` and, on aligned tiles, written out with `simdgroup_store` (never
  loaded back with `simdgroup_load`); partial tiles keep their masked per-lane stores;
- 16-byte global -> threadgroup copies are `uint4` moves when both ends are provably aligned;
- the direct-global path keeps the spec 1.4 source shape: const / restrict operands, the simdgroup
  id attribute, the lane from `__metal_get_thread_index_in_simdgroup`, no threadgroup memory, no C
  thread array, and the fp32 -> fp16 store cast reading a run of the destination tensor as `float4`.
"""


import re

import pytest
import tilelang.language as T

from tests.gemm_support import lower_source
from tilelang_metal import kernels as E


def fragment_gemm(M, N, K, bm, bn, bk, dtype="float16", accum="float32", threads=128):
    """Shared A/B staging, a register accumulator cleared with T.clear, T.copy out."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), accum)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype, scope="shared")
            B_s = T.alloc_shared((bk, bn), dtype, scope="shared")
            C_local = T.alloc_fragment((bm, bn), accum)
            T.clear(C_local)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_local)
            T.copy(C_local, C[by * bm, bx * bn])

    return main


def shared_c_gemm(M, N, K, bm, bn, bk, dtype="float16"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype, scope="shared")
            B_s = T.alloc_shared((bk, bn), dtype, scope="shared")
            C_s = T.alloc_shared((bm, bn), "float32", scope="shared")
            T.clear(C_s)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_s)
            T.copy(C_s, C[by * bm, bx * bn])

    return main


def one_tile_gemm(dtype, pad=0):
    """32x64x16 on 64 threads, one threadgroup (the bf16 suite's kernel shape); `pad` widens the
    shared rows so 16-byte copies are no longer aligned."""
    M, N, K = 32, 64, 16

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=64) as (bx, by):
            A_s = T.alloc_shared((M, K + pad), dtype, "shared")
            B_s = T.alloc_shared((K, N + pad), dtype, "shared")
            C_local = T.alloc_fragment((M, N), "float32")
            T.clear(C_local)
            T.copy(A, A_s[0:M, 0:K])
            T.copy(B, B_s[0:K, 0:N])
            T.gemm(A_s[0:M, 0:K], B_s[0:K, 0:N], C_local)
            T.copy(C_local, C)

    return main


def _lines(src: str, pattern: str) -> list[str]:
    """Lines of MSL code matching `pattern` (the artifact comment, which names every parameter, excluded)."""
    return [line for line in src.splitlines() if re.search(pattern, line) and not line.startswith("// tilelang_metal.artifact")]


# ---------------------------------------------------------------- simdgroup accumulators

ALIGNED = [
    (64, 64, 64, 16, 16, 16, "float16"),
    (64, 64, 64, 16, 16, 16, "float32"),
    (128, 128, 128, 32, 32, 32, "float16"),
    (128, 128, 128, 32, 64, 16, "float16"),
    (16, 16, 16, 16, 16, 16, "float16"),
]


@pytest.mark.parametrize("M,N,K,bm,bn,bk,dtype", ALIGNED)
def test_fragment_accumulator_uses_whole_matrix_forms(M, N, K, bm, bn, bk, dtype):
    src = lower_source(fragment_gemm(M, N, K, bm, bn, bk, dtype), E.plain_metal_target())
    assert "MetalPerformancePrimitives" not in src
    assert "simdgroup_float8x8 C_local[" in src
    assert "simdgroup_multiply_accumulate" in src and "simdgroup_load" in src
    matrices = int(re.search(r"simdgroup_float8x8 C_local\[(\d+)\]", src).group(1))
    # one fill and one store per matrix, no per-lane element access to the accumulator
    assert len(_lines(src, r"C_local\[\d+\] = make_filled_simdgroup_matrix<float, 8, 8>\(")) == matrices
    stores = _lines(src, r"simdgroup_store\(C_local\[\d+\], \(C \+ ")
    assert len(stores) == matrices
    assert all(f", {N}, ulong2(0, 0), false);" in line for line in stores), stores  # row stride of C
    assert ".thread_elements()" not in src
    assert not _lines(src, r"simdgroup_load\([^,]*C_local")


def test_partial_tiles_keep_masked_lane_stores():
    src = lower_source(fragment_gemm(45, 61, 35, 32, 32, 16), E.plain_metal_target())
    assert "simdgroup_store(C_local" not in src
    # the store of C is guarded per lane; the zeroing is still a whole-matrix fill
    assert _lines(src, r"C_local\[\d+\]\.thread_elements\(\)\[\d\]") and "if (" in src
    assert "make_filled_simdgroup_matrix<float, 8, 8>" in src


def test_store_with_conversion_stays_per_lane():
    """A float accumulator into a half C: simdgroup_store cannot convert, so lanes store half2."""

    @T.prim_func
    def main(A: T.Tensor((64, 32), "float16"), B: T.Tensor((32, 64), "float16"), C: T.Tensor((64, 64), "float16")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            A_s = T.alloc_shared((64, 32), "float16")
            B_s = T.alloc_shared((32, 64), "float16")
            C_local = T.alloc_fragment((64, 64), "float32")
            T.clear(C_local)
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.gemm(A_s, B_s, C_local)
            T.copy(C_local, C)

    src = lower_source(main, E.plain_metal_target())
    assert "simdgroup_store(C_local" not in src
    assert "*(device half2*)(C + " in src


def test_shared_c_paths():
    func = shared_c_gemm(128, 128, 128, 32, 64, 32)
    mpp = lower_source(func, E.metal4_target())
    assert "mpp::tensor_ops::matmul2d" in mpp and "cooperative_tensor" in mpp
    plain = lower_source(func, E.plain_metal_target())
    assert "mpp::tensor_ops::matmul2d" not in plain and "MetalPerformancePrimitives" not in plain
    assert "simdgroup_multiply_accumulate" in plain


# ---------------------------------------------------------------- packed 16-byte copies


@pytest.mark.parametrize("dtype,matrix", [("bfloat16", "simdgroup_bfloat8x8"), ("float16", "simdgroup_half8x8")])
def test_staging_copies_are_16_byte_moves(dtype, matrix):
    src = lower_source(one_tile_gemm(dtype), E.plain_metal_target())
    assert matrix in src
    copies = _lines(src, r"\*\(threadgroup uint4\*\)")
    assert copies and all("= *(const device uint4*)(" in line for line in copies)
    scalar = "bfloat" if dtype == "bfloat16" else "half"
    assert f"*(threadgroup {scalar}*)" not in src and f"*(threadgroup {scalar}4*)" not in src


def test_unaligned_staging_is_not_packed():
    """Rows of 16 + 1 halves: a 16-byte move would be misaligned, so none is emitted."""
    src = lower_source(one_tile_gemm("float16", pad=1), E.plain_metal_target())
    assert "uint4" not in src


# ---------------------------------------------------------------- direct-global source shape


@pytest.fixture(scope="module")
def direct_global_fp16():
    return lower_source(E.gemm_direct_global(128, 256, 128, 64, 128, out_dtype="float16"), E.metal4_target())


def test_direct_global_source_shape(direct_global_fp16):
    src = direct_global_fp16
    assert "mpp::tensor_ops::matmul2d" in src
    assert "const device half* __restrict A" in src and "const device half* __restrict B" in src
    assert "device half* __restrict C" in src
    assert "[[simdgroup_index_in_threadgroup]]" in src
    assert "const ushort __lane = __metal_get_thread_index_in_simdgroup(ushort());" in src
    assert "[[thread_index_in_simdgroup]]" not in src
    assert "max_total_threads_per_threadgroup(128)" in src
    assert "threadgroup half" not in src and "threadgroup_barrier" not in src
    assert "thread float C_ct" not in src
    assert "blockIdx.x" in src and "blockIdx.y" in src
    # one tile pointer per operand per K step; the operand loads are constant offsets from it
    assert re.search(r"const device half\* __src = \(A \+ \(__off\d+ \+ \(k_outer \* 16\)\)\);", src)
    assert re.search(r"const device half\* __src1 = \(B \+ \(__off\d+ \+ \(k_outer \* \d+\)\)\);", src)
    assert not _lines(src, r"\(A \+ \(.*k_outer") or all("__src" in line for line in _lines(src, r"\(A \+ \(.*k_outer"))


def test_direct_global_store_cast_reads_destination_runs(direct_global_fp16):
    stores = _lines(direct_global_fp16, r"\*\(device half4\*\)\(C \+ ")
    assert len(stores) == 16  # 4 destination tensors x 4 runs of 4 per lane
    assert all(re.search(r"= half4\(\*\(thread float4\*\)\(&C_\w+_ct\d\[(0|4|8|12)\]\)\);$", s) for s in stores), stores


def test_mlx_swizzle_names_the_physical_position():
    src = lower_source(E.gemm_direct_global(512, 256, 128, 64, 128, swizzle_panel=4, swizzle_order="mlx"), E.metal4_target())
    assert "uint3 __physical_blockIdx [[threadgroup_position_in_grid]]" in src
    # physical -> logical arithmetic appears once, in the prelude, unsigned on the attribute itself
    assert _lines(src, r"const int __tile_x = .*\(__physical_blockIdx\.x >> 2u\)")
    assert _lines(src, r"const int __tile_y = .*\(__physical_blockIdx\.y << 2u\) \+ \(__physical_blockIdx\.x & 3u\)")
    assert len(_lines(src, r"__physical_blockIdx")) == 3  # the parameter and the two bindings
    assert "blockIdx.x) >> 2" not in src and "blockIdx.x) & 3" not in src


def user_mapped_mlx(M, N, K, bm, bn, panel):
    """A kernel that launches the MLX grid and maps it itself, and also asks for the MLX swizzle."""
    tiles_m = -(-M // bm)

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn) * panel, T.ceildiv(tiles_m, panel), threads=128) as (bx, by):
            tx = bx // panel
            ty = by * panel + bx % panel
            T.use_swizzle(panel_size=panel, order="mlx")
            if ty < tiles_m:
                T.gemm(A[ty * bm : (ty + 1) * bm, 0:K], B[0:K, tx * bn : (tx + 1) * bn], C[ty * bm : (ty + 1) * bm, tx * bn : (tx + 1) * bn], clear_accum=True)

    return main


def test_user_mapped_mlx_grid_is_named_not_swizzled_again():
    src = lower_source(user_mapped_mlx(512, 256, 128, 64, 128, 4), E.metal4_target())
    assert _lines(src, r"const int __tile_y = .*\(__physical_blockIdx\.x & 3u\)")
    assert "* 32768" not in src  # ty * (bm * K) is computed from the tile, not from by * 4 * (bm * K)
    assert _lines(src, r"__off\d+ = \(\(__tile_y \* 8192\)")
    assert "return;" not in src  # the kernel's own grid: no padding threadgroups
