"""The interior/edge branch of tilelang-lowered GEMM kernels (transform/interior_split.py) on the MSL."""

from __future__ import annotations

import re

import tilelang.language as T
from gemm_support import lower_source

from tilelang_metal import kernels as E


def _uniform_condition(source: str) -> str:
    match = re.search(r"if \((.*)\) \{  // threadgroup-uniform", source)
    assert match, "no threadgroup-uniform branch"
    return match.group(1)


def _ragged_with_first_row_special(M=200, N=200, K=64, bm=64, bn=64, bk=32):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for ko in T.serial(T.ceildiv(K, bk)):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(bm, bn):
                if by == 0:  # not an edge guard: true for the first row of threadgroups only
                    acc[i, j] = acc[i, j] + 1.0
            T.copy(acc, C[by * bm, bx * bn])

    return main


def test_interior_is_every_whole_tile_of_a_ragged_shared_kernel(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")
    cond = _uniform_condition(lower_source(E.gemm_shared(200, 200, 64), E.plain_metal_target()))
    assert cond.replace(" ", "") == "((((int)blockIdx.x)<3)&&(((int)blockIdx.y)<3))"


def test_a_guard_that_is_not_about_the_edge_does_not_shrink_the_interior(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", "0")
    source = lower_source(_ragged_with_first_row_special(), E.plain_metal_target())
    assert _uniform_condition(source).replace(" ", "") == "((((int)blockIdx.x)<3)&&(((int)blockIdx.y)<3))"
    interior = source.split("// threadgroup-uniform", 1)[1].split("} else {  // threadgroup-uniform", 1)[0]
    assert "blockIdx.y) == 0" in interior  # kept where it matters


def test_aligned_kernel_has_no_branch():
    assert "threadgroup-uniform" not in lower_source(E.gemm_shared(256, 256, 64), E.plain_metal_target())
