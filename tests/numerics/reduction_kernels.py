"""Kernels shared by the reduction tests. One kernel does every reduction kind along both axes of
one fragment, so one emulator build covers a whole layout configuration."""

from __future__ import annotations

import functools

import tilelang
import tilelang.language as T

KINDS = ("sum", "abssum", "max", "min", "absmax")


def compile_emulated(func):
    return tilelang.compile(func, target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def fragment_reductions(M: int, N: int, threads: int, dtype: str, clear: bool):
    """R1[k, i] = reduce_k over j of A[i, j], R0[k, j] = reduce_k over i of A[i, j]; with
    `clear=False` the reductions fold into the initial R1 / R0 (read from I1 / I0)."""

    @T.prim_func
    def main(
        A: T.Tensor((M, N), dtype),
        I1: T.Tensor((5, M), dtype),
        I0: T.Tensor((5, N), dtype),
        R1: T.Tensor((5, M), dtype),
        R0: T.Tensor((5, N), dtype),
    ):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), dtype)
            T.copy(A, a)
            for k, kind in enumerate(KINDS):
                r1 = T.alloc_fragment((M,), dtype)
                r0 = T.alloc_fragment((N,), dtype)
                if not clear:
                    T.copy(I1[k, :], r1)
                    T.copy(I0[k, :], r0)
                T.reduce(a, r1, kind, 1, clear)
                T.reduce(a, r0, kind, 0, clear)
                T.copy(r1, R1[k, :])
                T.copy(r0, R0[k, :])

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def row_max_sum_in_loop(M: int, N: int, steps: int, threads: int):
    """Out[i] = sum over s of max_j A[s, i, j]: one reduction per loop step reusing its scratch
    (threadgroup memory when rows span simdgroups), so a missing write-after-read barrier shows."""

    @T.prim_func
    def main(A: T.Tensor((steps, M, N), "float32"), Out: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), "float32")
            col = T.alloc_fragment((N,), "float32")
            acc = T.alloc_fragment((N,), "float32")
            T.fill(acc, 0.0)
            for s in T.serial(steps):
                T.copy(A[s, :, :], a)
                T.reduce_max(a, col, dim=0)
                for j in T.Parallel(N):
                    acc[j] += col[j]
            T.copy(acc, Out)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def shared_reductions(M: int, N: int, threads: int):
    """Reductions of a shared tile into a shared and a fragment destination:
    S1[i] = sum_j A[i, j] (shared -> shared, clear=False onto I1), S0[j] = min_i A[i, j]."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), I1: T.Tensor((M,), "float32"), S1: T.Tensor((M,), "float32"), S0: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_shared((M, N), "float32")
            s1 = T.alloc_shared((M,), "float32")
            s0 = T.alloc_fragment((N,), "float32")
            T.copy(A, a)
            T.copy(I1, s1)
            T.reduce_sum(a, s1, dim=1, clear=False)
            T.reduce_min(a, s0, dim=0)
            T.copy(s1, S1)
            T.copy(s0, S0)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def scans(M: int, N: int, threads: int, dtype: str):
    """C1 = cumsum of A along axis 1 (shared, in place), C0 = reverse cumsum along axis 0 of a
    fragment, X = cummax along axis 1."""

    @T.prim_func
    def main(A: T.Tensor((M, N), dtype), C1: T.Tensor((M, N), dtype), C0: T.Tensor((M, N), dtype), X: T.Tensor((M, N), dtype)):
        with T.Kernel(1, threads=threads):
            s = T.alloc_shared((M, N), dtype)
            m = T.alloc_shared((M, N), dtype)
            f = T.alloc_fragment((M, N), dtype)
            T.copy(A, s)
            T.copy(A, f)
            T.cummax(s, m, dim=1)
            T.cumsum(s, dim=1)
            T.cumsum(f, dim=0, reverse=True)
            T.copy(s, C1)
            T.copy(f, C0)
            T.copy(m, X)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def reducer_column_max(M: int, N: int, threads: int, start: float):
    """Out[j] = max(start, max_i A[i, j]) through T.alloc_reducer / reducer_update / finalize_reducer."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), Out: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=threads):
            acc = T.alloc_reducer((N,), "float32", op="max")
            out = T.alloc_fragment((N,), "float32")
            T.reducer_init(acc, start)
            for i, j in T.Parallel(M, N):
                T.reducer_update(acc[j], A[i, j])
            T.finalize_reducer(acc, out)
            T.copy(out, Out)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def legacy_reducer_column_sum(M: int, N: int, threads: int):
    """Out[j] = sum_i A[i, j] through the v1 reducer (alloc_reducer(replication="all") + in-place finalize)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        @T.prim_func
        def main(A: T.Tensor((M, N), "float32"), Out: T.Tensor((N,), "float32")):
            with T.Kernel(1, threads=threads):
                o = T.alloc_reducer((N,), "float32", op="sum", replication="all")
                T.clear(o)
                for i, j in T.Parallel(M, N):
                    o[j] += A[i, j]
                T.finalize_reducer(o)
                T.copy(o, Out)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def bitwise_row_reductions(M: int, N: int, threads: int):
    """R[k, i] = bitand / bitor / bitxor over j of A[i, j] (int32)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "int32"), R: T.Tensor((3, M), "int32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), "int32")
            T.copy(A, a)
            for k, kind in enumerate(("bitand", "bitor", "bitxor")):
                r = T.alloc_fragment((M,), "int32")
                T.reduce(a, r, kind, 1, True)
                T.copy(r, R[k, :])

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def thread_local_row_sum(rows: int, width: int):
    """B[t] = sum_i A[t, i] with a thread-private `local` buffer reduced into a `local` scalar."""

    @T.prim_func
    def main(A: T.Tensor((rows, width), "float16"), B: T.Tensor((rows,), "float16")):
        with T.Kernel(1, threads=rows):
            tx = T.get_thread_binding()
            a = T.alloc_local((width,), "float16")
            s = T.alloc_local((1,), "float16")
            for i in T.serial(width):
                a[i] = A[tx, i]
            T.reduce_sum(a, s, dim=0)
            B[tx] = s[0]

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def reductions_laid_out_by_their_copies(M: int, N: int, threads: int):
    """Destinations whose only other use is the T.copy to global memory after the reduction, so that
    copy, not the reduction, gives them their layout: Max[i] = max_j A[i, j],
    Sum[i] = I[i] + sum_j A[i, j] (clear=False), ColMin[j] = min_i A[i, j]."""

    @T.prim_func
    def main(
        A: T.Tensor((M, N), "float32"),
        I: T.Tensor((M,), "float32"),
        Max: T.Tensor((M,), "float32"),
        Sum: T.Tensor((M,), "float32"),
        ColMin: T.Tensor((N,), "float32"),
    ):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), "float32")
            row_max = T.alloc_fragment((M,), "float32")
            row_sum = T.alloc_fragment((M,), "float32")
            col_min = T.alloc_fragment((N,), "float32")
            T.copy(A, a)
            T.copy(I, row_sum)
            T.reduce_max(a, row_max, dim=1)
            T.reduce_sum(a, row_sum, dim=1, clear=False)
            T.reduce_min(a, col_min, dim=0)
            T.copy(row_max, Max)
            T.copy(row_sum, Sum)
            T.copy(col_min, ColMin)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def row_max_then_copy(M: int, N: int, threads: int):
    """R[i] = max_j A[i, j] into a fragment whose layout comes from the T.copy after the reduction."""

    @T.prim_func
    def main(A: T.Tensor((M, N), "float32"), R: T.Tensor((M,), "float32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((M, N), "float32")
            r = T.alloc_fragment((M,), "float32")
            T.copy(A, a)
            T.reduce_max(a, r, dim=1)
            T.copy(r, R)

    return compile_emulated(main)
