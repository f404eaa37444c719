"""`LowerFloorDivisions`: every integer floor division / modulo still in a kernel, written with the
operators MSL has (truncating `/` and `%`, shifts, masks, `select`).

TVM's LowerIntrin lowers them, but tilelang runs Simplify after it (before the codegen hook), and
Simplify writes new ones: normalizing `16*s + (lane % 8) / 2 < 16*t + 2` it divides both sides by 2
and leaves `lane % 8 // 4` (floor division, issue 32; a causal mask over a 64x64 accumulator). So the
codegen hook runs this first, and the printer never sees an integer FloorDiv / FloorMod.

- divisor 2^k: `x >> k` and `x & (2^k - 1)` (floor semantics for any sign: arithmetic shift);
- dividend provably >= 0 and divisor provably > 0: truncating `/` and `%` (equal there);
- otherwise the truncating result corrected where the signs differ (`select`).
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm, vocab
from .function_pass import per_function_pass
from .power_of_two_division import bounded_analyzer


def _is_integer(dtype: Any) -> bool:
    return str(dtype).startswith(("int", "uint"))


def _lowered(node: Any, analyzer: Any) -> Any:
    a, b = node.a, node.b
    is_div = isinstance(node, tir.FloorDiv)
    dtype = str(a.dtype)
    zero = tvm.tirx.const(0, dtype)
    divisor = int(b.value) if isinstance(b, tir.IntImm) else None
    if divisor == 1:
        return a if is_div else zero
    if divisor is not None and divisor > 0 and divisor & (divisor - 1) == 0:
        shift = divisor.bit_length() - 1
        return tvm.tirx.shift_right(a, tvm.tirx.const(shift, dtype)) if is_div else tvm.tirx.bitwise_and(a, tvm.tirx.const(divisor - 1, dtype))
    if dtype.startswith("uint") or (analyzer.can_prove(a >= zero) and analyzer.can_prove(b > zero)):
        return tir.Div(a, b) if is_div else tir.Mod(a, b)
    quotient, remainder = tir.Div(a, b), tir.Mod(a, b)
    # truncation rounds toward zero: one step off where the remainder is non-zero and its sign
    # differs from the divisor's
    off = tir.And(tir.NE(remainder, zero), tir.NE(tir.LT(remainder, zero), tir.LT(b, zero)))
    if is_div:
        return tir.Select(off, quotient - tvm.tirx.const(1, dtype), quotient)
    return tir.Select(off, remainder + b, remainder)


def lower_function(func: Any) -> Any:
    analyzer = None

    def visit(node: Any) -> Any:
        nonlocal analyzer
        if not _is_integer(node.dtype):
            return None  # float floor division: the printer writes floor(a / b)
        if analyzer is None:
            analyzer = bounded_analyzer(func)
        return _lowered(node, analyzer)

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, visit, [vocab.TIRX_FLOORDIV, vocab.TIRX_FLOORMOD])
    return func if body.same_as(func.body) else func.with_body(body)


LowerFloorDivisions = per_function_pass("tilelang_metal.LowerFloorDivisions", lower_function, kernels_only=True)
