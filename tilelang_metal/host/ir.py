"""Generic TIR rewrites on the host's IR (no tilelang specifics)."""

from __future__ import annotations

from typing import Any

from .base import tir, tvm

def fresh_definitions(stmt: Any) -> Any:
    """`stmt` with every scalar variable it defines (loop variables, `Bind`s, `Let`s) replaced by a
    fresh one, uses included. Two copies of one body (an if/else with the same body on both sides)
    must not define a variable twice: TVM's analyzers bind a variable's range once per function."""
    mapping: dict[Any, Any] = {}

    def collect(node: Any) -> None:
        var = node.loop_var if isinstance(node, tir.For) else node.var if isinstance(node, (tir.Bind, tir.Let)) else None
        if var is not None and var not in mapping:
            mapping[var] = tir.Var(var.name, var.dtype)

    tvm.tirx.stmt_functor.post_order_visit(stmt, collect)
    if not mapping:
        return stmt
    stmt = tvm.tirx.stmt_functor.substitute(stmt, mapping)  # uses; the definitions keep the old vars

    def redefine(node: Any) -> Any:
        if isinstance(node, tir.For) and node.loop_var in mapping:
            return tir.For(mapping[node.loop_var], node.min, node.extent, node.kind, node.body,
                           node.thread_binding, node.annotations, node.step)
        if isinstance(node, tir.Bind) and node.var in mapping:
            return tir.Bind(mapping[node.var], node.value)
        if isinstance(node, tir.Let) and node.var in mapping:
            return tir.Let(mapping[node.var], node.value, node.body)
        return None

    return tvm.tirx.stmt_functor.ir_transform(stmt, None, redefine, ["tirx.For", "tirx.Bind", "tirx.Let"])
