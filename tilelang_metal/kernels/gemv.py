"""GEMV kernels for Metal, written in TileLang: C = A @ B when M or N is small (at most
`GEMV_MAX_ROWS`), the shapes a 64x128 GEMM tile would mostly leave idle.

Both take the GEMM's parameters `(A (M, K), B (K, N), C (M, N))`, so `kernels.matmul` can route a
problem to them without changing the call:

- `gemv_small_m` (y = x^T B, a few rows of x; M = 1 is decoding's `x @ W`): each lane owns
  `vec` neighbouring columns of B and reads them with one vector load per K row (B is row-major:
  its rows are contiguous along N), for every row of A at once; the lanes of a simdgroup split K
  between them, share A's elements with simd shuffles (each loaded by one lane of the group that
  needs it) and add their partials with simd shuffles (no threadgroup memory, no barrier).
- `gemv_small_n` (y = A x, a few columns of x): one simdgroup per row of A, lanes read `vec`
  neighbouring elements along K (A's contiguous axis) and the row's partials are summed with a
  simd reduction (`T.warp_reduce_sum`).

Inputs float16, bfloat16 or float32; accumulation in float32, one rounding at the store. Any N and
K: the tails are guarded (vector loads only where the whole vector is in bounds; the printer makes
them element loads where the start is not provably aligned). K = 0 gives C = 0, as torch does.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any, Optional

import tilelang.language as T

from .gemm_batched import check_batch
from .sizes import integer_sizes

ACCUM = "float32"
GEMV_MAX_ROWS = 8  # rows of the small side the GEMV kernels accept (and kernels.matmul routes to them)
DTYPES = ("float16", "bfloat16", "float32")


def _check(what: str, small_name: str, dtype: str, out_dtype: str, vec: int, max_vec: int = 4, **sizes: Any) -> tuple[Any, ...]:
    """M, N, K and the tile options as ints, or a one-line ValueError naming the argument: the
    small side 1 to GEMV_MAX_ROWS, the other side >= 1 and K >= 0 (C = 0), both of these possibly
    `T.dynamic`; vec a power of two up to `max_vec`; the options >= 1."""
    other_name = "N" if small_name == "M" else "M"
    (small,) = integer_sizes(what, **{small_name: sizes.pop(small_name)})
    if not 1 <= small <= GEMV_MAX_ROWS:
        raise ValueError(f"GEMV needs 1 <= {small_name} <= {GEMV_MAX_ROWS} (got {small_name}={small}); use kernels.matmul, which routes larger shapes to a GEMM")
    (other,) = integer_sizes(what, minimum=1, symbolic=(other_name,), **{other_name: sizes.pop(other_name)})
    (K,) = integer_sizes(what, minimum=0, symbolic=("K",), K=sizes.pop("K"))
    for name, value in (("dtype", dtype), ("out_dtype", out_dtype)):
        if value not in DTYPES:
            raise ValueError(f"GEMV {name}={value!r} is not supported; use one of {', '.join(DTYPES)}")
    (vec,) = integer_sizes(what, vec=vec)
    if vec not in (1, 2, 4, 8) or vec > max_vec:
        choices = ", ".join(str(v) for v in (1, 2, 4, 8) if v <= max_vec)
        raise ValueError(f"GEMV vec={vec} must be one of {choices} for {dtype} (a lane loads at most {max_vec} elements at once)")
    M, N = (small, other) if small_name == "M" else (other, small)
    return (M, N, K, vec, *integer_sizes(what, minimum=1, **sizes))


def _batched(batch: Optional[int], shared_B: bool, M: int, N: int, K: int, block_grid: Any) -> tuple[Any, ...]:
    """Shapes, grid and index functions of a GEMV with an optional batch on the grid's z axis:
    A (batch, M, K), B (batch, K, N) or shared (K, N), C (batch, M, N)."""
    batch = check_batch("GEMV", batch, shared_B)
    lead = (batch,) if batch else ()
    b_lead = () if shared_B else lead

    def at(lead_shape):
        return lambda z, *index: (z, *index) if lead_shape else index

    grid = (block_grid, 1, batch) if batch else (block_grid,)
    return (*lead, M, K), (*b_lead, K, N), (*lead, M, N), grid, at(lead), at(b_lead)


def launch_ids(blocks: Any) -> tuple[Any, Any]:
    """(block along the grid's x axis, batch: z) of `T.Kernel(...) as blocks`; unbatched, the batch
    is never read (the index functions drop it)."""
    return (blocks[0], blocks[2]) if isinstance(blocks, (list, tuple)) else (blocks, 0)


def _run_loop(stride: Any, run: int) -> Any:
    """The loop over a lane's `run` contiguous elements of rows `stride` elements apart: T.vectorized
    where tilelang can prove every run aligned to its width (a static stride, a multiple of `run`),
    else T.unroll (tilelang would lower the vectorized loop serially anyway, warning that it did)."""
    return T.vectorized if isinstance(stride, int) and stride % run == 0 else T.unroll


def gemv_small_m(
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "float16",
    out_dtype: str | None = None,
    vec: int | None = None,
    n_lanes: int = 4,
    rows: int | None = None,
    simdgroups: int = 4,
    batch: Optional[int] = None,
    shared_B: bool = False,
) -> Any:
    """C (M, N) = A (M, K) @ B (K, N) for M <= GEMV_MAX_ROWS; returns a `T.prim_func`.

    Each simdgroup owns `n_lanes * vec` neighbouring columns: its lanes form `32 // n_lanes` groups of
    `n_lanes` lanes along K, each lane reading `vec` columns of B (one vector load) for `rows`
    consecutive rows of K per step, so the simdgroup covers `32 // n_lanes * rows` rows of K per step.
    The `n_lanes` lanes of a group need the same `M x rows` elements of A: each loads the rows of A
    of its own lane index modulo `n_lanes` (one vector load per row of A) and passes them to the
    others with simd shuffles, so a simdgroup reads each element of A once (every lane loading all
    of them read A `n_lanes` times per simdgroup: 1.41x / 1.78x MLX's device bytes at M = 2 / 4). The
    lanes of a column then add their partial sums with a `simd_shuffle_xor` butterfly: no
    threadgroup memory, no barrier. A threadgroup holds `simdgroups` of them side by side along N.

    Defaults: `rows` is 16 bytes of A (8 elements of 16 bits, 4 of 32); `vec` 16 bytes of B from
    M = 2 on (a load of 8 bytes per lane made more load instructions per FLOP than MLX's), 4 at
    M = 1 (MLX's gemv_t: 16 columns per simdgroup, twice the simdgroups of 32). `batch`: A
    (batch, M, K), B (batch, K, N) or with `shared_B` (K, N), C (batch, M, N), the batch on the
    grid's z axis."""
    out_dtype = out_dtype or dtype
    lane_bytes = 16  # the widest access of one lane
    elem_bytes = 4 if dtype == "float32" else 2
    if rows is None:
        rows = lane_bytes // elem_bytes
    if vec is None:
        vec = 4 if M == 1 else lane_bytes // elem_bytes
    M, N, K, vec, n_lanes, rows, simdgroups = _check("gemv_small_m", "M", dtype, out_dtype, vec, M=M, N=N, K=K, n_lanes=n_lanes,
                                                     rows=rows, simdgroups=simdgroups, max_vec=lane_bytes // elem_bytes)
    if n_lanes not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"gemv_small_m n_lanes={n_lanes} must be a power of two up to 32 (lanes of a simdgroup per column); use 4")
    if simdgroups * 32 > 1024:
        raise ValueError(f"gemv_small_m simdgroups={simdgroups} is {simdgroups * 32} threads, over Metal's 1024 per threadgroup; use 4")
    k_lanes = 32 // n_lanes
    k_step = k_lanes * rows
    sg_n = n_lanes * vec
    block_n = simdgroups * sg_n
    slots = -(-M // n_lanes)  # rows of A each lane loads for its group: m = slot * n_lanes + lane % n_lanes
    levels = k_lanes.bit_length() - 1  # butterfly steps across the K lanes of a column (lane masks n_lanes << s)
    a_shape, b_shape, c_shape, grid, ac, bi = _batched(batch, shared_B, M, N, K, T.ceildiv(N, block_n))
    a_run, n_run = _run_loop(K, rows), _run_loop(N, vec)  # runs along A's rows; along B's and C's

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor(c_shape, out_dtype)):
        with T.Kernel(*grid, threads=(32, simdgroups)) as blocks:
            bx, bz = T.meta_var(launch_ids(blocks))
            lane = T.get_thread_binding(0)
            sg = T.get_thread_binding(1)
            acc = T.alloc_local((M, vec), ACCUM)
            own = T.alloc_local((slots, rows), dtype)
            a = T.alloc_local((M,), dtype)
            b = T.alloc_local((vec,), dtype)
            T.clear(acc)
            n0 = bx * block_n + sg * sg_n + lane % n_lanes * vec
            for ks in T.serial(T.ceildiv(K, k_step)):
                k0 = ks * k_step + lane // n_lanes * rows
                # Every lane of a group loads its share of A and runs every shuffle (the sources are the
                # lanes of its group, none inactive), so nothing here branches on K: past K (and past A's
                # rows) A and B read as zeros. A row's elements are shuffled when its row of B is used,
                # so a lane holds M of them, not M x rows (registers: 8 threadgroups per core at M = 4).
                for s in T.unroll(slots):
                    m = s * n_lanes + lane % n_lanes
                    if m < M and k0 + rows <= K:
                        for r in a_run(rows):
                            own[s, r] = A[ac(bz, m, k0 + r)]
                    else:
                        for r in T.serial(rows):
                            own[s, r] = T.if_then_else(m < M and k0 + r < K, A[ac(bz, T.min(m, M - 1), T.min(k0 + r, K - 1))],
                                                       T.cast(0, dtype))
                for r in T.unroll(rows):
                    if k0 + r < K and n0 + vec <= N:
                        for v in n_run(vec):
                            b[v] = B[bi(bz, k0 + r, n0 + v)]
                    else:
                        for v in T.serial(vec):
                            b[v] = T.if_then_else(k0 + r < K and n0 + v < N,
                                                  B[bi(bz, T.min(k0 + r, K - 1), T.min(n0 + v, N - 1))], T.cast(0, dtype))
                    for m in T.unroll(M):
                        a[m] = T.shfl_sync(own[m // n_lanes, r], m % n_lanes, n_lanes)
                    for m in T.serial(M):
                        for v in T.serial(vec):
                            acc[m, v] += T.cast(a[m], ACCUM) * T.cast(b[v], ACCUM)
            for m in T.serial(M):
                for v in T.serial(vec):
                    for s in T.unroll(levels):  # every lane runs the shuffles: no divergence around them
                        acc[m, v] += T.shfl_xor(acc[m, v], n_lanes << s)
            if lane < n_lanes:
                for m in T.serial(M):
                    if n0 + vec <= N:
                        for v in n_run(vec):
                            C[ac(bz, m, n0 + v)] = T.cast(acc[m, v], out_dtype)
                    else:
                        for v in T.serial(vec):
                            if n0 + v < N:
                                C[ac(bz, m, n0 + v)] = T.cast(acc[m, v], out_dtype)

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
    batch: Optional[int] = None,
    shared_B: bool = False,
) -> Any:
    """C (M, N) = A (M, K) @ B (K, N) for N <= GEMV_MAX_ROWS: `rows` simdgroups per threadgroup,
    one row of A each; returns a `T.prim_func`. `batch` / `shared_B` as in `gemv_small_m`."""
    out_dtype = out_dtype or dtype
    M, N, K, vec, rows = _check("gemv_small_n", "N", dtype, out_dtype, vec, M=M, N=N, K=K, rows=rows)
    if rows * 32 > 1024:
        raise ValueError(f"gemv_small_n rows={rows} is {rows} simdgroups ({rows * 32} threads), over Metal's 1024 per threadgroup; use 4")
    lanes = 32
    step = lanes * vec
    a_shape, b_shape, c_shape, grid, ac, bi = _batched(batch, shared_B, M, N, K, T.ceildiv(M, rows))

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor(c_shape, out_dtype)):
        with T.Kernel(*grid, threads=(lanes, rows)) as blocks:
            bx, bz = T.meta_var(launch_ids(blocks))
            lane = T.get_thread_binding(0)
            m = bx * rows + T.get_thread_binding(1)
            acc = T.alloc_local((N,), ACCUM)
            a = T.alloc_local((vec,), dtype)
            T.clear(acc)
            for kb in T.serial(T.ceildiv(K, step)):
                k0 = kb * step + lane * vec
                if m < M and k0 < K:
                    if k0 + vec <= K:
                        for v in _run_loop(K, vec)(vec):
                            a[v] = A[ac(bz, m, k0 + v)]
                    else:
                        for v in T.serial(vec):
                            a[v] = T.if_then_else(k0 + v < K, A[ac(bz, m, T.min(k0 + v, K - 1))], T.cast(0, dtype))
                    for n in T.serial(N):
                        for v in T.serial(vec):
                            if k0 + v < K:
                                acc[n] += T.cast(a[v], ACCUM) * T.cast(B[bi(bz, k0 + v, n)], ACCUM)
            for n in T.serial(N):
                total = T.warp_reduce_sum(acc[n])
                if lane == 0 and m < M:
                    C[ac(bz, m, n)] = T.cast(total, out_dtype)

    return main
