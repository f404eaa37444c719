"""The autotuner's view of the cost model (tilelang_metal.tuning.autotune.traffic_model / rank_by_model, thin
calls into tilelang_metal.performance.cost_model): cache reuse within a wave of resident threadgroups and the block
swizzle's effect on it, and the ranking's order, without building a kernel."""

from __future__ import annotations

from dataclasses import replace

from tilelang_metal.tuning import autotune
from tilelang_metal.performance import cost_model, roofline
from tilelang_metal import kernels
from tilelang_metal.tuning.autotune import DIRECT_GLOBAL, SHARED, GemmConfig
from tilelang_metal.target.capabilities import capabilities_with

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
    """Prime sizes: partial tiles are computed whole (K padded to the step of the instruction GemmMetal
    selects: for K = 53 the 8x8 simdgroup matrix, so 56), padding threadgroups of the swizzled grid read nothing."""
    cfg = GemmConfig(DIRECT_GLOBAL, 64, 64, 128, swizzle=8)
    target = kernels.metal4_target()
    step = autotune.model_kernel(cfg, 53, target=target).instruction.k
    t = autotune.traffic_model(cfg, 97, 131, 53, chip=M4, target=target)
    tiles, padded = 2 * 3, -(-53 // step) * step
    assert (step, padded) == (8, 56)
    assert t.matrix_flops == tiles * 2 * 64 * 64 * padded
    assert t.dram_bytes == (2 * 64 + 3 * 64) * padded * 2 + 97 * 131 * 2


def test_rank_orders_by_time_class_then_operand_reuse():
    """`cost_model.rank` (the autotuner's and the dispatch's order): times within NEAR_TIE are one class,
    where more operand reuse per simdgroup goes first; a time beyond it decides before reuse."""
    cfg = GemmConfig(SHARED, 64, 128, 128, 16, 0, 8)
    base = cost_model.estimate(autotune.traffic_model(cfg, 4096, 4096, 4096, chip=M4), M4)
    reusing = replace(base.counts, operand_reuse=base.counts.operand_reuse * 2)
    near = replace(base, counts=reusing, compute_seconds=base.compute_seconds * (1 + autotune.NEAR_TIE / 2))
    far = replace(base, counts=reusing, compute_seconds=base.compute_seconds * (1 + 3 * autotune.NEAR_TIE))
    assert near.seconds < base.seconds * (1 + autotune.NEAR_TIE) < far.seconds
    assert [r.item for r in cost_model.rank([("base", base), ("near", near)])] == ["near", "base"]
    ranked = cost_model.rank([("far", far), ("base", base)])
    assert [r.item for r in ranked] == ["base", "far"] and (ranked[0].band, ranked[1].band) >= (0, 2)


def test_small_shares_pay_their_fragment_loads():
    """4096^2 on M4's 10 cores: 32x32 tiles on 2 simdgroups (16x32 of C each) spread over the cores as
    evenly as 64x128 on 4 (32x64 each), but load twice the fragments per matrix FLOP: the model's issue
    overhead puts them more than a tie class behind, and the ranking puts the larger share first."""
    small, large = GemmConfig(SHARED, 32, 32, 64, 16, 0, 8), GemmConfig(SHARED, 64, 128, 128, 16, 0, 8)
    ts, tl = (autotune.traffic_model(c, 4096, 4096, 4096, chip=M4) for c in (small, large))
    assert (ts.operand_reuse, tl.operand_reuse) == (2 * 32 * 16 / (32 + 16), 2 * 32 * 64 / (32 + 64))
    assert abs(ts.busiest_core_flops / tl.busiest_core_flops - 1) < 1e-3 and ts.issue_overhead > tl.issue_overhead
    ranked = autotune.rank_by_model([small, large], 4096, 4096, 4096, chip=M4)
    assert [r.config for r in ranked] == [large, small] and ranked[1].band >= 1


def test_split_k_pays_its_combine_kernel_and_second_launch():
    """Split-K at 4096^3 on M4: the slices write float32 partials, then a second kernel reads them back
    and writes C. That kernel runs after the slices (nothing overlaps it) and is a launch of its own;
    the model used to fold the partials into the overlapped memory term, where the compute term hid
    them, and ranked 8-16 slices as fast as the unsplit kernel."""
    M = N = K = 4096
    unsplit = cost_model.plugin_kernel(SHARED, 64, 64, 64, metal4=False, block_k=16, stages=1, K=K)
    base = cost_model.predict(unsplit, M, N, K, chip=M4)
    for splits in (2, 8, 16):
        split = replace(unsplit, route=cost_model.SPLIT_K, splits=splits)
        est = cost_model.predict(split, M, N, K, chip=M4)
        combine_bytes = splits * M * N * 4 + M * N * 2  # read every slice's float32 partial, write C in fp16
        assert est.terms["combine"] == combine_bytes / (M4.bandwidth_gbs * 1e9)
        assert est.terms["launches"] == 2 * base.terms["launches"] > 0
        assert est.seconds >= base.seconds + est.terms["combine"] + base.terms["launches"] - base.barrier_seconds

