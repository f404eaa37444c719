"""GEMV kernels for Metal, written in TileLang: C = A @ B when M or N is small (at most
`GEMV_MAX_ROWS`), the shapes a 64x128 GEMM tile would mostly leave idle.

Both take the GEMM's parameters `(A (M, K), B (K, N), C (M, N))`, so `kernels.matmul` can route a
problem to them without changing the call:

- `gemv_small_m` (y = x^T B, a few rows of x; M = 1 is decoding's `x @ W`): each thread owns
  `vec` neighbouring columns of B and reads them with one vector load per K row (B is row-major:
  its rows are contiguous along N), for every row of A at once; the threadgroup's `k_groups`
  groups of threads take interleaved rows of K and add their partials in threadgroup memory.
- `gemv_small_n` (y = A x, a few columns of x): one simdgroup per row of A, lanes read `vec`
  neighbouring elements along K (A's contiguous axis) and the row's partials are summed with a
  simd reduction (`T.warp_reduce_sum`).

Inputs float16, bfloat16 or float32; accumulation in float32, one rounding at the store. Any N and
K: the tails are guarded (vector loads only where the whole vector is in bounds; the printer makes
them element loads where the start is not provably aligned). K = 0 gives C = 0, as torch does.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any

import tilelang.language as T

ACCUM = "float32"
GEMV_MAX_ROWS = 8  # rows of the small side the GEMV kernels accept (and kernels.matmul routes to them)
DTYPES = ("float16", "bfloat16", "float32")


def _check(small_name: str, small: int, dtype: str, out_dtype: str, vec: int) -> None:
    if not 1 <= small <= GEMV_MAX_ROWS:
        raise ValueError(f"GEMV needs 1 <= {small_name} <= {GEMV_MAX_ROWS} (got {small_name}={small}); use kernels.matmul, which routes larger shapes to a GEMM")
    for name, value in (("dtype", dtype), ("out_dtype", out_dtype)):
        if value not in DTYPES:
            raise ValueError(f"GEMV {name}={value!r} is not supported; use one of {', '.join(DTYPES)}")
    if vec not in (1, 2, 4):
        raise ValueError(f"GEMV vec={vec} must be 1, 2 or 4 (Metal vectors have at most 4 lanes)")


def gemv_small_m(
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "float16",
    out_dtype: str | None = None,
    vec: int = 4,
    lanes: int = 32,
    k_groups: int = 4,
) -> Any:
    """C (M, N) = A (M, K) @ B (K, N) for M <= GEMV_MAX_ROWS: a threadgroup covers `lanes * vec`
    columns with `lanes * k_groups` threads; returns a `T.prim_func`."""
    out_dtype = out_dtype or dtype
    _check("M", M, dtype, out_dtype, vec)
    block_n = lanes * vec

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_n), threads=(lanes, k_groups)) as bx:
            lane = T.get_thread_binding(0)
            group = T.get_thread_binding(1)
            partial = T.alloc_shared((k_groups, M, block_n), ACCUM)
            acc = T.alloc_local((M, vec), ACCUM)
            b = T.alloc_local((vec,), dtype)
            T.clear(acc)
            n0 = bx * block_n + lane * vec
            for kk in T.serial(T.ceildiv(K, k_groups)):
                k = kk * k_groups + group  # neighbouring groups read neighbouring rows of B
                if k < K:
                    if n0 + vec <= N:
                        for v in T.vectorized(vec):
                            b[v] = B[k, n0 + v]
                    else:
                        for v in T.serial(vec):
                            b[v] = T.if_then_else(n0 + v < N, B[k, T.min(n0 + v, N - 1)], T.cast(0, dtype))
                    for m in T.serial(M):
                        a = T.cast(A[m, k], ACCUM)
                        for v in T.serial(vec):
                            acc[m, v] += a * T.cast(b[v], ACCUM)
            for m in T.serial(M):
                for v in T.serial(vec):
                    partial[group, m, lane * vec + v] = acc[m, v]
            # every thread sums some outputs' partials (a loop with a guarded body: no thread skips a barrier)
            threads = lanes * k_groups
            for o in T.serial(T.ceildiv(M * block_n, threads)):
                flat = o * threads + group * lanes + lane
                m = flat // block_n
                col = flat % block_n
                if flat < M * block_n and bx * block_n + col < N:
                    total = T.alloc_local((1,), ACCUM)
                    total[0] = partial[0, m, col]
                    for g in T.serial(1, k_groups):
                        total[0] += partial[g, m, col]
                    C[m, bx * block_n + col] = T.cast(total[0], out_dtype)

    return main


def gemv_small_n(
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "float16",
    out_dtype: str | None = None,
    vec: int = 4,
    rows: int = 4,
) -> Any:
    """C (M, N) = A (M, K) @ B (K, N) for N <= GEMV_MAX_ROWS: `rows` simdgroups per threadgroup,
    one row of A each; returns a `T.prim_func`."""
    out_dtype = out_dtype or dtype
    _check("N", N, dtype, out_dtype, vec)
    lanes = 32
    step = lanes * vec

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(M, rows), threads=(lanes, rows)) as bx:
            lane = T.get_thread_binding(0)
            m = bx * rows + T.get_thread_binding(1)
            acc = T.alloc_local((N,), ACCUM)
            a = T.alloc_local((vec,), dtype)
            T.clear(acc)
            for kb in T.serial(T.ceildiv(K, step)):
                k0 = kb * step + lane * vec
                if m < M and k0 < K:
                    if k0 + vec <= K:
                        for v in T.vectorized(vec):
                            a[v] = A[m, k0 + v]
                    else:
                        for v in T.serial(vec):
                            a[v] = T.if_then_else(k0 + v < K, A[m, T.min(k0 + v, K - 1)], T.cast(0, dtype))
                    for n in T.serial(N):
                        for v in T.serial(vec):
                            if k0 + v < K:
                                acc[n] += T.cast(a[v], ACCUM) * T.cast(B[k0 + v, n], ACCUM)
            for n in T.serial(N):
                total = T.warp_reduce_sum(acc[n])
                if lane == 0 and m < M:
                    C[m, n] = T.cast(total, out_dtype)

    return main
