"""tilelang_metal.performance.register_budget: the register estimate of known plans, computed by hand, the budget
and its sources, and the occupancy it implies. No kernel is built except one lowering for a GemmPlan."""

from __future__ import annotations

import pytest

from tilelang_metal.tuning import autotune
from tilelang_metal import kernels as E
from tilelang_metal.tuning.autotune import DIRECT_GLOBAL, SHARED, GemmConfig
from tilelang_metal.target.capabilities import capabilities_with
from tilelang_metal.performance.register_budget import OCCUPANCY, REGISTER_BUDGET, RegisterEstimate, estimate_registers, threads_per_core

METAL4, PLAIN = capabilities_with({"metal4"}), capabilities_with(())


def test_shared_64x128x32_on_128_threads_by_hand():
    """metal4: 4 simdgroups split 2x2, each 32x64 of C = 2x2 matmul2d 16x32 destinations of 16 floats
    (64 registers); one K step of operands 2 left fragments of 8 halves + 2 right of 16 (48 halves,
    24 registers); staging (64*32 + 32*128) / 128 = 48 halves (24); addresses 5 + 3 device + 3
    threadgroup offsets; 2 reserved."""
    cfg = GemmConfig(SHARED, 64, 128, 128, 32, 2)
    e = estimate_registers(cfg, target=METAL4)
    assert e.breakdown() == {"accumulator": 64, "operands": 24, "prefetch": 0, "staging": 24, "addresses": 11, "reserved": 2}
    assert e.total == 125 and e.fits and e.half_registers == 250
    # plain metal: 8x8 simdgroup matrices of 2 elements per lane: 4 rows x 8 cols of fragments per simdgroup
    plain = estimate_registers(cfg, target=PLAIN)
    assert (plain.accumulator, plain.operands, plain.staging) == (64, (4 * 2 + 8 * 2) // 2, 24)
    assert estimate_registers(cfg, target=METAL4, staging=False).total == 125 - 24
    assert estimate_registers(GemmConfig(SHARED, 64, 128, 128, 32, 0), target=METAL4).staging == 0  # no pipeline, no staging


def test_direct_global_and_prefetch_by_hand():
    e = estimate_registers(GemmConfig(DIRECT_GLOBAL, 64, 128, 128), target=METAL4)
    assert e.breakdown() == {"accumulator": 64, "operands": 24, "prefetch": 0, "staging": 0, "addresses": 8, "reserved": 2}
    with_prefetch = estimate_registers(GemmConfig(DIRECT_GLOBAL, 64, 128, 128), target=METAL4, prefetch=True)
    assert with_prefetch.prefetch == 24 and with_prefetch.total == 122 and with_prefetch.fits
    fp32 = estimate_registers(GemmConfig(DIRECT_GLOBAL, 64, 128, 128), dtype="float32", target=METAL4, prefetch=True)
    assert (fp32.operands, fp32.total, fp32.fits) == (48, 170, False)  # 32-bit operands: twice the registers


def test_over_budget_and_neighbours():
    big = estimate_registers(GemmConfig(SHARED, 128, 128, 128, 32, 2), target=METAL4)
    assert big.accumulator == 128 and big.total == 205 and not big.fits
    assert big.without(staging=True).total == 173 and not big.without(staging=True).fits
    wider = estimate_registers(GemmConfig(SHARED, 128, 128, 256, 32, 2), target=METAL4)
    assert (wider.accumulator, wider.staging, wider.total, wider.fits) == (64, 16, 117, True)
    at_budget = RegisterEstimate(REGISTER_BUDGET.registers - 2, 0, 0, 0, 0)
    assert at_budget.fits and not RegisterEstimate(REGISTER_BUDGET.registers - 1, 0, 0, 0, 0).fits
    assert "about 205 of 128" in big.describe() and "accumulator 128" in big.describe()


def test_the_estimate_of_a_plan_is_the_configuration_s():
    """A GemmPlan (what lowering decided) and the autotuner's configuration give the same estimate."""
    import tilelang

    from tilelang_metal.gemm import GemmPlan, recorded_plans
    from tilelang_metal.host import resolve_target
    from tilelang_metal.host.passes import pass_context

    target = resolve_target(E.metal4_target())
    func = autotune.build(GemmConfig(SHARED, 64, 128, 128, 32, 2), 64, 128, 64)
    with recorded_plans() as plans, pass_context(), target:
        tilelang.lower(func, target=target)
    plan = next(p for p in plans if isinstance(p, GemmPlan))
    assert estimate_registers(plan) == estimate_registers(GemmConfig(SHARED, 64, 128, 128, 32, 2), target=METAL4, staging=False)
    with pytest.raises(ValueError, match="staging tile"):
        estimate_registers(plan, staging=True)


def test_budget_has_sources_and_occupancy_follows_the_table():
    assert REGISTER_BUDGET.registers * 2 == REGISTER_BUDGET.half_registers == OCCUPANCY[-1][0] == 256
    assert len(REGISTER_BUDGET.sources) >= 3 and any("Mesa" in s for s in REGISTER_BUDGET.sources)
    assert [t for _, t in OCCUPANCY] == sorted((t for _, t in OCCUPANCY), reverse=True)
    assert threads_per_core(RegisterEstimate(50, 0, 0, 0, 0, 2)) == 1024  # 104 half-registers
    assert threads_per_core(RegisterEstimate(51, 0, 0, 0, 0, 2)) == 896
    assert threads_per_core(RegisterEstimate(200, 0, 0, 0, 0)) == 384  # past the budget: the floor
