"""kernels.matmul for a small M (or N) above the GEMV's 8 (kernels/small_m.py): the tile per M on both
targets (decisions only), then the routed kernels in the emulator against torch for M in {2, 9, 13,
16, 31, 32, 33, 63} with odd N and K, NN / NT / TN, fp16 / bf16 / fp32, batched with epilogues and a
small N, under the race checker once per target; matrix operations counted against the tile's rows.

One kernel per tile class, target and layout, with M dynamic (`T.dynamic`): the M values of a class
run on the same compiled kernel (lru_cache), which is the routed choice's program with M symbolic."""

from __future__ import annotations

import functools
import math
from dataclasses import replace

import pytest
import torch
import tilelang.language as T

from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.kernels.matmul import (GEMM, GEMV, METAL4_TILES, SPLIT_K, choice_target, compile_choice, matmul_config,
                                           matmul_program)
from tilelang_metal.kernels.small_m import small_side_tile

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}
N_ODD, K_ODD = 67, 45  # neither a multiple of the tile nor of 16 bytes of fp16


# ----------------------------------------------------------------------------- decisions


@pytest.mark.parametrize("chip, target", [("M3", "metal"), ("M5", "metal4"), ("M5 Max", "metal4")])
def test_small_m_tile_per_m(chip, target):
    """M <= 8: GEMV; 9..48: one tile of the next multiple of 16 rows on 4 simdgroups (plain metal's
    staged kernel multiplies the padding too: 64 rows at M = 16 made 4x MLX's operations); 49..63:
    the chip tile's 64 rows (no more padding than 16-row steps). At N = 2048, K = 4096 the tiles are
    few for the chip (32 of plain metal's 64-column steel tile on an M3's 10 cores): the cost model
    ranks the same tile unsplit and in K slices (metal4: with every other tile too)."""
    chip_columns = 64 if target == "metal" else 128  # MLX's steel tile (M3) / the metal4 chip tile
    for M in range(2, 64):
        choice = matmul_config(M, 2048, 4096, chip=chip)
        assert choice.target == target
        if M <= 8:
            assert choice.route == GEMV, M
            continue
        if target == "metal4":  # the small tile is one more candidate of the cost model's ranking
            ranked = next(r for r in choice.reasons if r.startswith("the cost model's first of"))
            assert choice.route in (GEMM, SPLIT_K) and (M > 48 or f"{16 * math.ceil(M / 16)}x128/4" in ranked), (M, ranked)
            assert any(r.startswith("small side:") for r in choice.reasons) == (choice.block_m < 64), choice.describe()
            continue
        assert choice.route in (GEMM, SPLIT_K), (M, choice.summary())
        assert any(r.startswith("the cost model ranks the tile unsplit and in") for r in choice.reasons), (M, choice.describe())
        assert choice.block_m == 16 * math.ceil(M / 16) and choice.block_n == chip_columns, (M, choice.summary())
        small = [r for r in choice.reasons if r.startswith("small side:")]
        if M <= 48:
            assert choice.threads == 128 and len(small) == 1, (M, choice.describe())
            assert f"M={M} in {choice.block_m}-row tiles (padding {choice.block_m - M} of {choice.block_m}" in small[0]
        else:
            assert not small and choice.block_m == 64, (M, choice.describe())
    # the tiled route (K too short to split) gets the same tile (metal4: where the model ranks it first)
    if target == "metal":
        assert (matmul_config(13, 300, 100, chip=chip).route, matmul_config(13, 300, 100, chip=chip).block_m) == (GEMM, 16)


