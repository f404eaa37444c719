"""TIR operators and their MSL spellings (tables only; math functions: math_functions.py)."""

from __future__ import annotations

from ..host import tir
from ..host import vocab

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
    vocab.TIRX_SHIFT_RIGHT: ">>",
    vocab.TIRX_SHIFT_LEFT: "<<",
    vocab.TIRX_BITWISE_AND: "&",
    vocab.TIRX_BITWISE_OR: "|",
    vocab.TIRX_BITWISE_XOR: "^",
}
