"""The Metal GEMM configuration space (tilelang_metal.tuning.autotune): which configurations it keeps, why it
drops the others, and that its verdicts agree with what lowering actually does."""

from __future__ import annotations

import pytest
import tilelang
from tilelang import tvm

from tilelang_metal.tuning import autotune
from tilelang_metal import kernels as examples
from tilelang_metal.target.capabilities import capabilities_with
from tilelang_metal.target.isa import COOPERATIVE_TENSOR_KIND
from tilelang_metal.tuning.autotune import DIRECT_GLOBAL, SHARED, GemmConfig, config_space, rejection, threadgroup_bytes
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.target.limits import THREADGROUP_MEMORY_BYTES

METAL4, PLAIN = capabilities_with({"metal4"}), capabilities_with(())


@pytest.fixture(scope="module")
def space_4096():
    return config_space(4096, 4096, 4096, target=examples.metal4_target())


def test_space_holds_the_fastest_kernels_tile_configurations(space_4096):
    """MLX-class tiles on Metal 4: 128x128 with 16 simdgroups, 64x128 with 8, on both paths."""
    assert GemmConfig(DIRECT_GLOBAL, 128, 128, 512) in space_4096
    assert GemmConfig(DIRECT_GLOBAL, 64, 128, 256) in space_4096
    assert GemmConfig(DIRECT_GLOBAL, 64, 128, 128, swizzle=8) in space_4096
    assert GemmConfig(SHARED, 128, 128, 256, 32, 2) in space_4096  # exactly 32 KiB staged
    assert {c.path for c in space_4096} == {DIRECT_GLOBAL, SHARED}


def test_every_kept_configuration_fits_and_has_no_rejection(space_4096):
    assert len(space_4096) == len(set(space_4096)) > 50
    for cfg in space_4096:
        assert rejection(cfg, K=4096, target=examples.metal4_target()) is None
        assert threadgroup_bytes(cfg) <= THREADGROUP_MEMORY_BYTES
        assert cfg.threads % 32 == 0 and cfg.threads <= 1024
        assert (cfg.block_k > 0) == (cfg.path == SHARED)


def test_staging_over_32_kib_is_dropped(space_4096):
    over = GemmConfig(SHARED, 128, 128, 256, 32, 3)
    assert threadgroup_bytes(over) == 3 * (128 + 128) * 32 * 2 > THREADGROUP_MEMORY_BYTES
    assert over not in space_4096
    assert "49152 B of threadgroup memory" in rejection(over)
    assert threadgroup_bytes(GemmConfig(SHARED, 128, 128, 256, 32, 2), "float32") == 65536  # fp32 staging is twice as big


@pytest.mark.parametrize(
    ("cfg", "reason"),
    [
        (GemmConfig(DIRECT_GLOBAL, 64, 64, 96), "no legal warp partition of a 64x64 tile over 3 simdgroups"),
        (GemmConfig(DIRECT_GLOBAL, 32, 32, 1024), "no legal warp partition of a 32x32 tile over 32 simdgroups"),
        (GemmConfig(DIRECT_GLOBAL, 64, 128, 100), "threads=100"),
        (GemmConfig(DIRECT_GLOBAL, 64, 128, 2048), "threads=2048"),
        (GemmConfig(DIRECT_GLOBAL, 64, 128, 128, swizzle=6), "not a power of two"),
        (GemmConfig(SHARED, 64, 64, 128), "needs block_k > 0"),
        (GemmConfig("split_k", 64, 64, 128), "unknown path"),
    ],
)
def test_rejections_name_the_rule(cfg, reason):
    assert reason in rejection(cfg, target=examples.metal4_target())


