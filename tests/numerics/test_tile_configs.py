"""Tile configurations of the fastest Metal GEMMs (MLX's NAX kernels): 8 and 16 simdgroups (256 /
512 threads) on 128x128 and 64x128 tiles, i.e. per-simdgroup tiles of 32x64, 32x32 and 16x32, on
every path: the simdgroup fallback (`metal`), direct-global cooperative tensors and shared
cooperative tensors (`metal4`). Each runs in the emulator against torch, and its structure is
checked with the emulator's counters and the MSL, never with times:
- matrix operations per threadgroup are exactly the tile's;
- direct-global: no threadgroup memory, no barrier, no predicated access, each simdgroup reads its
  own A rows and B columns once per K step;
- shared: every global -> threadgroup copy is a 16-byte move, every operand element is read from
  device memory once per threadgroup, the threadgroup tiles are padded by 8 elements per row so a
  row stride is not a multiple of the 128-byte bank width (rows do not all start in the same bank),
  and the kernel fits Metal's 32 KiB of threadgroup memory.
K is small (two K steps of 32, or 64 where 512 threads share a 64-row tile) so the suite stays fast; kernels are compiled once per module.
"""


import re

import pytest
import tilelang.language as T
from tests.gemm_support import assert_close, compile_emulated, operands
from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters
from tilelang_metal.gemm import GemmPlan, recorded_plans
from tilelang_metal.target.isa import COOPERATIVE_TENSOR_KIND
from tilelang_metal.target.limits import THREADGROUP_MEMORY_BYTES

CONFIGS = [(128, 128, 256), (128, 128, 512), (64, 128, 256), (64, 128, 512)]  # block_M, block_N, threads
PATHS = ("metal_simdgroup", "metal4_direct_global", "metal4_shared")


