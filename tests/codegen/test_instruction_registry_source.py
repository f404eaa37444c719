"""A registered instruction lowers from its data alone: a hypothetical matmul2d(32, 32, 16) behind a
made-up target key (tests/unit/test_instruction_registry.py) reaches the plan, the GEMM lowering's
fragment sizes, the fragment layout of a register accumulator and the printer's descriptor, with no
other code change. (The emulator cannot run it: its matmul2d shim is written per shape.)"""

import re
import sys
from pathlib import Path

import pytest
from gemm_support import lower_source

from tilelang_metal.target import isa
from tilelang_metal import kernels as E
from tilelang_metal.gemm import GemmPlan, recorded_plans
from tilelang_metal.host import Target

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
from test_instruction_registry import WIDE_KEY, wide_instruction  # noqa: E402


def wide_target():
    return Target({"kind": "metal", "keys": ["metal", "gpu", "metal4", WIDE_KEY]})


@pytest.fixture
def wide():
    with isa.REGISTRY.registered(wide_instruction(), first=True) as inst:
        yield inst


def _lower(func, target):
    """The MSL and the instructions of the T.gemm plans (layout inference and lowering both plan)."""
    with recorded_plans() as plans:
        src = lower_source(func, target)
    return src, {p.instruction for p in plans if isinstance(p, GemmPlan)}, [p for p in plans if isinstance(p, GemmPlan)]


@pytest.mark.no_source_check  # the emulator's matmul2d shim has no 32x32x16
def test_direct_global_gemm_takes_every_size_from_the_registered_instruction(wide):
    src, instructions, plans = _lower(E.gemm_direct_global(64, 128, 64), wide_target())
    assert instructions == {wide} and "matmul2d_32x32x16" in plans[0].describe()
    part = plans[0].partition
    rows, cols = 64 // part.m_warp // 32, 128 // part.n_warp // 32  # 32x32 fragments per simdgroup
    assert "mpp::tensor_ops::matmul2d_descriptor(32, 32, 16, false, false, true" in src
    assert "matmul2d_descriptor(16, 32, 16" not in src
    assert f"half A_frag[{rows * 16}];" in src and f"half B_frag[{cols * 16}];" in src  # 16 left, 16 right elements per lane
    assert len(re.findall(r"auto C_accum_ct\d+ = __ct_op\.get_destination_cooperative_tensor", src)) == rows * cols
    assert "C_accum_ct0[31]" in src and "C_accum_ct0[32]" not in src  # 32 destination elements per lane
    assert src.count("for (ushort __i = 0; __i < 16; ++__i) __ct_a[__i]") == rows * cols


@pytest.mark.no_source_check  # the emulator's matmul2d shim has no 32x32x16
def test_register_accumulator_layout_follows_the_registered_lane_map(wide):
    src, instructions, _ = _lower(E.gemm_shared(64, 64, 64, epilogue="relu"), wide_target())
    assert instructions == {wide}
    assert "matmul2d_descriptor(32, 32, 16" in src and "max(" in src  # the T.Parallel epilogue lowered through the layout


def test_an_instruction_the_target_lacks_changes_nothing(wide):
    func = E.gemm_direct_global(64, 128, 64)
    with_wide, instructions, _ = _lower(func, E.metal4_target())
    assert instructions == {isa.MATMUL2D_16x32x16}
    isa.REGISTRY.unregister(wide.name)  # the same kernel with the registry as shipped
    try:
        without = lower_source(func, E.metal4_target())
    finally:
        isa.REGISTRY.register(wide, first=True)
    assert with_wide == without
