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
    return _renamed(stmt, mapping)


def _renamed(stmt: Any, mapping: dict[Any, Any]) -> Any:
    """`stmt` with the variables of `mapping` replaced where used and where defined (loop
    variables, `Bind`s, `Let`s): `substitute` alone leaves the definitions on the old variables."""
    stmt = tvm.tirx.stmt_functor.substitute(stmt, mapping)

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


def paired_free_vars(copy: Any, original: Any) -> dict[Any, Any]:
    """{variable of `copy` -> the same variable of `original`} for two structurally equal
    modules (one loaded from JSON): every PrimFunc's parameters and the data, shape, stride and
    offset variables of its parameter buffers, the variables a lowered module shares with its input."""
    mapping: dict[Any, Any] = {}

    def pair(a: Any, b: Any) -> None:
        if isinstance(a, tir.Var) and isinstance(b, tir.Var):
            mapping[a] = b

    originals = {gv.name_hint: f for gv, f in original.functions.items()}
    for gv, func in copy.functions.items():
        other = originals.get(gv.name_hint)
        if not isinstance(func, tir.PrimFunc) or not isinstance(other, tir.PrimFunc):
            continue
        for p, q in zip(func.params, other.params):
            pair(p, q)
            a, b = func.buffer_map.get(p), other.buffer_map.get(q)
            if a is None or b is None:
                continue
            pair(a.data, b.data)
            pair(a.elem_offset, b.elem_offset)
            for x, y in zip([*a.shape, *a.strides], [*b.shape, *b.strides]):
                pair(x, y)
    return mapping


def rebind_vars(func: Any, mapping: dict[Any, Any]) -> Any:
    """`func` with the variables of `mapping` replaced, parameters, uses and definitions (`Bind`,
    `Let`, loop variables) alike."""
    if not mapping:
        return func
    body = _renamed(func.body, mapping)
    params = [mapping.get(p, p) for p in func.params]
    buffer_map = {mapping.get(p, p): b for p, b in func.buffer_map.items()}
    return tir.PrimFunc(params, body, func.ret_type, buffer_map, func.attrs)
