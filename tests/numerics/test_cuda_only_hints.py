"""CUDA-only hints of TileLang's language on Metal (docs/kernel_vocabulary.md, "CUDA-only hints").

Register-allocation, occupancy, L2 and launch-overlap hints cannot change results, so the Metal
printer drops them: a kernel with the hint prints exactly the MSL of the kernel without it, and a
GEMM carrying all of them runs in the emulator and matches torch. Calls whose semantics Metal
cannot keep (a named barrier over part of the threadgroup) are refused with one line.
"""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import CodegenError

N = 96  # 3 threadgroups of 32 threads

# hint name -> a callable emitting it inside the kernel (A: the kernel's global input)
HINTS = {
    "disable_warp_group_reg_alloc": lambda A: T.disable_warp_group_reg_alloc(),
    "no_set_max_nreg": lambda A: T.no_set_max_nreg(),
    "set_max_nreg": lambda A: T.set_max_nreg(240, 1),
    "inc_max_nreg": lambda A: T.inc_max_nreg(232),
    "dec_max_nreg": lambda A: T.dec_max_nreg(40),
    "annotate_producer_reg_dealloc": lambda A: T.annotate_producer_reg_dealloc(24),
    "annotate_consumer_reg_alloc": lambda A: T.annotate_consumer_reg_alloc(240),
    "annotate_min_blocks_per_sm": lambda A: T.annotate_min_blocks_per_sm(2),
    "annotate_l2_hit_ratio": lambda A: T.annotate_l2_hit_ratio({A: 0.75}),
    "pdl_trigger": lambda A: T.pdl_trigger(),
    "pdl_sync": lambda A: T.pdl_sync(),
}


