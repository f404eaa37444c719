"""Row reductions over the last axis for Metal, written in TileLang: `out[r] = sum_c X[r, c]` or
`max_c X[r, c]` for any column count (4096, ragged, 1).

Rows of at least one simdgroup's worth of 16-byte runs (128 float32 or 256 half elements) are
reduced one per simdgroup (`_reduce_rows_per_simdgroup`: vector loads, a float32 scalar per lane,
one simd collective; no threadgroup memory, no barrier). Shorter rows are packed several to a
threadgroup: it reduces `block_rows` rows in column blocks of `block_cols` (`row_blocking` picks
both): each block is loaded into a float32 fragment and folded with `T.reduce_sum` /
`T.reduce_max` (simd shuffles, and threadgroup memory across simdgroups: docs/kernel_vocabulary.md)
into a running per-row result. The columns past the end of a row are padded with 0 for a sum and
with a copy of the row's last element for a max, so no infinity is ever written (Metal's fast math
may assume there are none). Inputs float16, bfloat16 or float32, accumulated in float32.

NaN: a sum propagates it; a max does too, like torch.amax (Metal's `max` alone would ignore it,
docs/math.md), through an explicit `T.isnan` count per row. On a GPU with fast math (Metal's
default) NaN handling is undefined anyway; the emulator follows IEEE.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any

import tilelang.language as T

from ..target.isa import SIMD_WIDTH
from .sizes import integer_sizes

ACCUM = "float32"
DTYPES = ("float16", "bfloat16", "float32")
KINDS = ("sum", "max")
MAX_BLOCK_COLS = 4096  # a 4096-column row in one block: 16 floats per thread at 256 threads
MAX_BLOCK_ELEMENTS = 4096
RUN_BYTES = 16  # a lane's vector load in the per-simdgroup layout
_ELEMENT_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def row_blocking(rows: int, cols: int, threads: int) -> tuple[int, int]:
    """(block_rows, block_cols): whole rows up to MAX_BLOCK_COLS columns in one block (a power of
    two >= 32), and as many rows per threadgroup as keep the block at MAX_BLOCK_ELEMENTS and at
    least one element per thread."""
    block_cols = min(max(_pow2_at_least(cols), 32), MAX_BLOCK_COLS)
    block_rows = max(1, min(MAX_BLOCK_ELEMENTS // block_cols, _pow2_at_least(rows)))
    while block_rows > 1 and block_rows * block_cols < threads:
        block_rows //= 2
    return block_rows, block_cols


def check_rows(rows: int, cols: int, dtype: str, threads: int, what: str) -> tuple[int, int, int]:
    """(rows, cols, threads) as Python ints, or a one-line ValueError naming the bad request."""
    rows, cols, threads = integer_sizes(what, rows=rows, cols=cols, threads=threads)
    if rows <= 0 or cols <= 0:
        raise ValueError(f"{what} needs rows >= 1 and cols >= 1 (got {rows}x{cols}); an empty row has no {what} result")
    if dtype not in DTYPES:
        raise ValueError(f"{what} dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if threads < 32 or threads > 1024 or threads & (threads - 1):
        # row_blocking's blocks are powers of two: other thread counts (96, 160) do not split them evenly
        raise ValueError(f"{what} threads={threads} must be a power of two from 32 to 1024 (whole simdgroups splitting "
                         "power-of-two blocks evenly); use 128 or 256")
    return rows, cols, threads


def reduce_rows(rows: int, cols: int, kind: str = "sum", *, dtype: str = "float32", out_dtype: str | None = None, threads: int = 128) -> Any:
    """`Out (rows,) = reduce_kind(X (rows, cols), axis=-1)` as a `T.prim_func` (compile with `out_idx=[-1]`)."""
    if kind not in KINDS:
        raise ValueError(f"reduce_rows kind={kind!r} is not supported; use one of {', '.join(KINDS)}")
    out_dtype = out_dtype or dtype
    rows, cols, threads = check_rows(rows, cols, dtype, threads, f"row {kind}")
    if out_dtype not in DTYPES:
        raise ValueError(f"row {kind} out_dtype={out_dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    run = RUN_BYTES // _ELEMENT_BYTES[dtype]
    if cols >= SIMD_WIDTH * run:
        return _reduce_rows_per_simdgroup(rows, cols, kind, dtype, out_dtype, threads, run)
    block_rows, block_cols = row_blocking(rows, cols, threads)
    col_blocks = -(-cols // block_cols)
    is_sum = kind == "sum"

    @T.prim_func
    def main(X: T.Tensor((rows, cols), dtype), Out: T.Tensor((rows,), out_dtype)):
        with T.Kernel(T.ceildiv(rows, block_rows), threads=threads) as bx:
            x = T.alloc_fragment((block_rows, block_cols), ACCUM)
            part = T.alloc_fragment((block_rows,), ACCUM)
            total = T.alloc_fragment((block_rows,), ACCUM)
            T.fill(total, 0)
            if not is_sum:
                nans = T.alloc_fragment((block_rows, block_cols), ACCUM)
                nan_rows = T.alloc_fragment((block_rows,), ACCUM)
                T.fill(nan_rows, 0)
            for cb in T.serial(col_blocks):
                for i, j in T.Parallel(block_rows, block_cols):
                    r = T.min(bx * block_rows + i, rows - 1)  # rows past the end repeat the last row, never stored
                    c = cb * block_cols + j
                    value = T.cast(X[r, T.min(c, cols - 1)], ACCUM)
                    if is_sum:
                        x[i, j] = T.if_then_else(c < cols, value, 0)
                    else:
                        x[i, j] = value  # a copy of the last element does not change a max
                        nans[i, j] = T.if_then_else(T.isnan(value), 1, 0)
                if is_sum:
                    T.reduce_sum(x, part, dim=1)
                    for i in T.Parallel(block_rows):
                        total[i] += part[i]
                else:
                    T.reduce_max(x, part, dim=1)
                    for i in T.Parallel(block_rows):
                        total[i] = T.if_then_else(cb == 0, part[i], T.max(total[i], part[i]))
                    T.reduce_max(nans, part, dim=1)
                    for i in T.Parallel(block_rows):
                        nan_rows[i] = T.max(nan_rows[i], part[i])
            for i in T.Parallel(block_rows):
                if bx * block_rows + i < rows:
                    if is_sum:
                        Out[bx * block_rows + i] = T.cast(total[i], out_dtype)
                    else:
                        Out[bx * block_rows + i] = T.cast(T.if_then_else(nan_rows[i] > 0, T.float32(float("nan")), total[i]), out_dtype)

    return main


def run_loader(run: int, cols: int, vector_runs: bool) -> Any:
    """A `T.macro` load_run(src, row, c, dst): dst[v] = src[row, c + v] for the `run` elements of a
    run starting in the row (one vector load when `vector_runs`: the row pitch keeps runs 16-byte
    aligned); a run the row's end cuts reads a copy of the last element past it (callers never fold
    those in). Shared by the row reductions and the norms."""

    @T.macro
    def load_run(src, row, c, dst):
        if c + run <= cols:
            if vector_runs:
                for v in T.vectorized(run):
                    dst[v] = src[row, c + v]
            else:
                for v in T.unroll(run):
                    dst[v] = src[row, c + v]
        else:
            for v in T.unroll(run):
                dst[v] = src[row, T.min(c + v, cols - 1)]

    return load_run


def _reduce_rows_per_simdgroup(rows: int, cols: int, kind: str, dtype: str, out_dtype: str, threads: int, run: int) -> Any:
    """One simdgroup per row: each lane reads runs of 16 bytes, `run` elements, at a stride of 32 runs
    (one vector load each where the row pitch keeps them 16-byte aligned), folds them into a float32
    scalar, and one simd collective (`T.warp_reduce_sum` / `_max`) finishes the row: no threadgroup
    memory, no barrier. A run the row's end cuts reads its elements (a copy of the last element
    past the end: a max ignores it, a sum skips it)."""
    rows_per_group = threads // SIMD_WIDTH
    rounds = -(-cols // (SIMD_WIDTH * run))
    vector_runs = cols * _ELEMENT_BYTES[dtype] % RUN_BYTES == 0  # else runs are not provably aligned: elements
    is_sum = kind == "sum"
    load_run = run_loader(run, cols, vector_runs)

    @T.prim_func
    def main(X: T.Tensor((rows, cols), dtype), Out: T.Tensor((rows,), out_dtype)):
        with T.Kernel(T.ceildiv(rows, rows_per_group), threads=threads) as bx:
            thread = T.get_thread_binding()
            lane = thread % SIMD_WIDTH
            row = bx * rows_per_group + thread // SIMD_WIDTH
            values = T.alloc_local((run,), dtype)
            total = T.alloc_var(ACCUM)
            nans = T.alloc_var(ACCUM)
            if row < rows:  # the same for a whole simdgroup: its collectives see every lane
                total = 0
                nans = 0
                for i in T.serial(rounds):
                    c = (i * SIMD_WIDTH + lane) * run
                    load_run(X, row, c, values)
                    if not is_sum and i == 0:
                        total = T.cast(values[0], ACCUM)  # round 0's runs are whole (cols >= 32 runs): a max starts from one
                    for v in T.unroll(run):
                        if is_sum:
                            total += T.if_then_else(c + v < cols, T.cast(values[v], ACCUM), 0)
                        else:
                            total = T.max(total, T.cast(values[v], ACCUM))
                            nans = T.max(nans, T.if_then_else(T.isnan(T.cast(values[v], ACCUM)), 1, 0))
                if is_sum:
                    total = T.warp_reduce_sum(total)
                else:
                    total = T.warp_reduce_max(total)
                    nans = T.warp_reduce_max(nans)
                if lane == 0:
                    if is_sum:
                        Out[row] = T.cast(total, out_dtype)
                    else:
                        Out[row] = T.cast(T.if_then_else(nans > 0, T.float32(float("nan")), total), out_dtype)

    return main


def row_sum(rows: int, cols: int, **options: Any) -> Any:
    return reduce_rows(rows, cols, "sum", **options)


def row_max(rows: int, cols: int, **options: Any) -> Any:
    return reduce_rows(rows, cols, "max", **options)
