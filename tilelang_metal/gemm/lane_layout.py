"""Per-lane element layouts the GEMM lowering relies on (the emitter's tables).

Written with `//` and `%` only so the same formulas work on Python ints and on TIR expressions
(tilelang's layout inference accepts floordiv/floormod, not bitwise ops). Provenance and the
matching emulator implementation are in docs/lane_layouts.md; the emulator's shim implements the
layouts independently, so a mistake here shows up as a numeric failure, not as a silent agreement.
"""

from __future__ import annotations

from typing import Any

# simdgroup_matrix<T, 8, 8>::thread_elements(): 2 elements per lane.
SG_ELEMS_PER_LANE = 2
# matmul2d(16, 32, 16): left 16x16 -> 8 elements per lane; right / destination 16x32 -> 16.
CT_LEFT_ELEMS = 8
CT_RIGHT_ELEMS = 16
CT_DEST_ELEMS = 16


def _bit(x: Any, k: int) -> Any:
    return (x // (1 << k)) % 2


def sg_row(lane: Any) -> Any:
    """Row of both thread elements of `lane` in an 8x8 simdgroup matrix."""
    return 4 * _bit(lane, 4) + 2 * _bit(lane, 2) + _bit(lane, 1)


def sg_col(lane: Any, elem: Any) -> Any:
    """Column of thread element `elem` (0 or 1) of `lane` in an 8x8 simdgroup matrix."""
    return 4 * _bit(lane, 3) + 2 * _bit(lane, 0) + elem


def sg_lane_of(row: Any, col: Any) -> Any:
    """Inverse of (sg_row, sg_col): which lane holds element (row, col)."""
    return 16 * _bit(row, 2) + 8 * _bit(col, 2) + 4 * _bit(row, 1) + 2 * _bit(row, 0) + _bit(col, 1)


def sg_elem_of(row: Any, col: Any) -> Any:
    return col % 2


def ct_base_row(lane: Any) -> Any:
    return 4 * _bit(lane, 4) + 2 * _bit(lane, 2) + _bit(lane, 1)


def ct_base_col(lane: Any) -> Any:
    return 8 * _bit(lane, 3) + 4 * _bit(lane, 0)


def ct_row(lane: Any, elem: Any) -> Any:
    """Row of cooperative-tensor element `elem` of `lane` (16-row fragments)."""
    return ct_base_row(lane) + 8 * _bit(elem, 2)


def ct_col(lane: Any, elem: Any) -> Any:
    """Column of cooperative-tensor element `elem` of `lane` (16- or 32-column fragments)."""
    return 16 * (elem // 8) + ct_base_col(lane) + elem % 4


def ct_lane_of(row: Any, col: Any) -> Any:
    """Inverse of (ct_row, ct_col) for a 16x32 destination fragment."""
    return 16 * _bit(row, 2) + 8 * _bit(col, 3) + 4 * _bit(row, 1) + 2 * _bit(row, 0) + _bit(col, 2)


def ct_elem_of(row: Any, col: Any) -> Any:
    return 8 * (col // 16) + 4 * (row // 8) + col % 4
