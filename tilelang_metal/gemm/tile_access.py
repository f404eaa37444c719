"""Element-group access to a tile: one lane reads or writes `width` consecutive logical elements.

A group becomes one vector access when the elements are contiguous in storage (no transpose, no
annotated layout), the first one is provably aligned to the vector width, and the tile is provably
inside its buffer; two accesses of half the width when only that alignment holds (a row pitch of
70 halves: `half2`, not `half4`), and so on down. Inside the buffer with no vector alignment at all
(an odd pitch: 4097 halves) a group is one packed vector access (`packed_half4`, element-aligned;
element types without an MSL packed vector keep element accesses). Aligned tiles therefore stay
branch-free and vectorized.

In a tile that can cross the buffer's edge, a contiguous group is one vector access (aligned or
packed, as above) when its last element is inside, else per-element accesses, each guarded by its
own bounds condition: edge tiles read zeros and skip stores outside the buffer, and only the groups
the edge cuts go element by element. Edge vectors are intrinsic calls (`intrinsics.ALIGNED_LOAD`
and the packed ones), which LegalizeSafeMemoryAccess leaves alone, so a GEMM body gives the same
MSL whether that pass walks it or not.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir
from .guard_marks import note_assumption
from .problem import Operand, const_int
from .tir_build import cast, guarded, seq


def dim_in_bounds(start: Any, size: int, extent: Any, analyzer: Any) -> bool:
    """True when [start, start + size) lies inside [0, extent) for every launched block.

    Either the end is provably inside (under the analyzer's constraints: an interior threadgroup's
    branch), or the tile is aligned to its own size in an extent that is a multiple of it (then a
    tile is wholly in or wholly outside). Element guards check the upper edges only, so a symbolic
    start is taken to be >= 0. Both facts are noted on the analyzer, which knows the thread index only:
    `transform/guarded_bodies.py` proves them with the loop and launch ranges, or puts the GEMM
    under a uniform `if` when a grid or loop reaches past the matrix."""
    begin = const_int(start)
    if begin is None:
        note_assumption(analyzer, start >= 0, upper_edge=False)
    ext = const_int(extent)
    if ext is None:
        return False  # symbolic extent: guard every access
    if begin is not None:
        return begin + size <= ext
    if analyzer.can_prove(start + size <= ext):
        return True
    if ext % size:
        return False
    residue = analyzer.modular_set(start)  # start is a multiple of the tile size
    aligned = residue.coeff % size == 0 and residue.base % size == 0
    if aligned:
        note_assumption(analyzer, start + size <= ext, upper_edge=True)
    return aligned


def tile_in_bounds(op: Operand, analyzer: Any) -> bool:
    """True when every element of the tile lies inside the buffer, for every launched block."""
    return dim_in_bounds(op.row0, op.rows, op.row_extent, analyzer) and dim_in_bounds(op.col0, op.cols, op.col_extent, analyzer)


def _elem_cond(op: Operand, r: Any, c: Any, analyzer: Any) -> Any | None:
    return op.in_bounds(r, c, analyzer)


def load_group(
    op: Operand,
    transposed: bool,
    row: Any,
    col: Any,
    width: int,
    dst: Any,
    dst_offset: Any,
    in_bounds: bool,
    analyzer: Any,
) -> Any:
    """dst[dst_offset : +width] = logical elements (row, col .. col+width-1) of the operand.

    A transposed operand stores logical (row, col) at storage (col, row), so its groups are strided.
    """

    def logical_rc(r: Any, c: Any) -> tuple:
        return (c, r) if transposed else (r, c)

    contiguous = width > 1 and not transposed and not op.remapped
    vector = contiguous and op.vector_aligned(row, col, width, analyzer)
    if in_bounds and contiguous and not vector and _split_in_halves(op, row, col, width, analyzer):
        half = width // 2  # the widest access whose alignment holds: two of half the width
        return seq(load_group(op, False, row, col + h, half, dst, dst_offset + h, in_bounds, analyzer) for h in (0, half))
    if vector and in_bounds:
        value = cast(op.load(row, col, lanes=width), _vec(str(dst.dtype), width))
        return tir.BufferStore(dst, value, [tir.Ramp(dst_offset, 1, width)])
    if in_bounds and contiguous and intrinsics.packable(str(op.dtype), width):
        loaded = intrinsics.build_packed_load(op.address(row, col, "r"), _vec(str(op.dtype), width))
        return tir.BufferStore(dst, cast(loaded, _vec(str(dst.dtype), width)), [tir.Ramp(dst_offset, 1, width)])

    def elements() -> Any:
        stmts = []
        for t in range(width):
            r, c = logical_rc(row, col + t)
            cond = None if in_bounds else _elem_cond(op, r, c, analyzer)
            value = guarded(cond, cast(op.load(r, c), str(dst.dtype)), str(dst.dtype))
            stmts.append(tir.BufferStore(dst, value, [dst_offset + t]))
        return seq(stmts)

    if in_bounds or not contiguous:
        return elements()
    edge = _edge_run(op, row, col, width, analyzer)
    if edge == HALVES:
        half = width // 2
        return seq(load_group(op, False, row, col + h, half, dst, dst_offset + h, False, analyzer) for h in (0, half))
    if edge is None:
        return elements()
    cond, aligned = edge
    loaded = intrinsics.build_packed_load(op.address(row, col, "r"), _vec(str(op.dtype), width), aligned=aligned)
    run = tir.BufferStore(dst, cast(loaded, _vec(str(dst.dtype), width)), [tir.Ramp(dst_offset, 1, width)])
    return run if cond is None else tir.IfThenElse(cond, run, elements())


def store_group(
    op: Operand,
    row: Any,
    col: Any,
    width: int,
    src: Any,
    src_offset: Any,
    in_bounds: bool,
    analyzer: Any,
) -> Any:
    """Storage elements (row, col .. col+width-1) of the operand = src[src_offset : +width] (cast)."""
    out_dtype = op.dtype
    contiguous = width > 1 and not op.remapped
    vector = contiguous and op.vector_aligned(row, col, width, analyzer)
    if in_bounds and contiguous and not vector and _split_in_halves(op, row, col, width, analyzer):
        half = width // 2
        return seq(store_group(op, row, col + h, half, src, src_offset + h, in_bounds, analyzer) for h in (0, half))
    if vector and in_bounds:
        value = tir.BufferLoad(src, [tir.Ramp(src_offset, 1, width)])
        return op.store(cast(value, _vec(out_dtype, width)), row, col, lanes=width)
    if in_bounds and contiguous and intrinsics.packable(str(out_dtype), width):
        value = cast(tir.BufferLoad(src, [tir.Ramp(src_offset, 1, width)]), _vec(str(out_dtype), width))
        return intrinsics.build_packed_store(op.address(row, col, "w"), value)

    def elements() -> Any:
        stmts = []
        for t in range(width):
            store = op.store(cast(tir.BufferLoad(src, [src_offset + t]), out_dtype), row, col + t)
            cond = None if in_bounds else _elem_cond(op, row, col + t, analyzer)
            stmts.append(store if cond is None else tir.IfThenElse(cond, store, None))
        return seq(stmts)

    if in_bounds or not contiguous:
        return elements()
    edge = _edge_run(op, row, col, width, analyzer)
    if edge == HALVES:
        half = width // 2
        return seq(store_group(op, row, col + h, half, src, src_offset + h, False, analyzer) for h in (0, half))
    if edge is None:
        return elements()
    cond, aligned = edge
    value = cast(tir.BufferLoad(src, [tir.Ramp(src_offset, 1, width)]), _vec(str(out_dtype), width))
    run = intrinsics.build_packed_store(op.address(row, col, "w"), value, aligned=aligned)
    return run if cond is None else tir.IfThenElse(cond, run, elements())


HALVES = "halves"


def _edge_run(op: Operand, row: Any, col: Any, width: int, analyzer: Any) -> Any:
    """How a contiguous group of an edge tile is accessed: (condition, aligned) for one vector access
    under the condition that its last element is inside (the guards bound upper edges only, so the
    last element decides; None: always inside), with the element accesses as the other branch;
    HALVES for two groups of half the width; None for element accesses alone."""
    if width < 2:
        return None
    aligned = op.vector_aligned(row, col, width, analyzer)
    if width > 4 or not (aligned or intrinsics.packable(str(op.dtype), width)):
        return HALVES if width % 2 == 0 else None
    return _elem_cond(op, row, col + width - 1, analyzer), aligned


def _split_in_halves(op: Operand, row: Any, col: Any, width: int, analyzer: Any) -> bool:
    """An unaligned group of `width` lanes is two groups of half the width when the halves are
    vector-aligned, or when it is wider than a packed vector (4 lanes)."""
    return width % 2 == 0 and (width > 4 or op.vector_aligned(row, col, width // 2, analyzer))


def _vec(dtype: str, lanes: int) -> str:
    return f"{dtype}x{lanes}"
