"""GEMM kernels for Metal: the CLI's default kernel and the idioms in docs/guide.md.

Each builder returns a `T.prim_func`; tests, benchmarks and the CLI share them.
"""

# No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
from typing import Any

import tilelang.language as T

from ..target.limits import THREADGROUP_MEMORY_BYTES
from ..target.normalize import metal4_target, plain_metal_target  # noqa: F401  (re-exported: the kernels' usual targets)
from ..target.isa import SIMD_WIDTH
from ..target.limits import MAX_THREADS_PER_THREADGROUP as MAX_THREADS
from .sizes import flags, integer_sizes, one_of

EPILOGUES = ("none", "relu", "bias", "scale", "alpha_beta", "gelu_tanh", "silu")
ALPHA, BETA = 1.5, -0.5  # the alpha_beta epilogue: C = ALPHA * (A @ B) + BETA * C
GELU_TANH_SCALE = 0.7978845608028654  # sqrt(2 / pi)


THREADS_MULTIPLE = (SIMD_WIDTH, "whole 32-thread simdgroups")
SWIZZLE_ORDERS = ("mlx", "row", "column")  # T.use_swizzle's orders, all three lowered for Metal (transform/block_swizzle.py)


def check_gemm_arguments(what: str, *, threads: int, swizzle_panel: int = 0, swizzle_order: str = "mlx", num_stages: int = 0,
                         bools: dict | None = None, symbolic: tuple[str, ...] = ("M", "N", "K"), **sizes: Any) -> tuple[Any, ...]:
    """`sizes` (the problem and tile sizes, each >= 1; those named in `symbolic` may be `T.dynamic`), `threads` (whole simdgroups, at most
    1024), `swizzle_panel` / `num_stages` (>= 0) and the flags in `bools`, refused in one line
    naming the argument; returns the sizes, then threads, swizzle_panel and num_stages, as ints."""
    values = integer_sizes(what, minimum=1, symbolic=symbolic, **sizes)  # a T.dynamic problem size is checked per call
    (threads,) = integer_sizes(what, minimum=SIMD_WIDTH, multiples={"threads": THREADS_MULTIPLE}, threads=threads)
    if threads > MAX_THREADS:
        raise ValueError(f"{what} threads={threads} is over Metal's {MAX_THREADS} threads per threadgroup; use 128 or 256")
    swizzle_panel, num_stages = integer_sizes(what, minimum=0, swizzle_panel=swizzle_panel, num_stages=num_stages)
    one_of(what, "swizzle_order", swizzle_order, SWIZZLE_ORDERS)
    flags(what, **(bools or {}))
    return (*values, threads, swizzle_panel, num_stages)


def gelu_tanh(x: Any) -> Any:
    """GELU with the tanh approximation (torch's approximate="tanh"), as a TIR expression."""
    return 0.5 * x * (1.0 + T.tanh(GELU_TANH_SCALE * (x + 0.044715 * x * x * x)))


def gemm_direct_global(
    M: int,
    N: int,
    K: int,
    block_M: int = 64,
    block_N: int = 128,
    *,
    dtype: str = "float16",
    out_dtype: str = "float16",
    threads: int = 128,
    trans_A: bool = False,
    trans_B: bool = False,
    swizzle_panel: int = 0,
    swizzle_order: str = "mlx",
    accumulate: bool = False,
) -> Any:
    """The spec's fast path: T.gemm on global tile views, no staging, the backend owns the K loop.

    accumulate=True computes C += A @ B (clear_accum=False)."""
    M, N, K, block_M, block_N, threads, swizzle_panel, _ = check_gemm_arguments(
        "gemm_direct_global", M=M, N=N, K=K, block_M=block_M, block_N=block_N, threads=threads, swizzle_panel=swizzle_panel,
        swizzle_order=swizzle_order, bools={"trans_A": trans_A, "trans_B": trans_B, "accumulate": accumulate},
        symbolic=("M", "N"))  # K is a T.gemm tile extent here: static
    a_shape = (K, M) if trans_A else (M, K)
    b_shape = (N, K) if trans_B else (K, N)

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle_panel:
                T.use_swizzle(swizzle_panel, order=swizzle_order)
            if trans_A and trans_B:
                T.gemm(A[0:K, by * block_M : (by + 1) * block_M], B[bx * block_N : (bx + 1) * block_N, 0:K], C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N],
                       transpose_A=True, transpose_B=True, clear_accum=not accumulate)
            elif trans_A:
                T.gemm(A[0:K, by * block_M : (by + 1) * block_M], B[0:K, bx * block_N : (bx + 1) * block_N], C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N],
                       transpose_A=True, clear_accum=not accumulate)
            elif trans_B:
                T.gemm(A[by * block_M : (by + 1) * block_M, 0:K], B[bx * block_N : (bx + 1) * block_N, 0:K], C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N],
                       transpose_B=True, clear_accum=not accumulate)
            else:
                T.gemm(A[by * block_M : (by + 1) * block_M, 0:K], B[0:K, bx * block_N : (bx + 1) * block_N], C[by * block_M : (by + 1) * block_M, bx * block_N : (bx + 1) * block_N], clear_accum=not accumulate)

    return main


