"""Keep math functions accurate through TVM's LowerIntrin, which tilelang runs after `lower_metal`.

For Metal, LowerIntrin rewrites two functions as formulas in the argument's own type:
- `tanh(x)` as `(1 - exp(-2x)) / (1 + exp(-2x))`: near zero the subtraction cancels (10% relative
  error at x = 1e-7 in float32), while Metal has a `tanh` builtin. This pass makes `tanh` an extern
  call to that builtin, which LowerIntrin leaves alone;
- `erf(x)` as a rational polynomial: in half precision its small coefficients underflow and its
  terms cancel (2% of erf's range). On float16 / bfloat16 this pass computes it in float32:
  `half(erf(float(x)))`; Metal has no `erf` builtin.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from .function_pass import per_function_pass
from ..host import vocab

_SHORT_FLOATS = ("float16", "bfloat16")


def _float32_like(dtype: str) -> str:
    lanes = tvm.DataType(dtype).lanes
    return "float32" if lanes == 1 else f"float32x{lanes}"


def _rewrite(call: Any) -> Any:
    if not isinstance(call.op, tvm.ir.Op):
        return None
    op, dtype = str(call.op.name), str(call.dtype)
    if op == vocab.TIRX_TANH:
        return tir.call_pure_extern(dtype, "tanh", *call.args)
    if op == vocab.TIRX_ERF and dtype.split("x")[0] in _SHORT_FLOATS:
        wide = _float32_like(dtype)
        return tir.Cast(dtype, tir.Call(wide, call.op, [tir.Cast(wide, a) for a in call.args]))
    return None


def preserve_math_precision(func: Any) -> Any:
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, _rewrite, [vocab.TIRX_CALL])
    return func.with_body(body)


PreserveMathPrecision = per_function_pass("tilelang_metal.PreserveMathPrecision", preserve_math_precision)
