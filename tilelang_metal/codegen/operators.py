"""TIR operators and math intrinsics and their MSL spellings (tables only)."""

from __future__ import annotations

from .._host import tir

BINARY_OPS = {
    tir.Add: "+",
    tir.Sub: "-",
    tir.Mul: "*",
    tir.Div: "/",
    tir.Mod: "%",
    tir.EQ: "==",
    tir.NE: "!=",
    tir.LT: "<",
    tir.LE: "<=",
    tir.GT: ">",
    tir.GE: ">=",
    tir.And: "&&",
    tir.Or: "||",
}
BIT_OPS = {
    "tirx.shift_right": ">>",
    "tirx.shift_left": "<<",
    "tirx.bitwise_and": "&",
    "tirx.bitwise_or": "|",
    "tirx.bitwise_xor": "^",
}
MATH_FUNCS = {
    "exp": "exp",
    "exp2": "exp2",
    "exp10": "exp10",
    "log": "log",
    "log2": "log2",
    "log10": "log10",
    "sqrt": "sqrt",
    "rsqrt": "rsqrt",
    "tanh": "tanh",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "sinh": "sinh",
    "cosh": "cosh",
    "fabs": "fabs",
    "floor": "floor",
    "ceil": "ceil",
    "round": "round",
    "nearbyint": "rint",
    "trunc": "trunc",
    "pow": "pow",
    "fmod": "fmod",
    "atan2": "atan2",
    "isnan": "isnan",
    "isinf": "isinf",
    "isfinite": "isfinite",
    "fma": "fma",
    "copysign": "copysign",
}
