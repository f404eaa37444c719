"""Compute in float32 the math functions whose Metal lowering is a polynomial, for 16-bit floats.

TVM's LowerIntrin (which tilelang runs after the Metal pipeline) writes `erf` as a rational
polynomial in the argument's own type. In half precision its small coefficients underflow and its
terms cancel: the result is off by 2% of erf's range. This pass, at the end of `lower_metal`, turns
`erf(x)` on float16 / bfloat16 into `half(erf(float(x)))`, so the polynomial runs in float32.
Functions that lower to Metal builtins keep their 16-bit form (Metal computes those natively).
"""

from __future__ import annotations

from typing import Any

from .._host import tir, tvm
from .function_pass import per_function_pass

POLYNOMIAL_LOWERED = frozenset({"tirx.erf"})
_SHORT_FLOATS = ("float16", "bfloat16")


def _with_bits(dtype: str, base: str) -> str:
    lanes = tvm.DataType(dtype).lanes
    return base if lanes == 1 else f"{base}x{lanes}"


def _promote(call: Any) -> Any:
    if not isinstance(call.op, tvm.ir.Op) or str(call.op.name) not in POLYNOMIAL_LOWERED:
        return None
    dtype = str(call.dtype)
    if tvm.DataType(dtype).bits != 16 or not any(dtype.startswith(t) for t in _SHORT_FLOATS):
        return None
    wide = _with_bits(dtype, "float32")
    return tir.Cast(dtype, tir.Call(wide, call.op, [tir.Cast(wide, a) for a in call.args]))


def promote_half_math(func: Any) -> Any:
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, _promote, ["tirx.Call"])
    return func.with_body(body)


PromoteHalfMath = per_function_pass("tilelang_metal.PromoteHalfMath", promote_half_math)
