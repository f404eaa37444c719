"""The refusal of a kernel over Metal's 32 KiB of threadgroup memory (transform/resource_check.py):
one line naming each threadgroup buffer as declared (dtype, shape, pipeline stages, bytes), the
merged pool they live in, how many bytes must go, and advice for that kind of kernel (GEMM advice
only when a T.gemm reads threadgroup operands)."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import functools
import re

import pytest
import tilelang.language as T
import torch
from gemm_support import compile_emulated, lower_source

from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.target.limits import THREADGROUP_MEMORY_BYTES

THREADS = 128


def _gemv(N, K):
    """C[n] = sum_k A[k] * B[n, k] with the whole vector A staged in threadgroup memory."""

    @T.prim_func
    def main(A: T.Tensor((K,), "float32"), B: T.Tensor((N, K), "float32"), C: T.Tensor((N,), "float32")):
        with T.Kernel(N, threads=THREADS) as bx:
            a_s = T.alloc_shared((K,), "float32")
            acc = T.alloc_fragment((THREADS,), "float32")
            total = T.alloc_fragment((1,), "float32")
            T.copy(A, a_s)
            T.clear(acc)
            for k in T.serial(T.ceildiv(K, THREADS)):
                for t in T.Parallel(THREADS):
                    if k * THREADS + t < K:
                        acc[t] += a_s[k * THREADS + t] * B[bx, k * THREADS + t]
            T.reduce_sum(acc, total, dim=0)
            T.copy(total, C[bx : bx + 1])

    return main


def _two_buffers(N):
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float16"), C: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=THREADS) as bx:
            a_s = T.alloc_shared((N,), "float32")
            b_s = T.alloc_shared((N,), "float16")
            T.copy(A, a_s)
            T.copy(B, b_s)
            for i in T.Parallel(N):
                C[i] = a_s[i] + b_s[i]

    return main


def _pipelined_row_sums(rows, K, block_k, stages):
    @T.prim_func
    def main(A: T.Tensor((rows, K), "float32"), C: T.Tensor((rows,), "float32")):
        with T.Kernel(rows, threads=THREADS) as bx:
            a_s = T.alloc_shared((block_k,), "float32")
            acc = T.alloc_fragment((block_k,), "float32")
            total = T.alloc_fragment((1,), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // block_k, num_stages=stages):
                T.copy(A[bx, k * block_k], a_s)
                for i in T.Parallel(block_k):
                    acc[i] += a_s[i]
            T.reduce_sum(acc, total, dim=0)
            T.copy(total, C[bx : bx + 1])

    return main


def _scaled_a_gemm(M, N, K, bM, bN, bK, stages):
    """C = (2 A) B with the scaled A tile in its own shared buffer: A2_s is not staging only, so the
    staging bypass cannot drop the shared operands."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=THREADS) as (bx, by):
            A_s = T.alloc_shared((bM, bK), "float16")
            A2_s = T.alloc_shared((bM, bK), "float16")
            B_s = T.alloc_shared((bK, bN), "float16")
            C_l = T.alloc_fragment((bM, bN), "float32")
            T.clear(C_l)
            for k in T.Pipelined(T.ceildiv(K, bK), num_stages=stages):
                T.copy(A[by * bM, k * bK], A_s)
                T.copy(B[k * bK, bx * bN], B_s)
                for i, j in T.Parallel(bM, bK):
                    A2_s[i, j] = A_s[i, j] * 2.0
                T.gemm(A2_s, B_s, C_l)
            T.copy(C_l, C[by * bM, bx * bN])

    return main


def _refusal(func, target) -> str:
    with pytest.raises(MetalLoweringError) as info:
        lower_source(func, target)
    text = str(info.value)
    assert "\n" not in text, f"not one line: {text!r}"
    return text


def _needed(text: str) -> int:
    found = re.search(r"needs (\d+) bytes of threadgroup memory", text)
    assert found, text
    return int(found.group(1))


def _assert_in(text: str, *needles: str) -> None:
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text}"


