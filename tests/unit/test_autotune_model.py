"""The autotuner's traffic model (tilelang_metal.autotune.traffic_model / rank_by_model): cache reuse
within a wave of resident threadgroups and the block swizzle's effect on it, without building a kernel."""

from __future__ import annotations

from tilelang_metal import autotune, roofline
from tilelang_metal.autotune import DIRECT_GLOBAL, SHARED, GemmConfig
from tilelang_metal.capabilities import capabilities_with

METAL4 = capabilities_with({"metal4"})

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
    t = autotune.traffic_model(cfg, 97, 131, 53, chip=M4, target=METAL4)
    tiles = 2 * 3
    assert t.matrix_flops == tiles * 2 * 64 * 64 * 64  # K 53 -> 64 (four 16-deep steps)
    assert t.dram_bytes == (2 * 64 + 3 * 64) * 64 * 2 + 97 * 131 * 2


def test_near_ties_go_to_the_larger_simdgroup_share():
    """4096^2 on M4's 10 cores: 32x32 tiles on 2 simdgroups round 0.06% better over the cores than
    64x128 on 4, which is inside NEAR_TIE; 64x128 loads half the fragments per matrix FLOP, so it ranks first."""
    small, large = GemmConfig(SHARED, 32, 32, 64, 16, 0, 8), GemmConfig(SHARED, 64, 128, 128, 16, 0, 8)
    ts, tl = (autotune.traffic_model(c, 4096, 4096, 4096, chip=M4) for c in (small, large))
    assert (ts.operand_reuse, tl.operand_reuse) == (2 * 32 * 16 / (32 + 16), 2 * 32 * 64 / (32 + 64))
    es, el = (autotune.model_estimate(t, M4) for t in (ts, tl))
    assert es.seconds < el.seconds < es.seconds * (1 + autotune.NEAR_TIE)
    assert [r.config for r in autotune.rank_by_model([small, large], 4096, 4096, 4096, chip=M4)] == [large, small]


def test_time_beyond_the_near_tie_decides_before_operand_reuse():
    """2048^2 on M2 Ultra's 76 cores: 2048 32x64 tiles put 27 on the busiest core, 1024 64x64 tiles 14
    (28 in 32x64 units): 3.6% apart, so the smaller share ranks first."""
    ultra = roofline.chip("M2 Ultra")
    narrow, square = GemmConfig(SHARED, 32, 64, 64, 16, 0), GemmConfig(SHARED, 64, 64, 64, 16, 0)
    ranked = autotune.rank_by_model([square, narrow], 2048, 2048, 2048, chip=ultra)
    assert [r.config for r in ranked] == [narrow, square]
    assert ranked[0].estimate.traffic.operand_reuse < ranked[1].estimate.traffic.operand_reuse
    assert ranked[1].band >= 1 and ranked[0].band == 0
