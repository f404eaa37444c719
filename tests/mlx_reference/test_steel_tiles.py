"""Plain metal's staged GEMM against MLX's steel GEMM (issue 35 item 1): MLX's tile per chip as its host
logic picks it for that chip's architecture string (mlx_gemm.gemm_tile, our transcription of matmul.cpp)
bounds the tile `kernels.matmul_config` picks among MLX's steel tiles by the cost model, and on a
small problem the plugin's kernel meets no threadgroup bank conflict and is at or ahead of MLX's kernel on the GPU-level counts and the occupancy estimates."""

from __future__ import annotations

import re

import pytest
import torch

import mlx_gemm as mg
from bench_support import load_benchmark
from tilelang_metal.codegen.artifact import artifact_of
from tilelang_metal.emulator import counters
from tilelang_metal.emulator.foreign import memory_counts_unavailable
from tilelang_metal.kernels.matmul import GEMM, KEEP_MLX_TILE, STAGES, STEEL_TILES, _steel_tile, compile_choice, matmul_config
from tilelang_metal.performance import cost_model, roofline
from tilelang_metal.performance.register_budget import kernel_occupancy

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _unsplit_estimate(on, M, N, K, dtype, tile):
    bm, bn, bk, threads = tile
    swizzle = 8 if min(-(-M // bm), -(-N // bn)) >= 16 else 0
    kernel = cost_model.plugin_kernel(cost_model.SHARED, bm, bn, threads, metal4=False, block_k=bk, stages=STAGES, swizzle=swizzle, K=K,
                                      dtype=dtype)
    return cost_model.predict(kernel, M, N, K, chip=on, dtype=dtype)


@pytest.mark.parametrize("chip", list(roofline.CHIPS))
def test_steel_tile_rule_is_mlx_s_host_logic_for_the_chip_architecture(chip):
    """Every chip, dtype and layout, a large square problem, a long-K one and one under MLX's
    2^20-outputs threshold: `_steel_tile` (the tile plain metal takes where the model does not rank,
    and the candidate the ranking keeps on near-ties) is the (bm, bn, bk, 32 wm wn) MLX's host logic
    picks given that chip's architecture string (the M2 and M4 Pro report 's': MLX's medium tile)."""
    on = roofline.CHIPS[chip]
    device = mg.Device(on.architecture.name)
    for M, N, K in ((4096, 4096, 4096), (2048, 2048, 8192), (512, 512, 512)):
        for dtype in TORCH:
            for layout in ("nn", "nt", "tn"):
                ta, tb = layout == "tn", layout == "nt"
                bm, bn, bk, wm, wn = mg.gemm_tile(M, N, K, TORCH[dtype], ta, tb, device=device)
                rule = _steel_tile(on, M, N, K, dtype, ta, tb, 0)
                assert (rule.block_m, rule.block_n, rule.block_k, rule.threads) == (bm, bn, bk, 32 * wm * wn), (chip, M, K, dtype, layout)


@pytest.mark.parametrize("chip", [name for name, entry in roofline.CHIPS.items() if entry.generation < 5])
def test_plain_metal_tile_is_the_model_s_best_steel_tile_within_mlx_s_bounds(chip):
    """Every plain-metal chip, dtype and layout, a large square problem and one under MLX's 2^20-outputs
    threshold. The port: `_steel_tile` is the (bm, bn, bk, 32 wm wn) MLX's host logic picks given that
    chip's architecture string (the M2 and M4 Pro report 's': MLX's medium tile, not the base
    chip's). Issue 35 item 1 (every dtype and layout): the dispatch's tile is one of MLX's steel tiles
    with at least the threadgroups per core and at most the device loads and barriers of MLX's tile for
    the chip, and none of those is predicted faster (beyond KEEP_MLX_TILE when MLX's tile is kept)."""
    on = roofline.CHIPS[chip]
    device = mg.Device(on.architecture.name)
    steel = [(bm, bn, bk, 32 * sg) for bm, bn, bk, sg in STEEL_TILES]
    for M, N, K in ((4096, 4096, 4096), (512, 512, 512)):
        for dtype in TORCH:
            for layout in ("nn", "nt", "tn"):
                ta, tb = layout == "tn", layout == "nt"
                bm, bn, bk, wm, wn = mg.gemm_tile(M, N, K, TORCH[dtype], ta, tb, device=device)
                rule = _steel_tile(on, M, N, K, dtype, ta, tb, 0)
                mlx = (bm, bn, bk, 32 * wm * wn)
                assert (rule.block_m, rule.block_n, rule.block_k, rule.threads) == mlx, (chip, device.architecture, M, dtype, layout)
                choice = matmul_config(M, N, K, dtype, chip=chip, target="metal", trans_A=ta, trans_B=tb)
                got = (choice.block_m, choice.block_n, choice.block_k, choice.threads)
                assert got in steel and choice.splits == 1, (chip, M, dtype, layout, choice.describe())
                theirs, mine = _unsplit_estimate(on, M, N, K, dtype, mlx), _unsplit_estimate(on, M, N, K, dtype, got)
                assert mine.counts.threadgroups_per_core >= theirs.counts.threadgroups_per_core
                assert mine.counts.core_load_bytes <= theirs.counts.core_load_bytes
                assert mine.counts.launch_barriers <= theirs.counts.launch_barriers
                assert mine.counts.threadgroup_replays == 0
                for other in steel:
                    found = _unsplit_estimate(on, M, N, K, dtype, other)
                    if (found.counts.threadgroups_per_core >= theirs.counts.threadgroups_per_core
                            and found.counts.core_load_bytes <= theirs.counts.core_load_bytes
                            and found.counts.launch_barriers <= theirs.counts.launch_barriers):
                        slack = 1 + KEEP_MLX_TILE if got == mlx else 1
                        assert mine.seconds <= found.seconds * slack, (chip, M, dtype, layout, got, other, mine.seconds, found.seconds)
                if got != mlx:
                    assert mine.seconds * (1 + KEEP_MLX_TILE) < theirs.seconds, (chip, M, dtype, layout, got)
                    assert any("faster than MLX's tile" in r for r in choice.reasons), choice.describe()


def test_architecture_strings_name_generation_and_source():
    """Each chip's string is of its own generation (M1 g13 ... M5 g17) with a size letter MLX reads,
    and names where it comes from; the M2 / M4 Pro strings are the Max's (the reason the Pro tile moved)."""
    for name, entry in roofline.CHIPS.items():
        arch = entry.architecture
        assert re.fullmatch(rf"applegpu_g{12 + entry.generation}[gpsd]", arch.name), (name, arch.name)
        assert arch.source and (arch.estimated or "https://" in arch.source), (name, arch.source)
    for generation in (2, 4):
        assert roofline.chip(f"M{generation} Pro").architecture.name == roofline.chip(f"M{generation} Max").architecture.name


def _plugin(layout: str, dtype: str, M: int, N: int, K: int):
    choice = matmul_config(M, N, K, dtype, chip="M3", target="metal", trans_A=layout == "tn", trans_B=layout == "nt")
    assert choice.route == GEMM, choice.describe()
    kernel = compile_choice(choice, "emulator")
    a, b = _operands(layout, dtype, M, N, K)
    torch.testing.assert_close(kernel(a, b).float(), _reference(layout, a, b).to(TORCH[dtype]).float(), rtol=2e-2, atol=2e-2)
    regs, occupancy = kernel_occupancy(artifact_of(kernel.get_kernel_source()).kernels[0])
    return counters(kernel, a, b).total, regs.total, occupancy.threadgroups


def _operands(layout: str, dtype: str, M: int, N: int, K: int):
    g = torch.Generator().manual_seed(M + N + K)
    a = torch.randn((K, M) if layout == "tn" else (M, K), generator=g).to(TORCH[dtype])
    b = torch.randn((N, K) if layout == "nt" else (K, N), generator=g).to(TORCH[dtype])
    return a, b


def _reference(layout: str, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.T if layout == "tn" else a).float() @ (b.T if layout == "nt" else b).float()


@pytest.mark.parametrize("layout, dtype", [("nn", "float16"), ("nt", "bfloat16"), ("tn", "float32")])
def test_staged_gemm_counts_at_or_ahead_of_mlx_steel(mlx_include, layout, dtype):
    """128x128x64 on an M3 (both kernels verified against torch): no bank replays (the padded rows;
    dense rows replayed 3328 / 3072 / 4608 times here), threadgroups per core at least MLX's (registers
    at most MLX's where the dispatch takes MLX's tile), and barriers, load instructions and device
    transactions at most MLX's."""
    M = N = 128
    K = 64
    ta, tb = layout == "tn", layout == "nt"
    mine, registers, threadgroups = _plugin(layout, dtype, M, N, K)
    a, b = _operands(layout, dtype, M, N, K)
    tile = mg.gemm_tile(4096, 4096, 4096, TORCH[dtype], ta, tb)  # the full problem's tile (compare_mlx's rows)
    out, launch = mg.steel_gemm(a, b, transpose_a=ta, transpose_b=tb, include=mlx_include, tile=tile)
    torch.testing.assert_close(out.float(), _reference(layout, a, b).to(TORCH[dtype]).float(), rtol=2e-2, atol=2e-2)
    theirs = launch.counters()
    estimate = load_benchmark("mlx_registers").steel_gemm(*tile, dtype, transpose_a=ta, transpose_b=tb)

    assert mine["threadgroup_replays"] == 0, mine
    assert threadgroups >= estimate.occupancy().threadgroups, (registers, threadgroups, estimate)
    choice = matmul_config(M, N, K, dtype, chip="M3", target="metal", trans_A=ta, trans_B=tb)
    bm, bn, bk, wm, wn = mg.gemm_tile(M, N, K, TORCH[dtype], ta, tb)
    if (choice.block_m, choice.block_n, choice.block_k, choice.threads) == (bm, bn, bk, 32 * wm * wn):  # MLX's own tile
        assert registers <= estimate.registers, (registers, estimate)
    counted = ("threadgroup_barriers", "load_instructions", "device_transactions") if memory_counts_unavailable() is None else (
        "threadgroup_barriers",)
    for name in counted:
        assert mine[name] <= theirs[name], (name, mine[name], theirs[name])
