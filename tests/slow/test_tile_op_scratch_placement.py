"""Scratch of the plugin's tile ops (the `<dst>_part` partials of T.reduce_*, the `_scan` accumulator
of T.cumsum) is allocated in a block that encloses the op. It used to go to the next block to finish
in the walk: with the op in a loop outside any block of its own and a later block in the kernel (a
pipelined loop, a T.gemm), that was a sibling, and the lowering stopped with "buffer r_part has
already been defined, the Stmt is not SSA" (issue 18 item 7)."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck


@functools.lru_cache(maxsize=None)
def ops_in_a_loop_then_a_pipelined_loop(threads: int):
    """R[i] = 3 * sum_j A[i, j] (reduce_sum with clear=False in a loop), M[i] = max_j A[i, j] (in
    the same loop), S = cumsum of A along rows in shared memory (in the loop, once per step), then a
    pipelined loop C = B[0] + B[1]."""

    @T.prim_func
    def main(
        A: T.Tensor((4, 4), "float32"),
        B: T.Tensor((2, 8, 48), "float32"),
        R: T.Tensor((4,), "float32"),
        M: T.Tensor((4,), "float32"),
        S: T.Tensor((4, 4), "float32"),
        C: T.Tensor((8, 48), "float32"),
    ):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((4, 4), "float32")
            r = T.alloc_fragment((4,), "float32")
            m = T.alloc_fragment((4,), "float32")
            s = T.alloc_shared((4, 4), "float32")
            b = T.alloc_shared((8, 48), "float32")
            c = T.alloc_fragment((8, 48), "float32")
            T.copy(A, a)
            T.fill(r, 0)
            T.clear(c)
            for k in T.serial(3):
                T.reduce_sum(a, r, dim=1, clear=False)
                T.reduce_max(a, m, dim=1)
                T.copy(A, s)
                T.cumsum(s, dim=1)
            for k in T.Pipelined(2, num_stages=2):
                T.copy(B[k, :, :], b)
                for i, j in T.Parallel(8, 48):
                    c[i, j] += b[i, j]
            T.copy(r, R)
            T.copy(m, M)
            T.copy(s, S)
            T.copy(c, C)

    return tilelang.compile(main, out_idx=[2, 3, 4, 5], target="metal", execution_backend="emulator")


@pytest.mark.parametrize("threads", [96, 128])  # 96: three simdgroups, most threads outside the 4x4 layout
def test_reduction_and_scan_in_a_loop_before_a_pipelined_loop_match_torch(threads):
    torch.manual_seed(threads)
    a, b = torch.randn(4, 4), torch.randn(2, 8, 48)
    r, m, s, c = racecheck(ops_in_a_loop_then_a_pipelined_loop(threads), a, b, seeds=(0, 1))
    torch.testing.assert_close(r, 3 * a.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(m, a.amax(1), rtol=0, atol=0)
    torch.testing.assert_close(s, a.cumsum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(c, b[0] + b[1], rtol=1e-6, atol=1e-6)


@functools.lru_cache(maxsize=None)
def reduction_in_a_loop_before_a_ragged_gemm(M: int, N: int, K: int):
    """O[i] = 3 * sum_j R[i, j] (reduce_sum with clear=False in a loop, stored by threadgroup (0, 0)),
    then C = A @ B on 32x32 tiles that do not divide M and N (the interior / edge split of the GEMM
    duplicates the kernel body)."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "float16"),
        B: T.Tensor((K, N), "float16"),
        R: T.Tensor((4, 4), "float32"),
        C: T.Tensor((M, N), "float32"),
        O: T.Tensor((4,), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32), threads=128) as (bx, by):
            a_s = T.alloc_shared((32, 32), "float16")
            b_s = T.alloc_shared((32, 32), "float16")
            acc = T.alloc_fragment((32, 32), "float32")
            r = T.alloc_fragment((4, 4), "float32")
            rows = T.alloc_fragment((4,), "float32")
            T.clear(acc)
            T.copy(R, r)
            T.fill(rows, 0)
            for k in T.serial(3):
                T.reduce_sum(r, rows, dim=1, clear=False)
            for k in T.Pipelined(T.ceildiv(K, 32), num_stages=1):
                T.copy(A[by * 32, k * 32], a_s)
                T.copy(B[k * 32, bx * 32], b_s)
                T.gemm(a_s, b_s, acc)
            T.copy(acc, C[by * 32, bx * 32])
            if bx == 0 and by == 0:
                T.copy(rows, O)

    return tilelang.compile(main, out_idx=[3, 4], target="metal", execution_backend="emulator")


def test_reduction_in_a_loop_before_a_ragged_gemm_matches_torch():
    M, N, K = 50, 40, 37
    torch.manual_seed(1)
    a, b, r = torch.randn(M, K).half(), torch.randn(K, N).half(), torch.randn(4, 4)
    c, o = racecheck(reduction_in_a_loop_before_a_ragged_gemm(M, N, K), a, b, r, seeds=(0, 1))
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(o, 3 * r.sum(1), rtol=1e-5, atol=1e-5)