def test_hopeless_configurations_are_pruned():
    skinny = config_space(1, 4096, 4096, target=examples.metal4_target())
    assert skinny and {c.block_m for c in skinny} == {32}  # the smallest tile covers M = 1
    small = config_space(128, 128, 64, target=examples.plain_metal_target())
    assert small and not any(c.swizzle for c in small)  # 128 / 32 = 4 tile rows < an 8-row panel
    assert all(c.block_k <= 64 for c in small)
    assert all(c.block_m * c.block_n >= 16 * 32 * c.threads // 32 for c in small)  # a matmul2d per simdgroup at least
    with pytest.raises(ValueError, match="dtype 'int8'"):
        config_space(64, 64, 64, dtype="int8")


def _lowers(cfg: GemmConfig, target) -> bool:
    func = autotune.build(cfg, 256, 256, 256)
    try:
        with tvm.transform.PassContext(), target:
            tilelang.lower(func, target=target)
    except MetalLoweringError:
        return False
    return True


@pytest.mark.parametrize(
    ("cfg", "which"),
    [
        (GemmConfig(DIRECT_GLOBAL, 128, 128, 512), "metal4"),
        (GemmConfig(DIRECT_GLOBAL, 64, 64, 96), "metal4"),
        (GemmConfig(SHARED, 128, 128, 128, 32, 2), "metal4"),
        (GemmConfig(SHARED, 32, 64, 128, 64, 3), "metal4"),
        (GemmConfig(DIRECT_GLOBAL, 32, 32, 1024), "metal"),
    ],
)
def test_verdicts_agree_with_lowering(cfg, which):
    """The space's rule is the plugin's: a kept configuration lowers, a dropped one is refused."""
    target = examples.metal4_target() if which == "metal4" else examples.plain_metal_target()
    assert (rejection(cfg, K=256, target=target, registers=False) is None) == _lowers(cfg, target)


def test_configurations_over_the_register_budget_are_pruned_with_the_reason(space_4096):
    """128x128 on 128 threads lowers, but its accumulator alone is 128 registers per thread: the space
    drops it and says so; 256 threads halve the share and it stays. Everything kept fits."""
    from tilelang_metal.performance.register_budget import estimate_registers

    report = autotune.config_report(4096, 4096, 4096, target=examples.metal4_target())
    assert report.kept == space_4096
    over = GemmConfig(SHARED, 128, 128, 128, 32, 2)
    reasons = dict(report.pruned)
    assert over in reasons and "173 of 128 32-bit registers" in reasons[over] and "accumulator 128" in reasons[over]
    assert "over the register budget" in rejection(over, target=examples.metal4_target())
    assert GemmConfig(DIRECT_GLOBAL, 128, 128, 128) in reasons
    assert GemmConfig(SHARED, 128, 128, 256, 32, 2) in space_4096
    assert all(estimate_registers(c, target=METAL4, staging=False).fits for c in space_4096)
    assert any("registers" in line for line in report.describe())


def test_warp_partition_is_the_one_gemm_lowering_uses():
    """selection.warp_partition (shared by GemmMetal.plan and the space): cooperative tensors keep the
    selection's split, a metal.simdgroup accumulator gets the copy-compatible square split, a
    fragment the policy's split in 8x8 fragments, and None when no split exists."""
    from tilelang_metal import selection as sel

    ct = sel.select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=sel.WarpPolicy.SQUARE, capabilities=METAL4)
    assert ct.kind == COOPERATIVE_TENSOR_KIND
    assert sel.warp_partition(ct, "global", 0, 64, 128, 4) == ct.partition
    sg = sel.select_inst(c_scope="metal.simdgroup", M=64, N=32, K=64, threads=128, policy=0, capabilities=METAL4)
    assert sel.warp_partition(sg, "metal.simdgroup", 0, 64, 32, 4) == sel.copy_compatible_square_partition(64, 32, 4)
    frag = sel.select_inst(c_scope="local.fragment", M=64, N=32, K=64, threads=128, policy=1, capabilities=PLAIN)
    assert sel.warp_partition(frag, "local.fragment", 1, 64, 32, 4) == sel.Partition(4, 1)
    assert sel.warp_partition(frag, "local.fragment", 0, 16, 16, 3) is None
