"""Integer/float TIR expressions of the host side (shapes, launch extents, kernel arguments) turned
into plain Python closures once, so that each call evaluates them without TVM.

Variables are looked up in a per-call list of values by slot; `compile_expr` takes the slot of each
variable from the caller, so one environment serves every expression of a kernel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from ..host import tir

Env = Sequence[Any]
Evaluator = Callable[[Env], Any]


class UnboundVariable(LookupError):
    """A variable with no slot: the expression depends on something the caller cannot supply."""

    def __init__(self, var: Any) -> None:
        super().__init__(str(var.name))
        self.var = var


def _trunc_div(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return a / b
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


def _trunc_mod(a: Any, b: Any) -> Any:
    if isinstance(a, float) or isinstance(b, float):
        return math.fmod(a, b)
    return a - b * _trunc_div(a, b)


def _cast(dtype: str) -> Callable[[Any], Any]:
    if dtype.startswith(("float", "bfloat")):
        return float
    if dtype == "bool":
        return bool
    if dtype.startswith(("int", "uint")):
        bits = int("".join(ch for ch in dtype if ch.isdigit()) or 32)
        signed = dtype.startswith("int")

        def to_int(v: Any) -> int:
            v = int(v) & ((1 << bits) - 1)  # wrap like the device integer type
            return v - (1 << bits) if signed and v >= 1 << (bits - 1) else v

        return to_int
    raise ValueError(f"cannot evaluate a cast to {dtype} on the host")


_BINARY: dict[type, Callable[[Any, Any], Any]] = {
    tir.Add: lambda a, b: a + b,
    tir.Sub: lambda a, b: a - b,
    tir.Mul: lambda a, b: a * b,
    tir.Div: _trunc_div,
    tir.Mod: _trunc_mod,
    tir.FloorDiv: lambda a, b: a // b,
    tir.FloorMod: lambda a, b: a % b,
    tir.Min: min,
    tir.Max: max,
    tir.EQ: lambda a, b: a == b,
    tir.NE: lambda a, b: a != b,
    tir.LT: lambda a, b: a < b,
    tir.LE: lambda a, b: a <= b,
    tir.GT: lambda a, b: a > b,
    tir.GE: lambda a, b: a >= b,
    tir.And: lambda a, b: bool(a) and bool(b),
    tir.Or: lambda a, b: bool(a) or bool(b),
}


def compile_expr(expr: Any, slot_of: Callable[[Any], int | None]) -> Evaluator:
    """A closure computing `expr` from an environment; `slot_of(var)` gives each variable's index
    in it (None: raise UnboundVariable). Integer division and modulo follow TIR (truncating `Div`,
    flooring `FloorDiv`); casts to integer types wrap to the type's width."""
    if isinstance(expr, bool):
        return lambda env: expr
    if isinstance(expr, (int, float)):
        value = expr
        return lambda env: value
    if isinstance(expr, (tir.IntImm, tir.FloatImm)):
        value = expr.value
        if str(expr.dtype) == "bool":
            value = bool(value)
        return lambda env: value
    if isinstance(expr, tir.Var):
        slot = slot_of(expr)
        if slot is None:
            raise UnboundVariable(expr)
        return lambda env: env[slot]
    op = _BINARY.get(type(expr))
    if op is not None:
        a, b = compile_expr(expr.a, slot_of), compile_expr(expr.b, slot_of)
        return lambda env: op(a(env), b(env))
    if isinstance(expr, tir.Not):
        a = compile_expr(expr.a, slot_of)
        return lambda env: not a(env)
    if isinstance(expr, tir.Select):
        c = compile_expr(expr.condition, slot_of)
        t, f = compile_expr(expr.true_value, slot_of), compile_expr(expr.false_value, slot_of)
        return lambda env: t(env) if c(env) else f(env)
    if isinstance(expr, tir.Cast):
        a, cast = compile_expr(expr.value, slot_of), _cast(str(expr.dtype))
        return lambda env: cast(a(env))
    if isinstance(expr, tir.Call) and str(expr.op.name).endswith("if_then_else"):
        c, t, f = (compile_expr(arg, slot_of) for arg in expr.args)
        return lambda env: t(env) if c(env) else f(env)
    raise ValueError(f"cannot evaluate {type(expr).__name__} `{expr}` on the host")


def free_vars(expr: Any) -> list[Any]:
    """The variables `expr` reads, first occurrence first (no duplicates by identity)."""
    found: list[Any] = []

    def visit(node: Any) -> None:
        if isinstance(node, tir.Var) and not any(node.same_as(v) for v in found):
            found.append(node)

    if isinstance(expr, tir.PrimExpr):
        tir.stmt_functor.post_order_visit(expr, visit)
    return found
