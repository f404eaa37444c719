"""Split-K GEMM for Metal, written in TileLang: C = A @ B when K is long and the output tiles too few
to fill the GPU (64x4096x4096 gives 32 threadgroups of 64x128).

Two kernels in one module, deterministic (no atomics): kernel 1 launches one threadgroup per
(output tile, K slice) and writes each slice's float32 partial tile to a workspace
`T.alloc_global((splits, M, N), "float32")` (the host allocates it per call, docs/guide.md); kernel
2 sums the slices in a fixed order and rounds once to C's dtype. The same inputs give bitwise the
same C on every run and every schedule. Parameters `(A (M, K), B (K, N), C (M, N))`, as the other
GEMMs, so `kernels.matmul` can route to it.

Each slice is a whole number of `block_k` steps (`slice_k`), so only the last slice meets the end of
K; its tail is zero-filled by T.copy's bounds guard. `effective_splits` drops slices that would be
empty (K = 100 in 8 slices of 16 is 7 slices).

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any

import tilelang.language as T

from .gemm import check_gemm_arguments, copy_runs
from .sizes import integer_sizes

ACCUM = "float32"
DTYPES = ("float16", "bfloat16", "float32")


def slice_k(K: int, splits: int, block_k: int) -> int:
    """K elements per slice: the `ceil(K / block_k)` steps shared out evenly, in whole steps."""
    steps = -(-K // block_k)
    return -(-steps // splits) * block_k


def effective_splits(K: int, splits: int, block_k: int) -> int:
    """Slices that hold at least one element of K."""
    return max(1, -(-K // slice_k(K, splits, block_k)))


def check_split_k(M: int, N: int, K: int, splits: int, block_k: int, dtype: str, out_dtype: str) -> None:
    """Refuse, in one line, a split-K configuration the kernel cannot run."""
    if min(M, N, K) <= 0:
        raise ValueError(f"split-K needs M, N, K >= 1 (got {M}x{N}x{K}); a K of 0 has nothing to split: use kernels.matmul")
    if splits < 1:
        raise ValueError(f"split-K needs splits >= 1 (got {splits})")
    if block_k <= 0 or block_k % 8:
        raise ValueError(f"split-K block_k={block_k} must be a positive multiple of 8 (whole Metal matrix steps); use 16 or 32")
    for name, value in (("dtype", dtype), ("out_dtype", out_dtype)):
        if value not in DTYPES:
            raise ValueError(f"split-K {name}={value!r} is not supported; use one of {', '.join(DTYPES)}")


def gemm_split_k(
    M: int,
    N: int,
    K: int,
    splits: int,
    block_m: int = 64,
    block_n: int = 64,
    block_k: int = 32,
    *,
    dtype: str = "float16",
    out_dtype: str | None = None,
    threads: int = 128,
    num_stages: int = 0,
    reduce_threads: int = 128,
    copy_in_runs: tuple = (),
) -> Any:
    """The split-K module as a `T.prim_func` (compile with `out_idx=[-1]`). `copy_in_runs`: as in
    kernels.gemm_staged (operands whose row pitch is not a multiple of 16 bytes)."""
    out_dtype = out_dtype or dtype
    integer_sizes("gemm_split_k", M=M, N=N, K=K)  # no T.dynamic: the slices of K are planned here
    M, N, K, splits, block_m, block_n, block_k, threads, _, num_stages = check_gemm_arguments(
        "gemm_split_k", M=M, N=N, K=K, splits=splits, block_m=block_m, block_n=block_n, block_k=block_k, threads=threads,
        num_stages=num_stages)
    (reduce_threads,) = integer_sizes("gemm_split_k", minimum=1, reduce_threads=reduce_threads)
    if reduce_threads > 1024:
        raise ValueError(f"gemm_split_k reduce_threads={reduce_threads} is over Metal's 1024 threads per threadgroup; use 128")
    check_split_k(M, N, K, splits, block_k, dtype, out_dtype)
    splits = effective_splits(K, splits, block_k)
    per_slice = slice_k(K, splits, block_k)
    steps = per_slice // block_k
    reduce_cols = reduce_threads  # kernel 2: one thread per output element of a row segment
    unknown = set(copy_in_runs) - {"A", "B"}
    if unknown:
        raise ValueError(f"copy_in_runs: {sorted(unknown)} is not an operand; name 'A' and / or 'B'")
    copy_a = copy_runs((M, K), (block_m, block_k), dtype, threads) if "A" in copy_in_runs else None
    copy_b = copy_runs((K, N), (block_k, block_n), dtype, threads) if "B" in copy_in_runs else None

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        partials = T.alloc_global((splits, M, N), ACCUM)
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), splits, threads=threads) as (bx, by, bz):
            A_s = T.alloc_shared((block_m, block_k), dtype)
            B_s = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), ACCUM)
            T.clear(acc)
            for ko in T.Pipelined(steps, num_stages=num_stages):
                k0 = bz * per_slice + ko * block_k
                if copy_a is not None:
                    copy_a(A, A_s, by * block_m, k0)
                else:
                    T.copy(A[by * block_m, k0], A_s)
                if copy_b is not None:
                    copy_b(B, B_s, k0, bx * block_n)
                else:
                    T.copy(B[k0, bx * block_n], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, partials[bz, by * block_m, bx * block_n])

        with T.Kernel(T.ceildiv(N, reduce_cols), M, threads=reduce_threads) as (bx, m):
            n = bx * reduce_cols + T.get_thread_binding()
            if n < N:
                total = T.alloc_local((1,), ACCUM)
                total[0] = partials[0, m, n]
                for s in T.serial(1, splits):
                    total[0] += partials[s, m, n]
                C[m, n] = T.cast(total[0], out_dtype)

    return main
