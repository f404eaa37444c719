"""The mark a lowered GEMM body carries: the tile-start assumptions its unguarded accesses rely on.

GemmMetal's tile accesses (`tile_access.py`) note each assumption on the lowering's analyzer, and
the lowering wraps the body in one mark holding them; `transform/guarded_bodies.py` proves or
enforces them in context. The mark lives with its writer, below the transforms that read it.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm

GUARDED_BY_CONSTRUCTION = "tilelang_metal.guarded_by_construction"
_ASSUMPTIONS = "_tilelang_metal_tile_assumptions"


def note_assumption(analyzer: Any, condition: Any, *, upper_edge: bool) -> None:
    """Record on the lowering's analyzer a condition an unguarded access relies on: a tile start
    inside its extent (`upper_edge`) or not negative."""
    if not hasattr(analyzer, _ASSUMPTIONS):
        setattr(analyzer, _ASSUMPTIONS, ([], []))
    getattr(analyzer, _ASSUMPTIONS)[1 if upper_edge else 0].append(condition)


def assumptions(analyzer: Any) -> tuple[list[Any], list[Any]]:
    """(lower-edge conditions, upper-edge conditions) noted on `analyzer`."""
    lower, upper = getattr(analyzer, _ASSUMPTIONS, ([], []))
    return list(lower), list(upper)


def mark_guarded(lowered: Any, conditions: tuple[list[Any], list[Any]]) -> Any:
    """`lowered` (a Stmt, or a PrimFunc whose body LowerTileOp inlines) with its body marked; the
    mark holds the (lower-edge, upper-edge) conditions its unguarded accesses rely on."""
    if isinstance(lowered, tir.PrimFunc):
        return lowered.with_body(mark_guarded(lowered.body, conditions))
    lower, upper = conditions
    node = tvm.runtime.convert([list(lower), list(upper)])
    return tir.AttrStmt(node, GUARDED_BY_CONSTRUCTION, tir.const(-1, "int32"), lowered)