@pytest.mark.parametrize("chip, columns", [("M3", 16), ("M5", 32)])
def test_small_n_gets_the_symmetric_tile(chip, columns):
    """A small N (GEMV's kernels take N <= 8) is rounded up to 16 columns on plain metal (MLX's bn)
    and 32 on metal4 (matmul2d's N); the rows keep the chip tile's height."""
    choice = matmul_config(4096, 13, 256, chip=chip)
    both = matmul_config(20, 20, 256, chip=chip)  # both sides small: one tile holds the problem
    if chip == "M5":  # metal4: the small tile is ranked by the cost model with the others
        assert "64x32/4" in next(r for r in choice.reasons if r.startswith("the cost model's first of")), choice.describe()
        assert "32x32/" in next(r for r in both.reasons if r.startswith("the cost model's first of")), both.describe()
    else:
        assert choice.block_n == columns and choice.block_m in (64, 128) and choice.threads == 128, choice.describe()
        assert any(f"N=13 in {columns}-column tiles" in r for r in choice.reasons)
        assert (both.block_m, both.block_n) == (32, 32), both.describe()
    large = matmul_config(4096, 4096, 4096, chip=chip)  # large shapes keep the chip tile
    assert not any(r.startswith("small side:") for r in large.reasons) and large.block_n >= 64, large.describe()


# ----------------------------------------------------------------------------- numerics


@functools.lru_cache(maxsize=None)
def small_m_kernel(M, N, K, chip, layout="nn", dtype="float16", **options):
    """The routed kernel of the M x N x K problem with M made dynamic: one compile serves every M of
    the same tile (the tiled route only: split-K plans K's slices per M)."""
    choice = matmul_config(M, N, K, dtype, chip=chip, trans_A=layout[0] == "t", trans_B=layout[1] == "t", **options)
    if choice.target == "metal4":  # the model ranks the small tile with the others: run that candidate itself
        block_m, block_n, threads, _ = small_side_tile(M, N, *METAL4_TILES[0][:2], "metal4")
        choice = replace(choice, block_m=block_m, block_n=block_n, threads=threads, swizzle=0)
    assert choice.route == GEMM, choice.describe()
    import tilelang

    program = matmul_program(replace(choice, M=T.dynamic("m")))
    return choice, tilelang.compile(program, out_idx=[-1], target=choice_target(choice), execution_backend="emulator")


def _operands(M, N, K, layout, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(M, K, generator=g).to(TORCH[dtype]), torch.randn(K, N, generator=g).to(TORCH[dtype])
    a[M - 1, K - 1] = math.nan  # the last row's corner, in the tile's padding rows' neighbour
    stored = (a.t().contiguous() if layout[0] == "t" else a, b.t().contiguous() if layout[1] == "t" else b)
    return stored, a.float() @ b.float()


def _check(out, ref, dtype, K):
    assert out.dtype == TORCH[dtype] and out.shape == ref.shape
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.to(TORCH[dtype]).float(), rtol=tol, atol=tol * math.sqrt(K), equal_nan=True)
    assert torch.isnan(out[-1]).all() and not torch.isnan(out[:-1]).any()


# (chip, representative M of the tile, the M values run on its kernel, layout, dtype); the other
# tile classes of each target (M4: 48 rows TN fp32; M5: 32 rows TN fp16) in tests/slow
CASES = [
    ("M4", 16, (9, 13, 16), "nn", "float16"), ("M4", 32, (31, 32), "nt", "bfloat16"),
    ("M5", 16, (9, 13, 16), "nt", "float32"), ("M5", 48, (33,), "nn", "bfloat16"),
]


@pytest.mark.parametrize("chip, tile_m, ms, layout, dtype", CASES)
def test_small_m_tiles_match_torch(chip, tile_m, ms, layout, dtype):
    choice, kernel = small_m_kernel(tile_m, N_ODD, K_ODD, chip, layout, dtype)
    assert choice.block_m == tile_m and choice.threads == 128
    for M in ms:
        assert chip == "M5" or matmul_config(M, N_ODD, K_ODD, dtype, chip=chip).block_m == tile_m
        (a, b), ref = _operands(M, N_ODD, K_ODD, layout, dtype, seed=M)
        race = M == ms[0] and tile_m == 16  # the race checker once per target
        out = racecheck(kernel, a, b, seeds=(0, 1)) if race else kernel(a, b)
        _check(out, ref, dtype, K_ODD)


