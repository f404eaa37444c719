"""GEMM bodies are guarded by construction: their tile-start assumptions are proven or enforced in
context, and tilelang's LegalizeSafeMemoryAccess skips them.

The GEMM lowering (`gemm/tile_access.py`) decides each device access itself: a tile it proves inside
its buffer is accessed unguarded, every other element access carries its own upper-edge condition.
Its analyzer knows the thread index only, so two facts about a tile start `s` (a tile of `size` in an
extent `n`) are assumed and noted on the analyzer instead of proven:

- `s >= 0`, when `s` is symbolic (element guards check upper edges only);
- `s + size <= n`, when `s` is a multiple of `size` and `n` a multiple of it: the tile is taken as
  wholly inside, which holds for a grid (or loop) that covers the matrix exactly but not for one
  launched larger. A threadgroup past the matrix then read and wrote outside A, B and C, and
  tilelang's pass did not guard those vector accesses either.

`mark_guarded` wraps the body in an AttrStmt holding both lists. `legalize_unguarded`, run in place
of tilelang's pass, walks each function with the ranges of its loops and launch and the branch
conditions on the path, and for each mark:

- every assumption proven: the body as it is;
- only `s + size <= n` unproven, with no thread index in it: the body under `if (all of them)`,
  which is exact (the tile is wholly in or wholly out) and uniform across the threadgroup;
- otherwise: the body is left to tilelang's pass, as before.

Bodies of the first two kinds are hidden from tilelang's pass: on them it changes nothing, yet it
was the most expensive pass of a ragged GEMM's lowering (about 45% of it), re-proving each guarded
element access under the symbolic analyzer.
"""

from __future__ import annotations

from typing import Any

from ..errors import MetalLoweringError
from ..host import tir, tvm, vocab

# the marks GemmMetal writes (gemm/guard_marks.py); this pass reads and removes them
from ..gemm.guard_marks import GUARDED_BY_CONSTRUCTION


def _is_mark(node: Any) -> bool:
    return isinstance(node, tir.AttrStmt) and node.attr_key == GUARDED_BY_CONSTRUCTION


def _vars_of(expr: Any) -> list[Any]:
    found: list[Any] = []
    tvm.tirx.stmt_functor.post_order_visit(tir.Evaluate(expr), lambda n: found.append(n) if isinstance(n, tir.Var) else None)
    return found


class _MarkVerdicts:
    """Walks a function keeping the ranges of loop and launch variables, the let-bound values and the
    branch conditions on the path, and decides each mark: `guards[mark]` is the list of upper-edge
    conditions to enforce (empty: all proven), or the mark is absent (left to tilelang's pass).
    Statement kinds the walk does not know are not entered, so their marks are left to the pass."""

    def __init__(self) -> None:
        self.guards: list[tuple[Any, list[Any]]] = []
        self._ranges: list[tuple[Any, Any]] = []  # (var, Range) or (var, bound value)
        self._constraints: list[Any] = []
        self._thread_vars: list[Any] = []

    def _decide(self, mark: Any) -> None:
        names = [v for v, _ in self._ranges]
        if len({v.name for v in names}) != len(names):
            return  # a shadowed variable name: leave the body to the pass
        analyzer = tvm.arith.Analyzer()
        for var, bound in self._ranges:
            analyzer.bind(var, bound)
        scopes = [analyzer.constraint_scope(c) for c in self._constraints]
        for scope in scopes:
            scope.__enter__()
        try:
            lower, upper = mark.node
            if not all(analyzer.can_prove(c) for c in lower):
                return
            unproven = [c for c in upper if not analyzer.can_prove(c)]
        finally:
            for scope in reversed(scopes):
                scope.__exit__(None, None, None)
        threads = {id(v) for v in self._thread_vars}
        if any(id(v) in threads for c in unproven for v in _vars_of(c)):
            return  # a thread-dependent guard would split the threadgroup around the GEMM's barriers
        self.guards.append((mark, unproven))

    def _scoped(self, ranges: list[tuple[Any, Any]], constraints: list[Any], body: Any) -> None:
        self._ranges.extend(ranges)
        self._constraints.extend(constraints)
        try:
            self.visit(body)
        finally:
            del self._ranges[len(self._ranges) - len(ranges) :]
            del self._constraints[len(self._constraints) - len(constraints) :]

    def visit(self, node: Any) -> None:
        if isinstance(node, tir.SeqStmt):
            bound = 0
            for child in node.seq:
                if isinstance(child, tir.Bind):  # binds its variable for the statements after it
                    self._ranges.append((child.var, child.value))
                    bound += 1
                else:
                    self.visit(child)
            if bound:
                del self._ranges[len(self._ranges) - bound :]
        elif _is_mark(node):
            self._decide(node)
        elif isinstance(node, tir.For):
            self._scoped([(node.loop_var, tvm.ir.Range.from_min_extent(node.min, node.extent))], [], node.body)
        elif isinstance(node, tir.AttrStmt):
            if node.attr_key == vocab.THREAD_EXTENT_ATTR:
                var = node.node.var
                if str(node.node.thread_tag).startswith("threadIdx"):
                    self._thread_vars.append(var)
                self._scoped([(var, tvm.ir.Range.from_min_extent(tir.const(0, var.dtype), node.value))], [], node.body)
            else:
                self.visit(node.body)
        elif isinstance(node, tir.IfThenElse):
            self._scoped([], [node.condition], node.then_case)
            if node.else_case is not None:
                self._scoped([], [tir.Not(node.condition)], node.else_case)
        elif isinstance(node, tir.SBlockRealize):
            self.visit(node.block)
        elif isinstance(node, tir.SBlock):
            self.visit(node.body)


