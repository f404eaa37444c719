"""`GuardPossiblyEmptyLoops`: a loop that may run zero times runs under `if (extent > 0)`.

What was observed: tilelang's Simplify (`tl.Simplify`, tilelang 0.1.15) rewrites the extent of a
grid-stride loop whose trip count is 0 for some threads and 1 for others, `for k in T.serial(start +
sg, end, 4)` over a short range (extent `(min(1, 3 - bx) + 3 - tx // 32) // 4`, in [0, 1]), to the
constant 1: the loop disappears and its body runs once on every thread, a silent wrong number (the
body reads past the range, and tilelang's safe-memory guards turn those reads into zeros). TVM's own
Simplify keeps the extent. The likely cause, from tilelang's source (`src/transform/simplify.cc`):
its For visitor enters the loop's constraints (`min <= i < min + extent`, true only when the loop
runs) before the extent itself is simplified, and its floor-division folder turns a division whose
bounds meet into a constant.

Under `if (extent > 0)` the assumption is true wherever the loop is reached, so whatever Simplify
derives from it is correct. The guard is placed before the first Simplify, on serial and unrolled
loops whose extent is not constant, can be 0 or less, and is bounded by the launch (thread and block
indices, constants, enclosing loops: a loop over a runtime size has an unbounded extent, which
Simplify cannot fold to a constant). Loops that `T.Pipelined` annotates are guarded after
InjectSoftwarePipeline (`GuardPossiblyEmptyPipelineLoops`): its body loop runs the trip count minus
the prologue's iterations, 0 or 1 times where a block-dependent trip count is 1 or 2 (causal
attention's key blocks), and was folded to 1 the same way. A guard costs one branch before the loop.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm, vocab
from .function_pass import per_function_pass

_GUARDED_KINDS = (tir.ForKind.SERIAL, tir.ForKind.UNROLLED)


def _launch_analyzer(body: Any) -> tuple[Any, set]:
    """An analyzer that knows each thread and block index and each loop variable by its range
    (variables are unique, so a range holds wherever its variable is visible; outer first), and the
    set of those variables."""
    analyzer = tvm.arith.Analyzer()
    known: set = set()

    def bind(node: Any) -> None:
        if isinstance(node, tir.AttrStmt) and node.attr_key == "thread_extent":
            var, extent = node.node.var, node.value
            analyzer.bind(var, tvm.ir.Range.from_min_extent(0, extent))
        elif isinstance(node, tir.For):
            var, extent = node.loop_var, node.extent
            analyzer.bind(var, tvm.ir.Range.from_min_extent(node.min, extent))
        else:
            return None
        if not _free_vars(extent) - known:
            known.add(var)  # bounded by the launch: its range mentions only known variables
        return None

    tvm.tirx.stmt_functor.ir_transform(body, bind, None, [vocab.TIRX_ATTRSTMT, vocab.TIRX_FOR])
    return analyzer, known


def _free_vars(expr: Any) -> set:
    found: set = set()
    tvm.tirx.stmt_functor.post_order_visit(expr, lambda node: found.add(node) if isinstance(node, tir.Var) else None)
    return found


def _pipelined(loop: Any) -> bool:
    return any("pipeline" in str(key) or str(key) == "num_stages" for key in (loop.annotations or {}))


def guard_function(func: Any, *, pipelined: bool = False) -> Any:
    """`pipelined`: guard the loops T.Pipelined annotates too (after InjectSoftwarePipeline, whose
    body loop runs the trip count minus the prologue: 0 or 1 times where the trip count is 1 or 2)."""
    analyzer, known = _launch_analyzer(func.body)

    def guard(loop: Any) -> Any:
        extent = loop.extent
        if loop.kind not in _GUARDED_KINDS or isinstance(extent, tir.IntImm) or (_pipelined(loop) and not pipelined):
            return None
        if _free_vars(extent) - known or analyzer.const_int_bound(extent).min_value > 0:
            return None  # a runtime size (unbounded), or at least one trip
        return tir.IfThenElse(extent > 0, loop, None)

    return func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, guard, [vocab.TIRX_FOR]))


GuardPossiblyEmptyLoops = per_function_pass("tilelang_metal.GuardPossiblyEmptyLoops", guard_function)
GuardPossiblyEmptyPipelineLoops = per_function_pass("tilelang_metal.GuardPossiblyEmptyPipelineLoops",
                                                    lambda func: guard_function(func, pipelined=True))
