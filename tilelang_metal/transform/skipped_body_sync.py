"""`SyncSkippedBodies`: a barrier on the path that skips a loop or branch holding one.

tilelang's ThreadSync (and the plugin's own barrier passes) treat a statement that contains a barrier
as a barrier between what comes before it and what comes after it. That holds only when the barrier
runs: a `for` whose extent is not a constant can run zero times, a `while` can exit before its first
iteration, an `if` can take the branch without one. A `T.Pipelined` loop with a dynamic trip count is
the case that returns NaN: its prologue writes stage 0 of a threadgroup buffer, the steady-state loop
(`trip count - 1` iterations) holds the only barrier, and the epilogue reads stage 0. With a trip count
of 1 the steady-state loop runs zero times and the epilogue reads threadgroup memory that other
threads have not written yet.

The pass runs after every pass that places barriers and restores the assumption on every path:

- `for` with an extent that cannot be proven >= 1: `if (extent <= 0) barrier;` before the loop;
- `while`: `if (!condition) barrier;` before the loop (the condition is evaluated once more; only
  conditions without side effects are handled, others are refused);
- `if` with a barrier in one branch only: a barrier in the other branch.

The added barrier runs only on the path that skipped the original one, so a loop that runs costs
nothing. Its scope is the widest of the barriers it stands in for. Inner statements are handled first,
so a statement that holds a barrier runs one on every path once its children are done. Control flow
whose condition depends on the thread index is left as it is: a barrier there is already divergent,
which the emulator reports and `SyncDeviceMemory` / `SyncWhileLoops` avoid placing.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..errors import MetalLoweringError
from .barriers import storage_sync, sync_scope
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .uniformity import ThreadDependence
from ..host import vocab

_GLOBAL = "global"


def _widest(scopes: set[str]) -> str | None:
    """The barrier scope that orders everything the given barriers order (simdgroup barriers do not
    stand in for a threadgroup barrier, so they are not counted)."""
    scopes = {s for s in scopes if s != "warp"}
    if not scopes:
        return None
    return _GLOBAL if _GLOBAL in scopes else "shared"


def _barrier_scope(stmt: Any) -> str | None:
    scopes = {sync_scope(node) for node in find_nodes(stmt, [vocab.TIRX_EVALUATE])}
    scopes.discard(None)
    return _widest(scopes)


def _guarded_barrier(condition: Any, scope: str) -> Any:
    return tir.IfThenElse(condition, storage_sync(scope), None)


def _pure(expr: Any) -> bool:
    """No call with a side effect (loads and arithmetic only): safe to evaluate one more time."""
    calls = find_nodes(tir.Evaluate(expr), [vocab.TIRX_CALL])
    return all(str(getattr(call.op, "name", "")) in _PURE_CALLS for call in calls)


_PURE_CALLS = {vocab.TIRX_LIKELY, vocab.TIRX_IF_THEN_ELSE, vocab.TIRX_BITWISE_AND, vocab.TIRX_BITWISE_OR, vocab.TIRX_SHIFT_LEFT, vocab.TIRX_SHIFT_RIGHT}


class _Rewriter:
    def __init__(self, func: Any):
        self.thread = ThreadDependence(func)
        self.analyzer = tvm.arith.Analyzer()

    def rewrite(self, body: Any) -> Any:
        """Post order (TVM rebuilds each node from its rewritten children): inner statements first."""
        visitors = {tir.For: self.visit_for, tir.While: self.visit_while, tir.IfThenElse: self.visit_if}

        def post(node: Any) -> Any:
            return visitors[type(node)](node)

        return tvm.tirx.stmt_functor.ir_transform(body, None, post, [vocab.TIRX_FOR, vocab.TIRX_WHILE, vocab.TIRX_IFTHENELSE])

    def visit_for(self, loop: Any) -> Any:
        scope = _barrier_scope(loop.body)
        if scope is None or self.analyzer.can_prove(loop.extent >= 1) or self.thread.depends(loop.extent):
            return loop
        return tir.SeqStmt([_guarded_barrier(loop.extent <= 0, scope), loop])

    def visit_while(self, loop: Any) -> Any:
        scope = _barrier_scope(loop.body)
        if scope is None or self.thread.depends(loop.condition):
            return loop
        if not _pure(loop.condition):
            raise MetalLoweringError(
                f"a while loop whose condition has side effects ({loop.condition}) holds a barrier: the barrier "
                f"needed when the loop runs zero times cannot be placed. Compute the condition into a T.alloc_var "
                f"before the loop and at the end of its body, and loop on that variable."
            )
        return tir.SeqStmt([_guarded_barrier(tir.Not(loop.condition), scope), loop])

    def visit_if(self, branch: Any) -> Any:
        then_case, else_case = branch.then_case, branch.else_case
        then_scope = _barrier_scope(then_case)
        else_scope = _barrier_scope(else_case) if else_case is not None else None
        if (then_scope is None) != (else_scope is None) and not self.thread.depends(branch.condition):
            if else_scope is None:
                else_case = storage_sync(then_scope) if else_case is None else tir.SeqStmt([else_case, storage_sync(then_scope)])
            else:
                then_case = tir.SeqStmt([then_case, storage_sync(else_scope)])
        return tir.IfThenElse(branch.condition, then_case, else_case)


def sync_function(func: Any) -> Any:
    if not find_nodes(func.body, [vocab.TIRX_EVALUATE]) or _barrier_scope(func.body) is None:
        return func
    return func.with_body(_Rewriter(func).rewrite(func.body))


SyncSkippedBodies = per_function_pass("tilelang_metal.SyncSkippedBodies", sync_function)
