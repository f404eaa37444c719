"""TIR operators and their MSL spellings (tables only; math functions: math_functions.py)."""

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