def gemm_bias_gelu(
    M: int,
    N: int,
    K: int,
    block_M: int = 64,
    block_N: int = 128,
    *,
    dtype: str = "float16",
    out_dtype: str = "float16",
    threads: int = 128,
) -> Any:
    """C = gelu_tanh(A @ B + bias) in one kernel: the direct-global K loop into a register
    accumulator, bias and GELU applied to it in registers, one store of C (no C round trip through
    device memory, unlike a GEMM followed by elementwise kernels). Bias is float32 (N,)."""
    M, N, K, block_M, block_N, threads, _, _ = check_gemm_arguments(
        "gemm_bias_gelu", M=M, N=N, K=K, block_M=block_M, block_N=block_N, threads=threads, symbolic=("M", "N"))

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), Bias: T.Tensor((N,), "float32"), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.gemm(A[by * block_M : (by + 1) * block_M, 0:K], B[0:K, bx * block_N : (bx + 1) * block_N], acc, clear_accum=True)
            for i, j in T.Parallel(block_M, block_N):
                acc[i, j] = gelu_tanh(acc[i, j] + Bias[bx * block_N + j])
            T.copy(acc, C[by * block_M, bx * block_N])

    return main


def gemm_shared(
    M: int,
    N: int,
    K: int,
    block_M: int = 64,
    block_N: int = 64,
    block_K: int = 32,
    *,
    dtype: str = "float16",
    out_dtype: str = "float32",
    accum_dtype: str = "float32",
    threads: int = 128,
    c_in_shared: bool = False,
    epilogue: str = "none",
    trans_A: bool = False,
    trans_B: bool = False,
    num_stages: int = 0,
    shared_scope: str = "shared.dyn",
    swizzle_panel: int = 0,
    swizzle_order: str = "mlx",
) -> Any:
    """The standard TileLang idiom: shared A/B, fragment (or shared) accumulator, pipelined K loop,
    optional T.Parallel epilogue on the accumulator, T.copy to global."""
    M, N, K, block_M, block_N, block_K, threads, swizzle_panel, num_stages = check_gemm_arguments(
        "gemm_shared", M=M, N=N, K=K, block_M=block_M, block_N=block_N, block_K=block_K, threads=threads,
        swizzle_panel=swizzle_panel, swizzle_order=swizzle_order, num_stages=num_stages,
        bools={"c_in_shared": c_in_shared, "trans_A": trans_A, "trans_B": trans_B})
    one_of("gemm_shared", "shared_scope", shared_scope, ("shared.dyn", "shared"))
    a_shape = (K, M) if trans_A else (M, K)
    b_shape = (N, K) if trans_B else (K, N)
    a_tile = (block_K, block_M) if trans_A else (block_M, block_K)
    b_tile = (block_N, block_K) if trans_B else (block_K, block_N)
    if epilogue not in EPILOGUES:
        raise ValueError(f"gemm_shared epilogue={epilogue!r} is not supported; use one of {', '.join(map(repr, EPILOGUES))}")

    @T.prim_func
    def main(
        A: T.Tensor(a_shape, dtype),
        B: T.Tensor(b_shape, dtype),
        Bias: T.Tensor((N,), accum_dtype),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle_panel:
                T.use_swizzle(swizzle_panel, order=swizzle_order)
            A_s = T.alloc_shared(a_tile, dtype, scope=shared_scope)
            B_s = T.alloc_shared(b_tile, dtype, scope=shared_scope)
            if c_in_shared:
                C_acc = T.alloc_shared((block_M, block_N), accum_dtype, scope=shared_scope)
            else:
                C_acc = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_acc)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                if trans_A:
                    T.copy(A[ko * block_K, by * block_M], A_s)
                else:
                    T.copy(A[by * block_M, ko * block_K], A_s)
                if trans_B:
                    T.copy(B[bx * block_N, ko * block_K], B_s)
                else:
                    T.copy(B[ko * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_acc, transpose_A=trans_A, transpose_B=trans_B)
            if epilogue == "relu":
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = T.max(C_acc[i, j], 0)
            elif epilogue == "bias":
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = C_acc[i, j] + Bias[bx * block_N + j]
            elif epilogue == "scale":
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = C_acc[i, j] * 0.5 + 1.0
            elif epilogue == "alpha_beta":  # BLAS-style: reads the old C (pass C in, no out_idx)
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = ALPHA * C_acc[i, j] + BETA * C[by * block_M + i, bx * block_N + j]
            elif epilogue == "gelu_tanh":
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = gelu_tanh(C_acc[i, j])
            elif epilogue == "silu":
                for i, j in T.Parallel(block_M, block_N):
                    C_acc[i, j] = C_acc[i, j] / (1.0 + T.exp(-C_acc[i, j]))
            T.copy(C_acc, C[by * block_M, bx * block_N])

    return main


RUN_BYTES = 16
STAGED_ROW_PAD_BYTES = 16  # padding of a staged threadgroup row (MLX's steel tiles pad the same)


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2 if dtype in ("float16", "bfloat16") else 1


def staged_row_pad(cols: int, dtype: str) -> int:
    """Elements of padding after a staged threadgroup row of `cols` elements: whatever makes the row
    pitch an odd multiple of 16 bytes (0 or STAGED_ROW_PAD_BYTES). With a pitch of 16 * odd bytes the
    8 rows one simdgroup_load reads, and the rows one simdgroup's 16-byte copies store, start 4 * odd
    words apart: distinct multiples of 4 modulo 32, so they meet in no bank of the 32 4-byte banks."""
    size = _bytes(dtype)
    row_bytes = cols * size
    return 0 if row_bytes % 16 or row_bytes % 32 == 16 else STAGED_ROW_PAD_BYTES // size


def staged_pads(a_tile: tuple[int, int], b_tile: tuple[int, int], num_stages: int, dtype: str) -> tuple[int, int]:
    """(A's, B's) row padding of staged tiles (`staged_row_pad`), or (0, 0) where the padded tiles in
    `num_stages` buffers would not fit 32 KiB of threadgroup memory (padding changes speed only)."""
    a_pad, b_pad = staged_row_pad(a_tile[1], dtype), staged_row_pad(b_tile[1], dtype)
    padded = max(num_stages, 1) * (a_tile[0] * (a_tile[1] + a_pad) + b_tile[0] * (b_tile[1] + b_pad)) * _bytes(dtype)
    return (a_pad, b_pad) if padded <= THREADGROUP_MEMORY_BYTES else (0, 0)


def copy_runs(shape: tuple, tile: tuple, dtype: str, threads: int) -> Any:
    """A `T.macro(src, dst, row0, col0)`: dst (a `tile` of threadgroup memory) = src[row0 :, col0 :]
    (a tensor of `shape`), each thread copying runs of 16 bytes of a row. A run inside the tensor is
    an unrolled element loop that the late legalization turns into one 16-byte move (aligned or
    packed: `legalize/wide_copies.py`); a run the edge cuts copies its elements, zeros outside.
    Either way the run goes through 16 bytes of registers and every lane stores it with the same
    instruction: with a store in each arm, an edge that splits a simdgroup's lanes left two partial
    stores whose rows met in threadgroup banks. What T.copy does instead at a row pitch that is not
    a multiple of 16 bytes is one element per thread: eight 2-byte loads where this makes one access."""
    run = RUN_BYTES // (4 if dtype == "float32" else 2 if dtype in ("float16", "bfloat16") else 1)
    rows, cols = tile
    if cols % run:
        raise ValueError(f"copy_runs: a tile row of {cols} {dtype} elements is not whole runs of {run}; use T.copy")
    runs_per_row = cols // run
    total = rows * runs_per_row
    rounds = -(-total // threads)
    row_extent, col_extent = shape

    @T.macro
    def copy(src, dst, row0, col0):
        tx = T.get_thread_binding()
        for i in T.unroll(rounds):
            if total % threads == 0 or i * threads + tx < total:
                run_regs = T.decl_buffer((run,), dtype, scope="local")  # filled and stored in one step
                r = (i * threads + tx) // runs_per_row
                c = (i * threads + tx) % runs_per_row * run
                if row0 + r < row_extent and col0 + c + run <= col_extent:
                    for v in T.unroll(run):
                        run_regs[v] = src[row0 + r, col0 + c + v]
                else:
                    for v in T.unroll(run):
                        run_regs[v] = T.if_then_else(row0 + r < row_extent and col0 + c + v < col_extent, src[row0 + r, col0 + c + v], T.cast(0, dtype))
                for v in T.unroll(run):
                    dst[r, c + v] = run_regs[v]

    return copy


def gemm_staged(
    M: int,
    N: int,
    K: int,
    block_M: int = 64,
    block_N: int = 64,
    block_K: int = 32,
    *,
    dtype: str = "float16",
    out_dtype: str = "float16",
    threads: int = 128,
    trans_A: bool = False,
    trans_B: bool = False,
    num_stages: int = 0,
    swizzle_panel: int = 0,
    keep_staging: bool = False,
    copy_in_runs: tuple = (),
    row_pad: int | None = None,
) -> Any:
    """Shared staging of A and B, float32 fragment accumulator, result to C: the shared-path kernel
    with the same parameters (A, B, C) as gemm_direct_global, so the two paths are interchangeable
    (tilelang_metal.tuning.autotune tunes both; kernels.matmul routes plain-metal GEMMs here). Its staging
    is only staging, so the staging bypass lowers it on the direct-global path unless `keep_staging`
    (then it runs as written).

    A transposed operand (trans_A: A stored (K, M); trans_B: B stored (N, K)) is staged in its
    storage order, so the copy reads whole rows of the stored matrix (16-byte moves where aligned),
    and T.gemm reads the staged tile transposed from threadgroup memory.

    `copy_in_runs` names operands ("A", "B") copied by `copy_runs` instead of T.copy: for a row
    pitch that is not a multiple of 16 bytes, where T.copy moves one element per thread.

    With `keep_staging`, each staged row is padded by `row_pad` elements (default: `staged_row_pad`,
    up to a row pitch of an odd multiple of 16 bytes, when the padded stages fit 32 KiB), so
    simdgroup_load's 8 rows and the copies' 16-byte stores meet no bank conflict in threadgroup
    memory; without it the tiles are dense (default), which the staging bypass can drop."""
    M, N, K, block_M, block_N, block_K, threads, swizzle_panel, num_stages = check_gemm_arguments(
        "gemm_staged", M=M, N=N, K=K, block_M=block_M, block_N=block_N, block_K=block_K, threads=threads,
        swizzle_panel=swizzle_panel, num_stages=num_stages, bools={"trans_A": trans_A, "trans_B": trans_B, "keep_staging": keep_staging})
    a_shape = (K, M) if trans_A else (M, K)
    b_shape = (N, K) if trans_B else (K, N)
    a_tile = (block_K, block_M) if trans_A else (block_M, block_K)
    b_tile = (block_N, block_K) if trans_B else (block_K, block_N)
    unknown = set(copy_in_runs) - {"A", "B"}
    if unknown:
        raise ValueError(f"copy_in_runs: {sorted(unknown)} is not an operand; name 'A' and / or 'B'")
    if row_pad is not None:
        (a_pad,) = integer_sizes("gemm_staged", minimum=0, row_pad=row_pad)
        b_pad = a_pad
    elif keep_staging:
        a_pad, b_pad = staged_pads(a_tile, b_tile, num_stages, dtype)
    else:  # the staging bypass drops whole-buffer staging only: dense tiles, so it may
        a_pad = b_pad = 0
    copy_a = copy_runs(a_shape, a_tile, dtype, threads) if "A" in copy_in_runs else None
    copy_b = copy_runs(b_shape, b_tile, dtype, threads) if "B" in copy_in_runs else None

    @T.prim_func
    def main(A: T.Tensor(a_shape, dtype), B: T.Tensor(b_shape, dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=threads) as (bx, by):
            if swizzle_panel:
                T.use_swizzle(swizzle_panel, order="mlx")
            A_s = T.alloc_shared((a_tile[0], a_tile[1] + a_pad), dtype)  # the tiles in their padded rows
            B_s = T.alloc_shared((b_tile[0], b_tile[1] + b_pad), dtype)
            acc = T.alloc_fragment((block_M, block_N), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=num_stages):
                # the tiles' origins in the stored operands (a transposed one is staged as stored)
                a_row, a_col = (ko * block_K, by * block_M) if trans_A else (by * block_M, ko * block_K)
                b_row, b_col = (bx * block_N, ko * block_K) if trans_B else (ko * block_K, bx * block_N)
                if copy_a is not None:
                    copy_a(A, A_s, a_row, a_col)
                else:
                    T.copy(A[a_row, a_col], A_s[0 : a_tile[0], 0 : a_tile[1]])
                if copy_b is not None:
                    copy_b(B, B_s, b_row, b_col)
                else:
                    T.copy(B[b_row, b_col], B_s[0 : b_tile[0], 0 : b_tile[1]])
                T.gemm(A_s[0 : a_tile[0], 0 : a_tile[1]], B_s[0 : b_tile[0], 0 : b_tile[1]], acc, transpose_A=trans_A, transpose_B=trans_B)
            T.copy(acc, C[by * block_M, bx * block_N])

    if keep_staging:
        from ..transform.shared_staging import keep_shared_staging

        return keep_shared_staging(main)
    return main
