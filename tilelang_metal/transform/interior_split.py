"""`SplitInteriorThreadgroups`: GEMM kernels whose edge guards depend on the threadgroup position get
one threadgroup-uniform branch; interior threadgroups run the body with those guards removed.

The GEMM lowering splits its own body (gemm/edge_split.py). Everything around it that tilelang
lowers (the `T.copy` staging of the shared path, the `T.copy` of a fragment accumulator to C) guards
each access with a condition such as `by * 64 + i < 200`. This pass collects the guards of the kernel
(`if_then_else` operands and `if` conditions), and for each block index `b` finds the largest `B` such
that every edge guard that depends on `b` alone (and on threads and loop counters, whose ranges are
known) holds for all `b < B`; an edge guard fails on the last threadgroup along its axis only
(a guard such as `by == 0` is not an edge guard and is left alone). With `interior = b_x < B_x && b_y < B_y ...`, the body becomes

    if (interior) { body } else { body }   // threadgroup-uniform

and the guards the bounds prove are dropped from the first copy. Guards that do not depend on the position (a ragged K in a staging copy) stay in both.
Only kernels with a matrix operation are split (the point is the GEMM's tile loop; an elementwise
kernel's tail guard costs little and doubling its code buys nothing).
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..core import intrinsics
from ..host import fresh_definitions, tir, tvm
from ..gemm.edge_split import UNIFORM_BRANCH, uniform_branch
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .kernel_prelude import launch_vars, rewrite_inside_launch
from ..host import vocab

_MATRIX_OPS = (intrinsics.SG_MMA,)


def _has_matrix_op(body: Any) -> bool:
    for call in find_nodes(body, [vocab.TIRX_CALL]):
        if intrinsics.op_name(call) in _MATRIX_OPS or intrinsics.match_ct_mma(call) is not None:
            return True
    return False


def _without_edge_bodies(body: Any) -> Any:
    """`body` with each existing threadgroup-uniform branch replaced by its interior side: the guards
    of an edge body already have their split."""

    def keep_interior(node: Any) -> Any:
        if str(node.attr_key) != UNIFORM_BRANCH:
            return None
        parts = list(node.body.seq) if isinstance(node.body, tir.SeqStmt) else [node.body]
        parts = [p.then_case if isinstance(p, tir.IfThenElse) else p for p in parts]
        return parts[0] if len(parts) == 1 else tir.SeqStmt(parts)

    return tvm.tirx.stmt_functor.ir_transform(body, None, keep_interior, [vocab.TIRX_ATTRSTMT])


def _conjuncts(cond: Any, out: list[Any]) -> None:
    if isinstance(cond, tir.And):
        _conjuncts(cond.a, out)
        _conjuncts(cond.b, out)
    else:
        out.append(cond)


def _guards(body: Any) -> list[Any]:
    conds: list[Any] = []
    for node in find_nodes(body, [vocab.TIRX_IFTHENELSE]):
        _conjuncts(node.condition, conds)
    for call in find_nodes(body, [vocab.TIRX_CALL]):
        if intrinsics.op_name(call) == vocab.TIRX_IF_THEN_ELSE:
            _conjuncts(call.args[0], conds)
    unique: dict[str, Any] = {}
    for c in conds:
        unique.setdefault(str(c), c)
    return list(unique.values())


def _vars_of(expr: Any) -> list[Any]:
    found: list[Any] = []
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda n: found.append(n) if isinstance(n, tir.Var) else None)
    return found


def _const(x: Any) -> int | None:
    return int(x.value) if isinstance(x, tir.IntImm) else None


def _bind_ranges(analyzer: Any, chain: list[Any], body: Any, blocks: list[Any]) -> None:
    """Thread indices and loop counters with their ranges (each defined once in the kernel)."""
    for attr in chain:
        if str(attr.attr_key) == "thread_extent":
            var = attr.node.var
            if not any(var.same_as(b) for b in blocks) and _const(attr.value) is not None:
                analyzer.bind(var, tvm.ir.Range(0, attr.value))
    loops = find_nodes(body, [vocab.TIRX_FOR])
    for loop in loops:
        var = loop.loop_var
        if sum(1 for other in loops if other.loop_var.same_as(var)) > 1:
            continue  # the same counter in two loops: its range is not one interval, leave it unknown
        if _const(loop.min) is not None and _const(loop.extent) is not None:
            analyzer.bind(var, tvm.ir.Range.from_min_extent(loop.min, loop.extent))


def _interior_bound(analyzer: Any, guard: Any, block: Any, extent: int) -> int | None:
    """The largest B such that `guard` holds for every block < B; None if not even for block 0."""

    def holds_below(bound: int) -> bool:
        with analyzer.constraint_scope(tir.And(block >= 0, block < bound)):
            return analyzer.can_prove(guard)

    if not holds_below(1):
        return None
    lo, hi = 1, extent  # holds below lo; find the largest
    if holds_below(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if holds_below(mid):
            lo = mid
        else:
            hi = mid
    return lo


def interior_condition(chain: list[Any], body: Any) -> tuple[list[Any], Any] | None:
    """The interior's bounds (`b < B` per block index) and an analyzer that knows the thread and loop
    ranges; None when no guard depends on the position alone."""
    blocks = [
        (attr.node.var, _const(attr.value))
        for attr in chain
        if str(attr.attr_key) == "thread_extent" and str(attr.node.thread_tag).startswith("blockIdx")
    ]
    blocks = [(v, e) for v, e in blocks if e is not None and e > 1]
    if not blocks:
        return None
    analyzer = tvm.arith.Analyzer()
    _bind_ranges(analyzer, chain, body, [v for v, _ in blocks])
    bounds = {id(v): e for v, e in blocks}
    for guard in _guards(_without_edge_bodies(body)):
        used = [v for v, _ in blocks if any(x.same_as(v) for x in _vars_of(guard))]
        if len(used) != 1:
            continue
        var = used[0]
        extent = dict((id(v), e) for v, e in blocks)[id(var)]
        bound = _interior_bound(analyzer, guard, var, extent)
        # an edge guard fails on the last threadgroup along its axis only; a guard that fails earlier
        # (`by == 0`) is not about the edge and stays in both copies
        if bound is not None and bound >= extent - 1:
            bounds[id(var)] = min(bounds[id(var)], bound)
    conds = [v < bounds[id(v)] for v, e in blocks if bounds[id(v)] < e]
    return (conds, analyzer) if conds else None


def _prune_guards(body: Any, analyzer: Any) -> Any:
    """`body` with every guard conjunct the analyzer proves (under the interior's bounds) dropped.
    Done here rather than left to a simplifier: TVM's bound analysis takes only the first conjunct
    of an `a && b` branch condition as a constraint."""

    def remaining(cond: Any) -> Any | None:
        if cond.dtype.lanes != 1:
            return cond
        parts: list[Any] = []
        _conjuncts(cond, parts)
        kept = [c for c in parts if not analyzer.can_prove(c)]
        if not kept:
            return None
        out = kept[0]
        for c in kept[1:]:
            out = tir.And(out, c)
        return out

    def prune(node: Any) -> Any:
        if isinstance(node, tir.IfThenElse):
            cond = remaining(node.condition)
            if cond is None:
                return node.then_case
            return None if cond.same_as(node.condition) else tir.IfThenElse(cond, node.then_case, node.else_case)
        if intrinsics.op_name(node) == vocab.TIRX_IF_THEN_ELSE:
            cond = remaining(node.args[0])
            if cond is None:
                return node.args[1]
            return None if cond.same_as(node.args[0]) else tir.if_then_else(cond, node.args[1], node.args[2])
        return None

    return tvm.tirx.stmt_functor.ir_transform(body, None, prune, [vocab.TIRX_IFTHENELSE, vocab.TIRX_CALL])


def _hoist_allocations(body: Any) -> tuple[list[Any], Any]:
    """The body's thread-array allocations, moved in front of it: both sides of the branch then use
    the same arrays (a declaration inside one side would not be in scope in the other)."""
    allocs: list[Any] = []

    def take(node: Any) -> Any:
        allocs.append(node)
        return tir.Evaluate(0)

    stripped = tvm.tirx.stmt_functor.ir_transform(body, None, take, [vocab.TIRX_ALLOCBUFFER])
    return allocs, stripped


def split_function(func: Any) -> Any:
    if not _has_matrix_op(func.body):
        return func

    def rewrite(chain: list[Any], inner: Any) -> Any:
        if any(str(attr.attr_key) == UNIFORM_BRANCH for attr in chain):
            return inner  # the whole body is one GEMM that split itself
        found = interior_condition(chain, inner)
        if found is None:
            return inner
        conds, analyzer = found
        allocs, edge = _hoist_allocations(inner)
        with contextlib.ExitStack() as scopes:
            for c in conds:  # one scope per bound: each one reaches the bound analysis
                scopes.enter_context(analyzer.constraint_scope(c))
            interior = fresh_definitions(_prune_guards(edge, analyzer))  # one definition per variable
        cond = conds[0]
        for c in conds[1:]:
            cond = tir.And(cond, c)
        branch = uniform_branch(cond, interior, edge)
        return tir.SeqStmt([*allocs, branch]) if allocs else branch

    return func.with_body(rewrite_inside_launch(func.body, rewrite))


SplitInteriorThreadgroups = per_function_pass("tilelang_metal.SplitInteriorThreadgroups", split_function, kernels_only=True)