def _hide(func: Any, skip_guarded: bool = True) -> tuple[Any, list[Any]]:
    """`func` with each mark it can decide replaced by a numbered placeholder (its body, under the
    upper-edge guards it needs, set aside) and the other marks dropped (their bodies stay for the pass)."""
    walk = _MarkVerdicts()
    if skip_guarded:
        walk.visit(func.body)
    hidden: list[Any] = []

    def placeholder(node: Any) -> Any:
        if not _is_mark(node):
            return None
        verdict = next((guards for mark, guards in walk.guards if node.same_as(mark)), None)
        if verdict is None:
            return node.body
        body = node.body
        if verdict:
            condition = verdict[0]
            for c in verdict[1:]:
                condition = tir.And(condition, c)
            body = tir.IfThenElse(condition, body, None)
        hidden.append(body)
        return tir.AttrStmt(tir.const(0, "int32"), GUARDED_BY_CONSTRUCTION, tir.const(len(hidden) - 1, "int32"), tir.Evaluate(0))

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, placeholder, [vocab.TIRX_ATTRSTMT])
    return func.with_body(body), hidden


def _restore(func: Any, hidden: list[Any]) -> Any:
    seen: set[int] = set()

    def restore(node: Any) -> Any:
        if not _is_mark(node):
            return None
        slot = int(node.value.value)
        if slot in seen or slot >= len(hidden):
            raise MetalLoweringError(f"internal: a guarded GEMM body was duplicated by LegalizeSafeMemoryAccess (slot {slot})")
        seen.add(slot)
        return hidden[slot]

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, restore, [vocab.TIRX_ATTRSTMT])
    if len(seen) != len(hidden):
        raise MetalLoweringError("internal: a guarded GEMM body was dropped by LegalizeSafeMemoryAccess")
    return func.with_body(body)


def legalize_unguarded(mod: Any, safe_memory_pass: Any, *, skip_guarded: bool = True) -> Any:
    """`safe_memory_pass(mod)` on everything but the proven marked bodies; the marks are gone
    afterwards. `skip_guarded=False` runs the pass on everything (the reference the tests compare with)."""
    stashed: dict[str, list[Any]] = {}

    def hide(module: Any, _ctx: Any) -> Any:
        for gvar, func in list(module.functions.items()):
            if isinstance(func, tir.PrimFunc):
                hidden_func, hidden = _hide(func, skip_guarded)
                if hidden:
                    stashed[gvar.name_hint] = hidden
                if not hidden_func.same_as(func):
                    module[gvar] = hidden_func
        return module

    def restore(module: Any, _ctx: Any) -> Any:
        for gvar, func in list(module.functions.items()):
            if gvar.name_hint in stashed:
                module[gvar] = _restore(func, stashed.pop(gvar.name_hint))
        if stashed:
            raise MetalLoweringError(f"internal: LegalizeSafeMemoryAccess dropped functions {sorted(stashed)} holding guarded GEMM bodies")
        return module

    mod = tvm.transform.module_pass(hide, opt_level=0, name="tilelang_metal.HideGuardedBodies")(mod)
    mod = safe_memory_pass(mod)
    return tvm.transform.module_pass(restore, opt_level=0, name="tilelang_metal.RestoreGuardedBodies")(mod)