def scale_kernel(hint=None):
    @T.prim_func
    def scale(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(N // 32, threads=32) as bx:
            if hint is not None:
                hint(A)
            for i in T.Parallel(32):
                B[bx * 32 + i] = A[bx * 32 + i] * 3.0 + 1.0

    return scale


def msl_of(func) -> str:
    return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator").get_kernel_source()


@functools.lru_cache(maxsize=None)
def plain_msl() -> str:
    return msl_of(scale_kernel())


@pytest.mark.parametrize("name", sorted(HINTS))
def test_each_cuda_only_hint_prints_nothing(name):
    assert msl_of(scale_kernel(HINTS[name])) == plain_msl()


@functools.lru_cache(maxsize=None)
def hinted_gemm(M: int, N_: int, K: int, block_M: int = 32, block_N: int = 32, block_K: int = 16):
    """A shared-memory GEMM with a ragged tail in every dimension, carrying every no-op hint where
    CUDA kernels put them (kernel start, before the loads, around the K loop, at the end)."""

    @T.prim_func
    def gemm(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N_), "float16"), C: T.Tensor((M, N_), "float32")):
        with T.Kernel(T.ceildiv(N_, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            T.annotate_min_blocks_per_sm(2)
            T.annotate_l2_hit_ratio({A: 0.5, B: 1.0})
            T.disable_warp_group_reg_alloc()
            T.annotate_producer_reg_dealloc()
            T.annotate_consumer_reg_alloc()
            A_s = T.alloc_shared((block_M, block_K), "float16")
            B_s = T.alloc_shared((block_K, block_N), "float16")
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.pdl_sync()
            T.clear(acc)
            T.dec_max_nreg(40)
            T.inc_max_nreg(232)
            for k in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.set_max_nreg(240, 1)
                T.copy(A[by * block_M, k * block_K], A_s)
                T.copy(B[k * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, acc)
            T.pdl_trigger()
            T.copy(acc, C[by * block_M, bx * block_N])

    return tilelang.compile(gemm, out_idx=[-1], target="metal", execution_backend="emulator")


def test_gemm_with_every_hint_matches_torch():
    M, N_, K = 45, 37, 53  # no dimension a multiple of its tile
    kernel = hinted_gemm(M, N_, K)
    torch.manual_seed(0)
    a, b = torch.randn(M, K).half(), torch.randn(K, N_).half()
    expected = a.float() @ b.float()
    torch.testing.assert_close(kernel(a, b), expected, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(racecheck(kernel, a, b, seeds=(0, 1)), expected, rtol=1e-3, atol=1e-3)


def test_hinted_gemm_propagates_nan_and_inf():
    M, N_, K = 45, 37, 53
    kernel = hinted_gemm(M, N_, K)
    a, b = torch.ones(M, K).half(), torch.ones(K, N_).half()
    a[3, 7] = float("nan")
    a[40, 0] = float("inf")
    out = kernel(a, b)
    assert torch.isnan(out[3]).all() and torch.isinf(out[40]).all() and (out[40] > 0).all()
    rest = torch.ones(M, dtype=torch.bool)
    rest[[3, 40]] = False
    assert torch.equal(out[rest], torch.full((M - 2, N_), float(K)))


def named_barrier_kernel(threads: int, arrive_count: int):
    @T.prim_func
    def reverse(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(64 // threads, threads=threads) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((threads,), "float32")
            S[tx] = A[bx * threads + tx]
            T.sync_threads(1, arrive_count)
            B[bx * threads + tx] = S[threads - 1 - tx]

    return reverse


def test_named_barrier_over_part_of_the_threadgroup_is_refused():
    with pytest.raises(CodegenError) as info:
        tilelang.compile(named_barrier_kernel(64, 32), out_idx=[-1], target="metal", execution_backend="emulator")
    message = str(info.value).strip().splitlines()[-1]
    assert "T.sync_threads(barrier_id=1, arrive_count=32)" in message and "all 64 threads" in message
    assert "T.sync_threads()" in message


def test_named_barrier_over_the_whole_threadgroup_is_a_barrier():
    kernel = tilelang.compile(named_barrier_kernel(32, 32), out_idx=[-1], target="metal", execution_backend="emulator")
    a = torch.randn(64)
    expected = torch.cat([a[:32].flip(0), a[32:].flip(0)])
    assert torch.equal(racecheck(kernel, a, seeds=(0, 1)), expected)


@functools.lru_cache(maxsize=None)
def warp_exchange():
    """Each lane writes threadgroup memory, T.sync_warp(), then reads its neighbour's element:
    CUDA's __syncwarp orders the lanes' memory, so the Metal barrier must carry memory flags.
    (tilelang's ThreadSync adds a threadgroup barrier here as well, so the numbers alone would not
    tell mem_none from the flags: the printed form is checked too.)"""

    @T.prim_func
    def rotate(A: T.Tensor((64,), "float32"), B: T.Tensor((64,), "float32")):
        with T.Kernel(2, threads=32) as bx:
            tx = T.get_thread_binding()
            S = T.alloc_shared((32,), "float32")
            S[tx] = A[bx * 32 + tx] * 2.0
            T.sync_warp()
            B[bx * 32 + tx] = S[(tx + 1) % 32]

    return tilelang.compile(rotate, out_idx=[-1], target="metal", execution_backend="emulator")


def test_sync_warp_is_a_simdgroup_barrier_that_orders_memory():
    kernel = warp_exchange()
    assert "simdgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);" in kernel.get_kernel_source()
    a = torch.randn(64)
    expected = torch.cat([(a[:32] * 2).roll(-1), (a[32:] * 2).roll(-1)])
    assert torch.equal(kernel(a), expected)


REFUSED = {
    "named_barrier_arrive": (lambda: T.named_barrier_arrive(1, 32), "T.sync_threads()"),
    "sync_grid": (lambda: T.sync_grid(), "split the kernel"),
    "fence_proxy_async": (lambda: T.fence_proxy_async(), "drop it"),
    "warpgroup_arrive": (lambda: T.warpgroup_arrive(), "T.gemm on Metal is synchronous"),
    "warpgroup_commit_batch": (lambda: T.warpgroup_commit_batch(), "T.gemm on Metal is synchronous"),
    "warpgroup_wait": (lambda: T.warpgroup_wait(0), "T.gemm on Metal is synchronous"),
    "wait_wgmma": (lambda: T.wait_wgmma(0), "T.gemm on Metal is synchronous"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_nvidia_only_synchronisation_is_refused_with_the_fix(name):
    call, fix = REFUSED[name]
    with pytest.raises(CodegenError) as info:
        msl_of(scale_kernel(lambda A: call()))
    message = str(info.value).strip().splitlines()[-1]
    assert message.startswith(f"T.{name}") and fix in message
