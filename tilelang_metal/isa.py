"""Matrix instructions of Apple GPUs, described once: shapes, per-lane element counts, lane maps.

Selection, the GEMM lowering, the matrix-storage pass, the printer and the tests all read the
instruction shape from here; nothing else writes `16`, `32` or `8` for a fragment. Adding an MPP
shape means a new `MatrixInstruction` here, its layout in the emulator shim (`shim/tlm/layouts.h`,
written independently from the provenance in docs/lane_layouts.md) and tests.

The lane maps are written with `//` and `%` only, so the same formulas work on Python ints and on
TIR expressions (tilelang's layout inference accepts floordiv/floormod, not bitwise ops). They are
module-level functions looked up at call time, which is what the lane-layout mutation tests patch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SIMD_WIDTH = 32  # lanes per simdgroup on every Apple GPU

SIMDGROUP_KIND = "metal.simdgroup"
COOPERATIVE_TENSOR_KIND = "metal.cooperative_tensor"


def _bit(x: Any, k: int) -> Any:
    return (x // (1 << k)) % 2


# ---------------------------------------------------------------- simdgroup_matrix<T, 8, 8>
# thread_elements(): two horizontally adjacent elements per lane.


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


# ---------------------------------------------------------------- MPP cooperative tensors
# matmul2d(16, 32, 16): left 16x16, right and destination 16x32. Lane l owns runs of 4 consecutive
# columns; element e picks the run: +8 rows for bit 2 of e, +16 columns for bit 3 of e.


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


@dataclass(frozen=True)
class MatrixInstruction:
    """One matrix multiply-accumulate instruction: C[m x n] += A[m x k] * B[k x n] per simdgroup."""

    kind: str  # the selection kind this instruction implements
    m: int
    n: int
    k: int
    left_elems: int  # elements per lane of the A / B / C fragments
    right_elems: int
    dest_elems: int
    run: int  # consecutive columns one lane owns in a layout row (the widest per-lane vector access)

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.m, self.n, self.k)

    @property
    def cooperative(self) -> bool:
        return self.kind == COOPERATIVE_TENSOR_KIND

    # Lane maps of the destination (and, for the operands, of their sub-blocks): dispatch by kind
    # to the module functions above, looked up at call time.
    def row(self, lane: Any, elem: Any) -> Any:
        return ct_row(lane, elem) if self.cooperative else sg_row(lane)

    def col(self, lane: Any, elem: Any) -> Any:
        return ct_col(lane, elem) if self.cooperative else sg_col(lane, elem)

    def lane_of(self, row: Any, col: Any) -> Any:
        return ct_lane_of(row, col) if self.cooperative else sg_lane_of(row, col)

    def elem_of(self, row: Any, col: Any) -> Any:
        return ct_elem_of(row, col) if self.cooperative else sg_elem_of(row, col)


SIMDGROUP_8x8x8 = MatrixInstruction(SIMDGROUP_KIND, 8, 8, 8, left_elems=2, right_elems=2, dest_elems=2, run=2)
MATMUL2D_16x32x16 = MatrixInstruction(COOPERATIVE_TENSOR_KIND, 16, 32, 16, left_elems=8, right_elems=16, dest_elems=16, run=4)

INSTRUCTIONS = (SIMDGROUP_8x8x8, MATMUL2D_16x32x16)


def for_kind(kind: str) -> MatrixInstruction:
    """The instruction a selection kind lowers to."""
    for inst in INSTRUCTIONS:
        if inst.kind == kind:
            return inst
    raise KeyError(f"no matrix instruction for kind {kind}")


def cooperative_instruction(m: int, n: int, k: int) -> MatrixInstruction:
    """The cooperative-tensor instruction of shape (m, n, k), as named by a `tlm_ct_mma` call."""
    for inst in INSTRUCTIONS:
        if inst.cooperative and inst.shape == (m, n, k):
            return inst
    raise KeyError(f"no cooperative-tensor instruction of shape {m}x{n}x{k}")
