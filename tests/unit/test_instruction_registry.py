"""The matrix-instruction registry (isa.py): instructions as data, filtered by target features, and
everything derived from them: lane maps, selection, counter names, FLOPs.

A hypothetical instruction (matmul2d 32x32x16 behind a made-up target key) shows that registering
one entry is all the Python side needs: selection picks it, counter names and the roofline's FLOPs
follow, and nothing selects it by default."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tilelang_metal.performance import cost_model, roofline
from tilelang_metal.target import isa
from tilelang_metal.emulator import COUNTER_NAMES
from tilelang_metal.target.capabilities import capabilities_with
from tilelang_metal.target.isa import COOPERATIVE_TENSOR_KIND, ELEM, LANE, REGISTRY, SIMDGROUP_KIND, LaneMap, bits
from tilelang_metal.selection import cooperative_tensor_blockers, select_inst

METAL4, PLAIN = capabilities_with({"metal4"}), capabilities_with(())

SHIM = Path(isa.__file__).parents[1] / "emulator" / "shim" / "tlm"
WIDE_KEY = "tlm_test_wide_mpp"  # no real target has it


def wide_instruction(**changes) -> isa.MatrixInstruction:
    """matmul2d(32, 32, 16), hypothetical: the 16x32 right operand of matmul2d(16, 32, 16), and left /
    destination with one more element bit for the extra 16 rows."""
    left = LaneMap(
        row=(bits(LANE, 4, at=2), bits(LANE, 2, at=1), bits(LANE, 1, at=0), bits(ELEM, 2, at=3), bits(ELEM, 3, at=4)),
        col=(bits(LANE, 3, at=3), bits(LANE, 0, at=2), bits(ELEM, 0, at=0, width=2)),
    )
    destination = LaneMap(
        row=(bits(LANE, 4, at=2), bits(LANE, 2, at=1), bits(LANE, 1, at=0), bits(ELEM, 2, at=3), bits(ELEM, 4, at=4)),
        col=(bits(ELEM, 3, at=4), bits(LANE, 3, at=3), bits(LANE, 0, at=2), bits(ELEM, 0, at=0, width=2)),
    )
    return isa.matmul2d(32, 32, 16, left, isa.MATMUL2D_16x32_MAP, destination, requires=("metal4", WIDE_KEY), **changes)


# ------------------------------------------------------------------ lane maps as data
def _layouts_h_sg8(lane: int) -> tuple[int, int]:
    """shim/tlm/layouts.h, sg8_row / sg8_col (written from docs/lane_layouts.md, not from isa.py)."""
    return ((lane // 4) & 4) + (lane // 2) % 4, ((lane // 4) & 2) * 2 + (lane % 2) * 2


def _layouts_h_ct(lane: int, e: int) -> tuple[int, int]:
    """shim/tlm/layouts.h, ct_row / ct_col."""
    return ((lane >> 2) & 4) + ((lane >> 1) & 3) + 8 * ((e >> 2) & 1), 16 * (e >> 3) + 4 * (((lane >> 2) & 2) + (lane & 1)) + (e & 3)


def test_registered_lane_maps_match_the_shim_layouts_element_by_element():
    sg, ct = isa.SIMDGROUP_8x8x8, isa.MATMUL2D_16x32x16
    for lane in range(32):
        r, c = _layouts_h_sg8(lane)
        for role in (sg.left, sg.right, sg.destination):
            assert [(role.row(lane, e), role.col(lane, e)) for e in range(2)] == [(r, c), (r, c + 1)]
        for role in (ct.left, ct.right, ct.destination):
            assert all((role.row(lane, e), role.col(lane, e)) == _layouts_h_ct(lane, e) for e in range(role.elems))


@pytest.mark.parametrize("inst", [isa.SIMDGROUP_8x8x8, isa.MATMUL2D_16x32x16, wide_instruction()], ids=lambda i: i.name)
def test_inverse_maps_and_run_widths_derive_from_the_tables(inst):
    for role in (inst.left, inst.right, inst.destination):
        assert role.elems * 32 == role.rows * role.cols
        for lane in range(32):
            for e in range(role.elems):
                r, c = role.row(lane, e), role.col(lane, e)
                assert (role.lane_of(r, c), role.elem_of(r, c)) == (lane, e)
    assert inst.run == (2 if inst.kind == SIMDGROUP_KIND else 4)


def test_shapes_element_counts_and_flops_are_the_instructions_own():
    ct = isa.MATMUL2D_16x32x16
    assert (ct.shape, ct.left_elems, ct.right_elems, ct.dest_elems) == ((16, 32, 16), 8, 16, 16)
    assert ct.flops == 2 * 16 * 32 * 16 and ct.counter == "matmul2d_16x32x16" and ct.requires == {"metal4"}
    wide = wide_instruction()
    assert (wide.left_elems, wide.right_elems, wide.dest_elems) == (16, 16, 32) and wide.flops == 2 * 32 * 32 * 16


def test_a_non_bijective_lane_map_is_refused_with_one_line():
    broken = LaneMap(row=(bits(LANE, 4, at=2), bits(LANE, 2, at=1), bits(LANE, 2, at=0)), col=isa.SIMDGROUP_8x8_MAP.col)
    inst = isa.MatrixInstruction(
        "broken_8x8x8", SIMDGROUP_KIND, 8, 8, 8, **isa.roles(8, 8, 8, broken), operation="simdgroup_multiply_accumulate", msl=""
    )
    with pytest.raises(ValueError, match=r"^broken_8x8x8 left: lane \d+ element \d maps to \(\d, \d\), outside or taken$"):
        REGISTRY.register(inst)
    assert "broken_8x8x8" not in [i.name for i in REGISTRY]


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        REGISTRY.register(isa.MATMUL2D_16x32x16)


# ------------------------------------------------------------------ the registry and selection
def test_registry_filters_by_target_features():
    assert [i.name for i in REGISTRY.available(set())] == ["simdgroup_multiply_accumulate_8x8x8"]
    assert [i.name for i in REGISTRY.available({"metal4"})] == ["matmul2d_16x32x16", "simdgroup_multiply_accumulate_8x8x8"]
    assert "simdgroup_multiply_8x8x8" not in [i.name for i in REGISTRY.available({"metal4"})]  # counted, never selected


def test_selection_carries_the_instruction_and_derives_its_kind():
    ct = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=0, capabilities=METAL4)
    assert ct.instruction is isa.MATMUL2D_16x32x16 and ct.kind == COOPERATIVE_TENSOR_KIND
    sg = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=0, capabilities=PLAIN)
    assert sg.instruction is isa.SIMDGROUP_8x8x8 and sg.kind == SIMDGROUP_KIND


def test_a_registered_instruction_is_selected_only_where_the_target_has_its_features():
    with REGISTRY.registered(wide_instruction(), first=True) as wide:
        default = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=0, capabilities=METAL4)
        assert default.instruction is isa.MATMUL2D_16x32x16  # not selectable by default
        chosen = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=0, capabilities=capabilities_with({"metal4", WIDE_KEY}))
        assert chosen.instruction is wide and chosen.kind == COOPERATIVE_TENSOR_KIND
        p = chosen.partition
        assert p.simdgroups == 4 and 64 % (p.m_warp * 32) == 0 and 128 % (p.n_warp * 32) == 0
        # 16 rows are not whole 32-row fragments: the next instruction in preference order takes it
        short = select_inst(c_scope="global", M=16, N=128, K=64, threads=128, policy=0, capabilities=capabilities_with({"metal4", WIDE_KEY}))
        assert short.instruction is isa.MATMUL2D_16x32x16
        assert cooperative_tensor_blockers(0, 16, 128, 64, 4, wide) == ["M=16 is not a multiple of 32"]
        # neither fits: the reason names each candidate's blockers
        odd = select_inst(c_scope="global", M=48, N=96, K=72, threads=128, policy=0, capabilities=capabilities_with({"metal4", WIDE_KEY}))
        assert odd.kind == SIMDGROUP_KIND and "matmul2d_32x32x16: M=48 is not a multiple of 32" in odd.reason
        assert "matmul2d_16x32x16: K=72 is not a multiple of 16" in odd.reason
        # the wide key without metal4 selects nothing cooperative
        plain = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=0, capabilities=capabilities_with({WIDE_KEY}))
        assert plain.kind == SIMDGROUP_KIND
    assert wide.name not in [i.name for i in REGISTRY]


# ------------------------------------------------------------------ counters and FLOPs
def _runtime_counter_enum() -> list[str]:
    text = (SHIM / "runtime_api.h").read_text()
    body = re.sub(r"//[^\n]*", "", re.search(r"enum counter : uint32_t \{(.*?)\};", text, re.S).group(1))
    names = [n.strip().removeprefix("c_") for n in body.split(",") if n.strip()]
    assert names[-1] == "counter_count"
    return names[:-1]


def test_counter_names_are_the_runtimes_rows_and_matrix_counters_come_from_the_registry():
    assert list(COUNTER_NAMES) == _runtime_counter_enum()
    matrix = [name for name in COUNTER_NAMES if name in {i.counter for i in REGISTRY}]
    assert matrix == [i.counter for i in isa.COUNTED]
    assert all(re.fullmatch(r"(matmul2d|simdgroup_multiply_accumulate|simdgroup_multiply)_\d+x\d+x\d+", n) for n in matrix)


def test_roofline_flops_follow_the_registry():
    assert roofline.MATRIX_FLOPS == {i.counter: i.flops for i in isa.COUNTED}
    chip = roofline.Chip("X", 1, 1.0, 100.0, "test")
    with REGISTRY.registered(wide_instruction()) as wide:
        assert roofline.matrix_flops()[wide.counter] == 2 * 32 * 32 * 16
        assert cost_model.roofline_estimate({"matmul2d_32x32x16": 3}, chip).matrix_flops == 3 * 32768
    assert "matmul2d_32x32x16" not in roofline.matrix_flops()
