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

from typing import Any, Optional

import tilelang.language as T

from .gemm import check_gemm_arguments, copy_runs, staged_pads
from .gemm_batched import check_batch
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
    batch: Optional[int] = None,
    shared_B: bool = False,
) -> Any:
    """The split-K module as a `T.prim_func` (compile with `out_idx=[-1]`). `copy_in_runs`: as in
    kernels.gemm_staged (operands whose row pitch is not a multiple of 16 bytes). `batch`: A
    (batch, M, K), B (batch, K, N) or with `shared_B` (K, N), C (batch, M, N); kernel 1's z axis
    runs batch x slices, kernel 2's z axis the batch."""
    out_dtype = out_dtype or dtype
    integer_sizes("gemm_split_k", M=M, N=N, K=K)  # no T.dynamic: the slices of K are planned here
    M, N, K, splits, block_m, block_n, block_k, threads, _, num_stages = check_gemm_arguments(
        "gemm_split_k", M=M, N=N, K=K, splits=splits, block_m=block_m, block_n=block_n, block_k=block_k, threads=threads,
        num_stages=num_stages)
    (reduce_threads,) = integer_sizes("gemm_split_k", minimum=1, reduce_threads=reduce_threads)
    if reduce_threads > 1024:
        raise ValueError(f"gemm_split_k reduce_threads={reduce_threads} is over Metal's 1024 threads per threadgroup; use 128")
    check_split_k(M, N, K, splits, block_k, dtype, out_dtype)
    batch = check_batch("split-K", batch, shared_B)
    if batch and copy_in_runs:
        raise ValueError("split-K copy_in_runs reads 2-D operands only; pass copy_in_runs=() with batch=")
    splits = effective_splits(K, splits, block_k)
    per_slice = slice_k(K, splits, block_k)
    steps = per_slice // block_k
    reduce_cols = reduce_threads  # kernel 2: one thread per output element of a row segment
    unknown = set(copy_in_runs) - {"A", "B"}
    if unknown:
        raise ValueError(f"copy_in_runs: {sorted(unknown)} is not an operand; name 'A' and / or 'B'")
    copy_a = copy_runs((M, K), (block_m, block_k), dtype, threads) if "A" in copy_in_runs else None
    copy_b = copy_runs((K, N), (block_k, block_n), dtype, threads) if "B" in copy_in_runs else None

    batches = batch or 1
    lead = (batch,) if batch else ()
    b_per_batch = bool(batch) and not shared_B
    # staged slices (plain metal) get padded rows; unstaged ones (metal4) dense buffers, which the staging bypass drops
    a_pad, b_pad = staged_pads((block_m, block_k), (block_k, block_n), num_stages, dtype) if num_stages else (0, 0)
    reduce_grid = (T.ceildiv(N, reduce_cols), M, batch) if batch else (T.ceildiv(N, reduce_cols), M)

    def slice_and_batch(bzs: Any) -> tuple[Any, Any]:  # unbatched: the z axis is the slice (the batch is never read)
        return (bzs % splits, bzs // splits) if batch else (bzs, 0)

    def reduce_ids(blocks: Any) -> tuple[Any, Any, Any]:
        return tuple(blocks) if batch else (blocks[0], blocks[1], 0)

    @T.prim_func
    def main(A: T.Tensor((*lead, M, K), dtype), B: T.Tensor((*(lead if b_per_batch else ()), K, N), dtype),
             C: T.Tensor((*lead, M, N), out_dtype)):
        partials = T.alloc_global((batches * splits, M, N), ACCUM)  # slice s of batch z at z * splits + s
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), batches * splits, threads=threads) as (bx, by, bzs):
            bz, z = T.meta_var(slice_and_batch(bzs))
            A_s = T.alloc_shared((block_m, block_k + a_pad), dtype)  # rows padded: no bank conflicts (kernels.gemm.staged_pads)
            B_s = T.alloc_shared((block_k, block_n + b_pad), dtype)
            acc = T.alloc_fragment((block_m, block_n), ACCUM)
            T.clear(acc)
            for ko in T.Pipelined(steps, num_stages=num_stages):
                k0 = bz * per_slice + ko * block_k
                if copy_a is not None:
                    copy_a(A, A_s, by * block_m, k0)
                elif batch:
                    T.copy(A[z, by * block_m : (by + 1) * block_m, k0 : k0 + block_k], A_s[0:block_m, 0:block_k])
                else:
                    T.copy(A[by * block_m, k0], A_s[0:block_m, 0:block_k])
                if copy_b is not None:
                    copy_b(B, B_s, k0, bx * block_n)
                elif b_per_batch:
                    T.copy(B[z, k0 : k0 + block_k, bx * block_n : (bx + 1) * block_n], B_s[0:block_k, 0:block_n])
                else:
                    T.copy(B[k0, bx * block_n], B_s[0:block_k, 0:block_n])
                T.gemm(A_s[0:block_m, 0:block_k], B_s[0:block_k, 0:block_n], acc)
            T.copy(acc, partials[bzs, by * block_m, bx * block_n])

        with T.Kernel(*reduce_grid, threads=reduce_threads) as blocks:
            bx, m, zr = T.meta_var(reduce_ids(blocks))
            n = bx * reduce_cols + T.get_thread_binding()
            if n < N:
                total = T.alloc_local((1,), ACCUM)
                total[0] = partials[zr * splits, m, n]
                for s in T.serial(1, splits):
                    total[0] += partials[zr * splits + s, m, n]
                if batch:
                    C[zr, m, n] = T.cast(total[0], out_dtype)
                else:
                    C[m, n] = T.cast(total[0], out_dtype)

    return main
