"""Mutation test: the emulator's lane layouts are its own (shim), not the emitter's tables, so a
wrong lane mapping in the GEMM lowering must make the numbers wrong."""

import pytest
from gemm_support import assert_close, compile_emulated, operands

from tilelang_metal import kernels as E
from tilelang_metal.emulator import EmulatorRuntimeError
from tilelang_metal import isa as lane_layout  # the lane maps live in the isa module


def _run(target):
    a, b, ref = operands(64, 128, 32, "float16")
    out = compile_emulated(E.gemm_direct_global(64, 128, 32, out_dtype="float32"), target)(a, b)
    assert_close(out, ref, "float16", "float32", 32, "mutant")


def _expect_red(target):
    with pytest.raises((AssertionError, EmulatorRuntimeError)):
        _run(target)


def test_unmutated_layouts_are_green(metal4, plain_metal):
    _run(metal4)
    _run(plain_metal)


def test_swapped_cooperative_tensor_column_bits_fail(metal4, monkeypatch):
    # lane bits 0 and 3 select the column group: swap their weights
    monkeypatch.setattr(lane_layout, "ct_base_col", lambda lane: 4 * ((lane // 8) % 2) + 8 * (lane % 2))
    _expect_red(metal4)


def test_shifted_cooperative_tensor_rows_fail(metal4, monkeypatch):
    original = lane_layout.ct_base_row
    monkeypatch.setattr(lane_layout, "ct_base_row", lambda lane: (original(lane) + 1) % 8)
    _expect_red(metal4)


def test_wrong_simdgroup_matrix_column_fails(plain_metal, monkeypatch):
    # swap the weights of lane bits 0 and 3 in the column formula
    monkeypatch.setattr(lane_layout, "sg_col", lambda lane, elem: 4 * (lane % 2) + 2 * ((lane // 8) % 2) + elem)
    # M=60 is an edge tile: A is gathered lane by lane through the emitter's table, while B
    # (aligned) goes through simdgroup_load, whose layout lives in the shim only
    a, b, ref = operands(60, 128, 32, "float16")
    with pytest.raises((AssertionError, EmulatorRuntimeError)):
        out = compile_emulated(E.gemm_direct_global(60, 128, 32, out_dtype="float32"), plain_metal)(a, b)
        assert_close(out, ref, "float16", "float32", 32, "mutant")


def test_consistent_row_permutation_is_harmless(plain_metal, monkeypatch):
    """Why the row mutation is not in the list above: permuting A's rows and C's rows with the same
    table multiplies out (P A) B = P (A B) and stores it back through P: still the right answer."""
    monkeypatch.setattr(lane_layout, "sg_row", lambda lane: 4 * ((lane // 2) % 2) + 2 * ((lane // 4) % 2) + (lane // 16) % 2)
    a, b, ref = operands(60, 128, 32, "float16")
    out = compile_emulated(E.gemm_direct_global(60, 128, 32, out_dtype="float32"), plain_metal)(a, b)
    assert_close(out, ref, "float16", "float32", 32, "row-permuted")