def block_k(bm: int, threads: int) -> int:
    """32, or deeper when the A tile would give a thread fewer than 8 halves (one 16-byte copy)."""
    return max(32, 8 * threads // bm)


PAD = 8  # elements added to each threadgroup row: 16 bytes for fp16, keeps 16-byte copies aligned
BANK_BYTES = 128  # 32 banks of 4 bytes
MSL_SIZES = {"half": 2, "bfloat": 2, "float": 4, "uchar": 1, "char": 1, "int": 4, "uint": 4}


def padded_shared_gemm(M, N, K, bm, bn, bk, threads, pad=PAD):
    """Shared A/B staging with padded rows, register accumulator, T.copy out (fp16 -> fp32)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk + pad), "float16")
            B_s = T.alloc_shared((bk, bn + pad), "float16")
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                T.copy(A[by * bm, ko * bk], A_s[0:bm, 0:bk])
                T.copy(B[ko * bk, bx * bn], B_s[0:bk, 0:bn])
                T.gemm(A_s[0:bm, 0:bk], B_s[0:bk, 0:bn], C_f)
            T.copy(C_f, C[by * bm, bx * bn])

    return main


_cache: dict = {}


def built(path: str, bm: int, bn: int, threads: int):
    """(kernel, plan, M, N, K, out dtype) for one configuration; two threadgroups along N."""
    key = (path, bm, bn, threads)
    if key not in _cache:
        M, N, bk = bm, 2 * bn, block_k(bm, threads)
        K = 2 * bk
        with recorded_plans() as plans:
            if path == "metal4_direct_global":
                func, target, out = E.gemm_direct_global(M, N, K, bm, bn, threads=threads), E.metal4_target(), "float16"
            else:
                target = E.plain_metal_target() if path == "metal_simdgroup" else E.metal4_target()
                func, out = padded_shared_gemm(M, N, K, bm, bn, bk, threads), "float32"
            kernel = compile_emulated(func, target)
        gemm_plans = [p for p in plans if isinstance(p, GemmPlan)]  # staging decisions are recorded too
        _cache[key] = (kernel, gemm_plans[0], M, N, K, out)
    return _cache[key]


def _threadgroup_bytes(src: str) -> int:
    return sum(MSL_SIZES[t] * int(n) for t, n in re.findall(r"^\s*threadgroup (\w+) \w+\[(\d+)\];", src, re.M))


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("bm,bn,threads", CONFIGS)
def test_tile_configuration(path, bm, bn, threads):
    kernel, plan, M, N, K, out_dtype = built(path, bm, bn, threads)
    a, b, ref = operands(M, N, K, "float16", seed=bm + threads)
    out = kernel(a, b)
    assert_close(out, ref, "float16", out_dtype, K, f"{path} {bm}x{bn} threads={threads}")

    part = plan.partition
    assert part.m_warp * part.n_warp == threads // 32
    cooperative = path != "metal_simdgroup"
    assert (plan.instruction.kind == COOPERATIVE_TENSOR_KIND) == cooperative
    src = kernel.get_kernel_source()
    assert f"max_total_threads_per_threadgroup({threads})" in src

    stats = counters(kernel, a, b)
    assert len(stats.threadgroups) == 2
    for tg in stats.threadgroups.values():
        if cooperative:
            assert tg["matmul2d_16x32x16"] == (bm // 16) * (bn // 32) * (K // 16)
        else:
            assert tg["simdgroup_multiply_accumulate_8x8x8"] == (bm // 8) * (bn // 8) * (K // 8)
        assert tg["predicated_device_loads"] == 0 and tg["predicated_device_stores"] == 0
        if path == "metal4_direct_global":
            assert tg["threadgroup_load_bytes"] == 0 and tg["threadgroup_store_bytes"] == 0
            assert tg["threadgroup_barriers"] == 0
            # each simdgroup reads its rows of A and columns of B once per K step
            assert tg["device_load_bytes"] == 2 * K * (bm * part.n_warp + bn * part.m_warp)
            assert tg["device_load_bytes"] == 8 * tg["device_load_instructions"]  # half4 loads
        else:
            assert tg["device_load_bytes"] == 2 * K * (bm + bn)  # each operand element once
            assert tg["device_load_instructions"] * 16 == tg["device_load_bytes"]
            assert tg["threadgroup_store_instructions"] * 16 == tg["threadgroup_store_bytes"] == tg["device_load_bytes"]


@pytest.mark.parametrize("path", ("metal_simdgroup", "metal4_shared"))
@pytest.mark.parametrize("bm,bn,threads", CONFIGS)
def test_shared_layout_is_padded_and_fits(path, bm, bn, threads):
    kernel, *_ = built(path, bm, bn, threads)
    src = kernel.get_kernel_source()
    assert "*(threadgroup uint4*)" in src
    assert _threadgroup_bytes(src) <= THREADGROUP_MEMORY_BYTES
    # the threadgroup tiles as declared: padded rows, so consecutive rows start in different banks
    extents = {int(x) for pair in re.findall(r"threadgroup half\*? ?\w+(?:\[(\d+)\];| = .*// (\d+) elements)", src) for x in pair if x}
    assert {bm * (block_k(bm, threads) + PAD), block_k(bm, threads) * (bn + PAD)} <= extents, extents
    bk = block_k(bm, threads)
    for row_elems in (bk + PAD, bn + PAD):
        assert (2 * row_elems) % BANK_BYTES != 0 and (2 * row_elems) % 16 == 0
    if path == "metal_simdgroup":
        strides = {int(s) for s in re.findall(r"simdgroup_load\([^;]*, (\d+), ulong2\(0, 0\)", src)}
        assert strides == {bk + PAD, bn + PAD}


@pytest.mark.parametrize("bm,bn,threads,per_simdgroup", [(128, 128, 512, (32, 32)), (128, 128, 256, (32, 64)), (64, 128, 256, (32, 32))])
def test_per_simdgroup_tiles(bm, bn, threads, per_simdgroup):
    """The partitions the configurations are named for, and their destination tensors."""
    kernel, plan, *_ = built("metal4_direct_global", bm, bn, threads)
    part = plan.partition
    assert (bm // part.m_warp, bn // part.n_warp) == per_simdgroup
    tensors = set(re.findall(r"auto (\w+_ct\d+) = ", kernel.get_kernel_source()))
    assert len(tensors) == (per_simdgroup[0] // 16) * (per_simdgroup[1] // 32)
