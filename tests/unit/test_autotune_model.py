"""The autotuner's traffic model (tilelang_metal.autotune.traffic_model / rank_by_model): cache reuse
within a wave of resident threadgroups and the block swizzle's effect on it, without building a kernel."""

from __future__ import annotations

from tilelang_metal import autotune, roofline
from tilelang_metal.autotune import DIRECT_GLOBAL, SHARED, GemmConfig

M4 = roofline.chip("M4")


def test_swizzle_cuts_memory_traffic_where_the_grid_is_wider_than_a_wave():
    """4096^2 in 64x128 tiles: 32 tile columns; a wave of M4's resident threadgroups then covers a
    row of tiles plus part of the next unswizzled, but 8 rows x a few columns with an 8-row panel."""
    plain = autotune.traffic_model(GemmConfig(DIRECT_GLOBAL, 64, 128, 128), 4096, 4096, 4096, chip=M4)
    swizzled = autotune.traffic_model(GemmConfig(DIRECT_GLOBAL, 64, 128, 128, swizzle=8), 4096, 4096, 4096, chip=M4)
    assert swizzled.dram_bytes < 0.6 * plain.dram_bytes
    assert (swizzled.core_load_bytes, swizzled.matrix_flops) == (plain.core_load_bytes, plain.matrix_flops)
    compulsory = (4096 * 4096 * 2) * 2 + 4096 * 4096 * 2
    assert swizzled.dram_bytes > compulsory  # never below reading A, B and writing C once
    ranked = autotune.rank_by_model([plain_cfg := GemmConfig(DIRECT_GLOBAL, 64, 128, 128),
                                     GemmConfig(DIRECT_GLOBAL, 64, 128, 128, swizzle=8)], 4096, 4096, 4096, chip=M4)
    assert ranked[0].config.swizzle == 8 and ranked[1].config == plain_cfg


def test_swizzle_changes_nothing_when_the_whole_grid_is_one_wave():
    a = autotune.traffic_model(GemmConfig(SHARED, 32, 64, 128, 32, 2), 256, 256, 256, chip=M4)
    b = autotune.traffic_model(GemmConfig(SHARED, 32, 64, 128, 32, 2, swizzle=8), 256, 256, 256, chip=M4)
    assert a.dram_bytes == b.dram_bytes == (256 * 256 * 2) * 3


def test_ragged_grid_and_padding_threadgroups():
    """Prime sizes: partial tiles are computed whole (K padded to the step), padding threadgroups of
    the swizzled grid read nothing."""
    cfg = GemmConfig(DIRECT_GLOBAL, 64, 64, 128, swizzle=8)
    t = autotune.traffic_model(cfg, 97, 131, 53, chip=M4, target=True)
    tiles = 2 * 3
    assert t.matrix_flops == tiles * 2 * 64 * 64 * 64  # K 53 -> 64 (four 16-deep steps)
    assert t.dram_bytes == (2 * 64 + 3 * 64) * 64 * 2 + 97 * 131 * 2
