"""Row softmax over the last axis for Metal, written in TileLang: `Y[r, :] = softmax(X[r, :])` for
any column count (4096, ragged, 1).

A threadgroup takes `block_rows` rows in column blocks of `block_cols` (reduce_rows.row_blocking).
Pass 1 is an online softmax over the blocks: each block's row maximum (`T.reduce_max`) updates
the running maximum, the running denominator is rescaled by exp(old max - new max) and the block's
sum of exp(x - max) (`T.reduce_sum`) added. Pass 2 writes exp(x - max) / denominator; when a row fits
one block (up to 4096 columns) pass 2 reads the probabilities from the fragment instead of X.
Columns past the end are copies of the row's last element for the maximum and are excluded from
the sum, so no infinity is ever written (Metal's fast math may assume there are none). float32
arithmetic for every input dtype, one rounding at the store.

Non-finite inputs give torch's results: a NaN or +inf in a row makes the row NaN, a row of only
-inf is NaN, a -inf among finite values gets probability 0 (in the emulator; on a GPU with fast
math, Metal's default, non-finite inputs are undefined).

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any

import tilelang.language as T

from .reduce_rows import ACCUM, DTYPES, check_rows, row_blocking


def softmax(rows: int, cols: int, *, dtype: str = "float32", out_dtype: str | None = None, threads: int = 128) -> Any:
    """`Y (rows, cols) = softmax(X (rows, cols), dim=-1)` as a `T.prim_func` (compile with `out_idx=[-1]`)."""
    out_dtype = out_dtype or dtype
    rows, cols, threads = check_rows(rows, cols, dtype, threads, "softmax")
    if out_dtype not in DTYPES:
        raise ValueError(f"softmax out_dtype={out_dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    block_rows, block_cols = row_blocking(rows, cols, threads)
    col_blocks = -(-cols // block_cols)

    @T.prim_func
    def main(X: T.Tensor((rows, cols), dtype), Y: T.Tensor((rows, cols), out_dtype)):
        with T.Kernel(T.ceildiv(rows, block_rows), threads=threads) as bx:
            x = T.alloc_fragment((block_rows, block_cols), ACCUM)
            block_max = T.alloc_fragment((block_rows,), ACCUM)
            block_sum = T.alloc_fragment((block_rows,), ACCUM)
            row_max = T.alloc_fragment((block_rows,), ACCUM)
            rescale = T.alloc_fragment((block_rows,), ACCUM)
            denominator = T.alloc_fragment((block_rows,), ACCUM)
            T.fill(denominator, 0)
            T.fill(row_max, 0)  # read only from the second column block on; filled so no read precedes a write
            for cb in T.serial(col_blocks):
                for i, j in T.Parallel(block_rows, block_cols):
                    r = T.min(bx * block_rows + i, rows - 1)  # rows past the end repeat the last row, never stored
                    x[i, j] = T.cast(X[r, T.min(cb * block_cols + j, cols - 1)], ACCUM)
                T.reduce_max(x, block_max, dim=1)
                for i in T.Parallel(block_rows):
                    new_max = T.if_then_else(cb == 0, block_max[i], T.max(row_max[i], block_max[i]))
                    # a running maximum of -inf (every column so far -inf) has summed nothing: exp(-inf - -inf) is NaN
                    rescale[i] = T.if_then_else(cb == 0 or row_max[i] == -T.infinity(ACCUM), 0, T.exp(row_max[i] - new_max))
                    row_max[i] = new_max
                for i, j in T.Parallel(block_rows, block_cols):
                    # a -inf column adds 0, also where the block's maximum is -inf (a later block may hold finite values)
                    x[i, j] = T.if_then_else(cb * block_cols + j < cols and x[i, j] != -T.infinity(ACCUM), T.exp(x[i, j] - row_max[i]), 0)
                T.reduce_sum(x, block_sum, dim=1)
                for i in T.Parallel(block_rows):
                    denominator[i] = denominator[i] * rescale[i] + block_sum[i]
            if col_blocks == 1:
                for i, j in T.Parallel(block_rows, block_cols):
                    if bx * block_rows + i < rows and j < cols:
                        Y[bx * block_rows + i, j] = T.cast(x[i, j] / denominator[i], out_dtype)
            else:
                for cb in T.serial(col_blocks):
                    for i, j in T.Parallel(block_rows, block_cols):
                        r = bx * block_rows + i
                        c = cb * block_cols + j
                        if r < rows and c < cols:
                            Y[r, c] = T.cast(T.exp(T.cast(X[r, c], ACCUM) - row_max[i]) / denominator[i], out_dtype)

    return main
