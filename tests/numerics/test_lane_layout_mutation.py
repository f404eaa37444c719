"""Mutation test: the emulator's lane layouts are its own (shim), not the emitter's tables, so a
wrong lane map in the instruction registry (isa.py: the lane maps are data, bit-field tables) must
make the numbers wrong. Each mutant is a consistent map (a bijection, its inverse derived from it)
that is not the hardware's; it stands in for the registered instruction while the kernel lowers."""

import dataclasses

import pytest
from gemm_support import assert_close, compile_emulated, operands

from tilelang_metal.target import isa
from tilelang_metal import kernels as E
from tilelang_metal.emulator import EmulatorRuntimeError
from tilelang_metal.target.isa import ELEM, LANE, LaneMap, bits


def _with_lane_map(inst: isa.MatrixInstruction, lane_map: LaneMap) -> isa.MatrixInstruction:
    """`inst` with every operand role on `lane_map`."""
    return dataclasses.replace(
        inst, **{role: dataclasses.replace(getattr(inst, role), lane_map=lane_map) for role in ("left", "right", "destination")}
    )


def _mutant(name: str, row: tuple | None = None, col: tuple | None = None) -> isa.MatrixInstruction:
    inst = isa.REGISTRY.named(name)
    base = inst.destination.lane_map
    return _with_lane_map(inst, LaneMap(row=row or base.row, col=col or base.col))


CT, SG = isa.MATMUL2D_16x32x16.name, isa.SIMDGROUP_8x8x8.name


def _run(target, M=64):
    a, b, ref = operands(M, 128, 32, "float16")
    out = compile_emulated(E.gemm_direct_global(M, 128, 32, out_dtype="float32"), target)(a, b)
    assert_close(out, ref, "float16", "float32", 32, "mutant")


def _expect_red(target, mutant, M=64):
    with isa.REGISTRY.substituted(mutant), pytest.raises((AssertionError, EmulatorRuntimeError)):
        _run(target, M)


def test_unmutated_layouts_are_green(metal4, plain_metal):
    _run(metal4)
    _run(plain_metal)


def test_mutants_are_consistent_maps():
    """The mutants below are bijections the registry accepts: only their agreement with the
    hardware (the shim) is wrong."""
    for mutant in (_swapped_ct_columns(), _swapped_ct_rows(), _swapped_sg_columns(), _permuted_sg_rows()):
        mutant.check()
        assert mutant != isa.REGISTRY.named(mutant.name)


def _swapped_ct_columns():
    # lane bits 0 and 3 select the column group: swap their weights
    return _mutant(CT, col=(bits(ELEM, 3, at=4, width=0), bits(LANE, 3, at=2), bits(LANE, 0, at=3), bits(ELEM, 0, at=0, width=2)))


def _swapped_ct_rows():
    # lane bits 4 and 1 exchange their row weights (a row permutation of A, C and, through the shared map, of B's K rows)
    return _mutant(CT, row=(bits(LANE, 1, at=2), bits(LANE, 2, at=1), bits(LANE, 4, at=0), bits(ELEM, 2, at=3)))


def _swapped_sg_columns():
    # swap the weights of lane bits 0 and 3 in the column formula
    return _mutant(SG, col=(bits(LANE, 0, at=2), bits(LANE, 3, at=1), bits(ELEM, 0, at=0, width=0)))


def _permuted_sg_rows():
    return _mutant(SG, row=(bits(LANE, 1, at=2), bits(LANE, 2, at=1), bits(LANE, 4, at=0)))


def test_swapped_cooperative_tensor_column_bits_fail(metal4):
    _expect_red(metal4, _swapped_ct_columns())


def test_swapped_cooperative_tensor_row_bits_fail(metal4):
    _expect_red(metal4, _swapped_ct_rows())


def test_wrong_simdgroup_matrix_column_fails(plain_metal):
    # M=60 is an edge tile: A is gathered lane by lane through the emitter's table, while B
    # (aligned) goes through simdgroup_load, whose layout lives in the shim only
    _expect_red(plain_metal, _swapped_sg_columns(), M=60)


def test_consistent_row_permutation_is_harmless(plain_metal):
    """Why the simdgroup row mutation is not in the list above: permuting A's rows and C's rows with
    the same table multiplies out (P A) B = P (A B) and stores it back through P: still the right
    answer (B, aligned, goes through the shim's simdgroup_load)."""
    with isa.REGISTRY.substituted(_permuted_sg_rows()):
        _run(plain_metal, M=60)
