"""The top of a device kernel: its launch attributes and the position-only statements after them.

A lowered kernel body starts with buffer declarations and a chain of `AttrStmt`s (thread extents
and other launch annotations). Plugin passes put statements that depend only on the threadgroup /
thread position right inside that chain (the "prelude": block-swizzle remapping, hoisted address
offsets), so every variable they define is in scope for the whole body and computed once per
thread. The prelude's variables are listed in the function attribute `PRELUDE_VARS_ATTR`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import tir
from ..core.ir_attrs import PRELUDE_VARS_ATTR, prelude_vars
from ..host import vocab



def _uses_any(expr: Any, variables: list[Any]) -> bool:
    found = False

    def visit(node: Any) -> None:
        nonlocal found
        if isinstance(node, tir.Var) and any(node.same_as(v) for v in variables):
            found = True

    tir.stmt_functor.post_order_visit(expr, visit)
    return found


def _is_declaration(stmt: Any, chain: list[Any]) -> bool:
    """Buffer declarations / allocations, and bindings that do not depend on the launch position
    seen so far (shared-memory pointers carved out of one allocation): they stay where they are
    and the launch chain continues after them."""
    if isinstance(stmt, (tir.DeclBuffer, tir.AllocBuffer)):
        return True
    return isinstance(stmt, tir.Bind) and not _uses_any(stmt.value, launch_vars(chain))


def rewrite_inside_launch(body: Any, rewrite: Callable[[list[Any], Any], Any]) -> Any:
    """Rebuild `body` with `rewrite(launch_attrs, inner)` applied to the statement inside the launch
    chain (buffer declarations before and between the attributes are kept where they are)."""
    chain: list[Any] = []

    def descend(node: Any) -> Any:
        if isinstance(node, tir.AttrStmt):
            chain.append(node)
            return tir.AttrStmt(node.node, node.attr_key, node.value, descend(node.body))
        if isinstance(node, tir.SeqStmt) and len(node.seq) > 1 and all(_is_declaration(s, chain) for s in node.seq[:-1]):
            return tir.SeqStmt([*node.seq[:-1], descend(node.seq[-1])])
        return rewrite(chain, node)

    return descend(body)


def launch_vars(chain: list[Any]) -> list[Any]:
    """Variables of the thread-extent attributes in the chain (blockIdx.*, threadIdx.*)."""
    return [attr.node.var for attr in chain if str(attr.attr_key) == "thread_extent"]


def statements(stmt: Any) -> list[Any]:
    return list(stmt.seq) if isinstance(stmt, tir.SeqStmt) else [stmt]


def _is_early_return(stmt: Any) -> bool:
    if isinstance(stmt, tir.IfThenElse) and stmt.else_case is None and isinstance(stmt.then_case, tir.Evaluate):
        value = stmt.then_case.value
        return isinstance(value, tir.Call) and str(value.op.name) == vocab.TIRX_RET
    return False


def prepend(inner: Any, known: list[Any], prelude: list[Any]) -> Any:
    """`prelude` after the prelude statements already at the top of `inner` (Binds of `known`
    variables, early returns), before the rest."""
    stmts = statements(inner)
    cut = 0
    while cut < len(stmts) and ((isinstance(stmts[cut], tir.Bind) and any(stmts[cut].var.same_as(v) for v in known)) or _is_early_return(stmts[cut])):
        cut += 1
    merged = stmts[:cut] + list(prelude) + stmts[cut:]
    return merged[0] if len(merged) == 1 else tir.SeqStmt(merged)


def with_prelude_vars(func: Any, new_vars: list[Any]) -> Any:
    return func.with_attr(PRELUDE_VARS_ATTR, prelude_vars(func) + list(new_vars))