@pytest.mark.parametrize("chip", ["M4"])  # M5's in tests/slow
def test_m_2_and_63_keep_their_routes_and_match_torch(chip):
    """The two ends of the range: M = 2 is GEMV's, M = 63 the chip tile's 64 rows."""
    for M, route in ((2, GEMV), (63, GEMM)):
        choice = matmul_config(M, N_ODD, K_ODD, chip=chip)
        assert choice.route == route and (route == GEMV or choice.block_m == 64)
        (a, b), ref = _operands(M, N_ODD, K_ODD, "nn", "float16", seed=M)
        _check(compile_choice(choice, "emulator")(a, b), ref, "float16", K_ODD)


@pytest.mark.parametrize("chip, options", [
    ("M4", {"batch": 2, "epilogue": "alpha_beta", "alpha": 1.5, "beta": -0.5}),
    ("M5", {"batch": 3, "shared_B": True, "epilogue": "bias"}),
])
def test_batched_small_m_with_epilogue_matches_torch(chip, options):
    batch, M = options["batch"], 13
    choice, kernel = small_m_kernel(16, N_ODD, K_ODD, chip, **options)
    assert choice.block_m == 16 and choice.batch == batch
    g = torch.Generator().manual_seed(7)
    a = torch.randn(batch, M, K_ODD, generator=g).half()
    b = torch.randn(*(() if options.get("shared_B") else (batch,)), K_ODD, N_ODD, generator=g).half()
    product = torch.matmul(a.float(), b.float())
    if options["epilogue"] == "bias":
        extra = torch.randn(N_ODD, generator=g).half()
        ref = product + extra.float()
    else:
        extra = torch.randn(batch, M, N_ODD, generator=g).half()
        ref = 1.5 * product - 0.5 * extra.float()
    out = kernel(a, b, extra)
    torch.testing.assert_close(out.float(), ref.half().float(), rtol=2e-3, atol=2e-3 * math.sqrt(K_ODD))


@pytest.mark.parametrize("chip", ["M4", "M5"])
def test_small_n_tile_matches_torch(chip):
    M, N = 70, 13
    choice = matmul_config(M, N, K_ODD, chip=chip)
    assert choice.route == GEMM and choice.block_n < 128
    kernel = compile_choice(choice, "emulator")
    (a, b), ref = _operands(M, N, K_ODD, "nn", "float16", seed=3)
    _check(kernel(a, b), ref, "float16", K_ODD)


# ----------------------------------------------------------------------------- matrix operations


@pytest.mark.parametrize("chip, fragment", [("M4", (8, 8, 8)), ("M5", (16, 32, 16))])
def test_matrix_operations_cover_the_tile_rows_only(chip, fragment):
    """Matrix operations = the tile's 16-row steps x N x K in instruction shapes (the emulator's
    counters): MLX's steel split-K tile below 40 rows is 16 rows (tests/mlx_reference compares
    with its count); the 64-row tile made 4x (plain metal multiplies its staged padding)."""
    M, N, K = 13, 128, 64
    choice = matmul_config(M, N, K, chip=chip)
    kernel = compile_choice(choice, "emulator")
    (a, b), _ = _operands(M, N, K, "nn", "float16", seed=1)
    total = counters(kernel, a, b).total
    from tilelang_metal.emulator.instrument import MATRIX_COUNTER_NAMES

    ops = sum(total.get(n, 0) for n in MATRIX_COUNTER_NAMES)
    fm, fn, fk = fragment
    assert ops == math.ceil(M / 16) * 16 // fm * (N // fn) * (K // fk), total


def test_lower_explain_names_the_small_m_tile(capsys):
    from tilelang_metal.cli import main

    assert main(["lower", "--m", "13", "--n", "300", "--k", "100", "--chip", "M3", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "// matmul 13x300x100 float16->float16 on M3 (metal): gemm threadgroup-staged, 16x64x16 tile" in out
    assert "//   because small side: M=13 in 16-row tiles (padding 3 of 16; a 64-row tile would pad 51)" in out