@pytest.mark.parametrize("K", [20000, 8209])  # far over; prime, 68 B over the limit
def test_gemv_names_its_buffer_and_gets_no_gemm_advice(plain_metal, K):
    text = _refusal(_gemv(5, K), plain_metal)
    need = _needed(text)
    assert 4 * K <= need < 4 * K + 64, text  # the pool: a_s plus alignment (the reduction scratch reuses a_s's bytes)
    _assert_in(text, f"a_s float32[{K}] {4 * K} B", f"{need - THREADGROUP_MEMORY_BYTES} bytes must go", f"pool buf_dyn_shmem {need} B")
    _assert_in(text, "smaller tiles for a_s", "T.alloc_fragment instead of T.alloc_shared")
    assert "gemm" not in text.lower() and "direct-global" not in text, text
    assert "Pipelined" not in text, text  # no pipeline in this kernel: no stage advice


@functools.lru_cache(maxsize=None)
def _gemv_at_limit():
    from tilelang_metal.kernels import plain_metal_target

    return compile_emulated(_gemv(3, THREADGROUP_MEMORY_BYTES // 4), plain_metal_target())


def test_gemv_of_exactly_32_kib_runs():
    """The neighbour of the refusal: a_s of exactly 32 KiB (the reduction scratch reuses its bytes)."""
    K = THREADGROUP_MEMORY_BYTES // 4
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(K, generator=g), torch.randn(3, K, generator=g)
    kernel = _gemv_at_limit()
    c = kernel(a, b)
    torch.testing.assert_close(c, b @ a, rtol=1e-4, atol=1e-3)
    racecheck(kernel, a, b)


def test_two_buffers_are_both_named_with_the_excess(metal4):
    N = 6000
    text = _refusal(_two_buffers(N), metal4)
    total = N * 4 + N * 2
    _assert_in(text, f"needs {total} bytes", f"a_s float32[{N}] {N * 4} B", f"b_s float16[{N}] {N * 2} B", f"{total - THREADGROUP_MEMORY_BYTES} bytes must go")
    _assert_in(text, "smaller tiles for a_s, b_s")
    assert "gemm" not in text.lower(), text


def test_pipeline_stages_multiply_the_buffer(plain_metal):
    block_k, stages = 4096, 3
    text = _refusal(_pipelined_row_sums(4, block_k * stages, block_k, stages), plain_metal)
    staged = block_k * 4 * stages
    _assert_in(text, f"a_s float32[{block_k}] x {stages} pipeline stages = {staged} B", f"{staged - THREADGROUP_MEMORY_BYTES} bytes must go")
    _assert_in(text, f"fewer T.Pipelined stages (num_stages={stages} keeps a_s {stages} times)")
    assert "gemm" not in text.lower(), text


@pytest.mark.parametrize("stages", [0, 3])
def test_gemm_with_shared_operands_gets_gemm_advice(plain_metal, stages):
    bM, bN, bK = 128, 128, 64
    text = _refusal(_scaled_a_gemm(128, 128, 128, bM, bN, bK, stages), plain_metal)
    tile = bM * bK * 2
    kept = max(stages, 1)
    assert "T.gemm stages B_s, A2_s in threadgroup memory" in text or "T.gemm stages A2_s, B_s in threadgroup memory" in text, text
    _assert_in(text, "smaller block_M/block_N/block_K tiles", "direct-global GEMM", "A2_s is not written by one T.copy before the T.gemm")
    _assert_in(text, f"A2_s float16[{bM}, {bK}] {tile} B", f"needs {tile * (1 + 2 * kept)} bytes")
    if stages:
        _assert_in(text, f"B_s float16[{bK}, {bN}] x {stages} pipeline stages = {tile * stages} B", "fewer T.Pipelined stages")
    else:
        assert "Pipelined" not in text, text


def test_gemm_kept_staging_says_why(plain_metal, monkeypatch):
    """Staging-only operands with the bypass switched off: the refusal says that is why."""
    from tilelang_metal import kernels as E

    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")
    text = _refusal(E.gemm_shared(256, 256, 64, block_M=128, block_N=128, block_K=32, num_stages=3), plain_metal)
    _assert_in(text, "x 3 pipeline stages", "direct-global GEMM", "TILELANG_METAL_STAGING_BYPASS=0")
