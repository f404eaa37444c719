"""Interior/edge split of a GEMM whose tile can cross a buffer's edge (M or N not a multiple of the tile).

Most threadgroups of a ragged launch (4000^3 with 64x128 tiles: all but one row and one column of
them) hold tiles that lie wholly inside A, B and C. Those *interior* threadgroups run the body an
aligned kernel runs: no per-element guard, vector loads and stores where alignment is proven. Only
the *edge* threadgroups run the guarded body. The choice is one branch on the tile origins, which
depend on the threadgroup position only, so every thread of a threadgroup takes the same side
(`UNIFORM_BRANCH` marks it for the printer and the emulator's counters: it masks no access).

A K that is not a multiple of the instruction's K step is split the same way inside each body: the
whole steps run without K guards, only the last step guards its K range.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..core.scopes import GLOBAL_SCOPES, SHARED_SCOPES
from ..core.ir_attrs import UNIFORM_BRANCH  # AttrStmt key: a branch every thread of a threadgroup takes alike
from .problem import GemmProblem, Operand, const_int



def _uses_var(expr: Any, var: Any) -> bool:
    found = []
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda node: found.append(True) if node.same_as(var) else None)
    return bool(found)


def _dims(op: Operand) -> tuple:
    return ((op.row0, op.rows, op.row_extent), (op.col0, op.cols, op.col_extent))


def interior_condition(problem: GemmProblem, analyzer: Any, thread_index: Any, fits: Any) -> Any | None:
    """The threadgroup-uniform condition under which every operand tile lies inside its buffer, or
    None when there is nothing to split: every tile provably fits already, or the condition could
    not help (symbolic extents, an origin that depends on the thread, a tile that never fits).

    `fits(start, size, extent)` says whether a dimension provably fits without assumptions."""
    conds = []
    for op in (problem.A, problem.B, problem.C):
        if op.scope not in GLOBAL_SCOPES + SHARED_SCOPES:
            continue  # register accumulators are always whole
        for start, size, extent in _dims(op):
            if fits(start, size, extent):
                continue
            if const_int(extent) is None or _uses_var(start, thread_index):
                return None
            cond = analyzer.simplify(start + size <= extent)
            if not any(tvm.ir.structural_equal(cond, c) for c in conds):  # A and C share the rows of a tile
                conds.append(cond)
    if not conds:
        return None
    cond = conds[0]
    for c in conds[1:]:
        cond = tir.And(cond, c)
    cond = analyzer.simplify(cond)
    if analyzer.can_prove(tir.Not(cond)) or analyzer.can_prove(cond):
        return None
    return cond


def uniform_branch(cond: Any, interior: Any, edge: Any) -> Any:
    return tir.AttrStmt(tir.StringImm("interior_edge"), UNIFORM_BRANCH, tir.const(1, "int32"), tir.IfThenElse(cond, interior, edge))
