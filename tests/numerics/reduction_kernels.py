"""Kernels shared by the reduction tests: each kernel does many reductions, so one emulator build
covers every reduction kind, both axes and both `clear` modes for one layout configuration."""

from __future__ import annotations

import functools

import tilelang
import tilelang.language as T

KINDS = ("sum", "abssum", "max", "min", "absmax")
_REDUCE = {
    "sum": T.reduce_sum,
    "abssum": T.reduce_abssum,
    "max": T.reduce_max,
    "min": T.reduce_min,
    "absmax": T.reduce_absmax,
}


def compile_emulated(func):
    return tilelang.compile(func, target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def fragment_reductions(M: int, N: int, threads: int, dtype: str):
    """Outputs (all float32 except `O*` of `dtype`):
    R1[k, i] = reduce_k over j of A[i, j] (clear), R0[k, j] over i (clear),
    C1[k, i] = reduce_k(init1[k, i], A[i, :]), C0[k, j] likewise with clear=False."""

    @T.prim_func
    def main(
        A: T.Tensor((M, N), dtype),
        I1: T.Tensor((5, M), dtype),
        I0: T.Tensor((5, N), dtype),
        R1: T.Tensor((5, M), dtype),
        R0: T.Tensor((5, N), dtype),
        C1: T.Tensor((5, M), dtype),
        C0: T.Tensor((5, N), dtype),
    ):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), dtype)
            T.copy(A, a)
            for k, kind in enumerate(KINDS):
                r1 = T.alloc_fragment((M,), dtype)
                r0 = T.alloc_fragment((N,), dtype)
                c1 = T.alloc_fragment((M,), dtype)
                c0 = T.alloc_fragment((N,), dtype)
                _REDUCE[kind](a, r1, dim=1)
                _REDUCE[kind](a, r0, dim=0)
                T.copy(I1[k, :], c1)
                T.copy(I0[k, :], c0)
                T.reduce(a, c1, kind, 1, False)
                T.reduce(a, c0, kind, 0, False)
                T.copy(r1, R1[k, :])
                T.copy(r0, R0[k, :])
                T.copy(c1, C1[k, :])
                T.copy(c0, C0[k, :])

    return compile_emulated(main)
