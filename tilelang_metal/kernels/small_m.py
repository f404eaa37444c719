"""The tile `kernels.matmul_config` gives a problem whose M (or N) is small but above the GEMV's
GEMV_MAX_ROWS: 9..48 rows (or columns) that a 64- or 128-row chip tile would mostly pad.

Why this tile (a note for the cost model): the small side is rounded up to whole rows of the
matrix instruction's fragments, 16 rows (metal4's matmul2d 16x32x16; on plain metal two 8x8
fragment rows, MLX's split-K tile height `bm = 16` below 40 rows) and, for a small N, 32 columns
on metal4 (matmul2d's N) or 16 on plain metal (MLX's `bn = 16`). So

- the whole small side is one tile: the large operand (B for a small M) is read from device memory
  once, as with the chip tile, and the grid keeps its tiles along the large side;
- matrix operations per FLOP are at most MLX's: the padding is below 16 rows (MLX's steel split-K
  pads to 16 below 40 rows, to 32 from 40; its NAX tile to 128). The plain-metal staged kernel runs
  its simdgroup matrices over the whole staged tile, padding included: 64 rows at M = 16 made 4x
  MLX's operations;
- the tile keeps 4 simdgroups (128 threads) side by side along the large side, each holding the
  whole small side (16 to 48 rows x 32 columns for a small M): none of them idles on padding, as
  half or more of the chip tile's 8 or 16 simdgroups would (metal4 skips their operations, but
  they still hold registers and a threadgroup slot).

The kernels are the chip tile's (kernels.gemm_staged / gemm_direct_global / gemm_batched /
gemm_split_k) at this tile size; `matmul_config` reads the shapes above GEMV's here.
"""

from __future__ import annotations

from ..selection import legal_partitions

ROW_STEP = 16  # the small side's tile is a multiple of this (matmul2d's M; two 8x8 rows; MLX's bm = 16)
COLUMN_STEP = {"metal4": 32, "metal": 16}  # a small N's tile: matmul2d's N on metal4; MLX's bn = 16 on plain metal
FRAGMENT = {"metal4": (16, 32), "metal": (8, 8)}  # (rows, columns) of the target's matrix instruction
SIMDGROUPS = 4
MAX_SIDE = 64  # rows (columns) from which the chip tile is kept


def _round_up(value: int, step: int) -> int:
    return -(-value // step) * step


def small_side_tile(M: int, N: int, chip_m: int, chip_n: int, target: str) -> tuple[int, int, int, str] | None:
    """(block_m, block_n, threads, reason) for a problem whose M or N (9 to 48, or to 32 for a
    metal4 N) the chip tile (chip_m x chip_n) would pad by a whole step or more, or None: the chip
    tile is kept."""
    rows, columns = _round_up(M, ROW_STEP), _round_up(N, COLUMN_STEP[target])
    # from 49 rows (or columns) the chip tile, 64 rows high (matmul_config halves a 128-row one), pads as little
    block_m = rows if rows < min(chip_m, MAX_SIDE) else chip_m
    block_n = columns if columns < min(chip_n, MAX_SIDE) else chip_n
    if (block_m, block_n) == (chip_m, chip_n):
        return None
    frag_m, frag_n = FRAGMENT[target]
    # 4 simdgroups when the tile splits into them in whole fragments (a 16x32 metal4 tile is one fragment)
    simdgroups = next(w for w in (SIMDGROUPS, 2, 1) if legal_partitions(block_m, block_n, w, frag_m, frag_n))
    sides = []
    if block_m < chip_m:
        sides.append(f"M={M} in {block_m}-row tiles (padding {block_m - M} of {block_m}; a {chip_m}-row tile would pad {chip_m - M})")
    if block_n < chip_n:
        sides.append(f"N={N} in {block_n}-column tiles (padding {block_n - N} of {block_n}; a {chip_n}-column tile would pad {chip_n - N})")
    return block_m, block_n, 32 * simdgroups, (
        f"small side: {' and '.join(sides)}, whole {ROW_STEP}-row / {COLUMN_STEP[target]}-column steps of the matrix "
        f"instruction, so matrix operations per FLOP stay at most MLX's (its steel split-K tile is 16 or 32 rows, its NAX "
        f"tile 128) and the small side is one tile (the large operand read once); {simdgroups} simdgroups along the "
        "large side, none idle on padding")
