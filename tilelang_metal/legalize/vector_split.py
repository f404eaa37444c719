"""Metal vectors stop at 4 lanes: a store of a wider vector becomes 4-lane stores of its parts.

What reaches here wider than 4 lanes is a vectorized 128-bit access in 8 or 16 lanes (halves,
bytes) that `UseWideCopies` did not turn into one `uint4` move. Each 4-lane part is the same
expression with lanes [start, start + 4) of every vector operand (ramps, broadcasts, loads, casts,
arithmetic, selects); anything else is refused with the lane count and the expression.
"""

from __future__ import annotations

from typing import Any

from ..errors import CodegenError
from ..host import tir, tvm
from ..host import vocab
from ..transform.function_pass import per_function_pass

METAL_MAX_LANES = 4
_BINARY = (tir.Add, tir.Sub, tir.Mul, tir.Div, tir.Mod, tir.EQ, tir.NE, tir.LT, tir.LE, tir.GT, tir.GE, tir.And, tir.Or, tir.Min, tir.Max)


def _split_dtype(dtype: Any) -> tuple[str, int]:
    """("float16", 8) for "float16x8"; (dtype, 1) for a scalar."""
    base, _, lanes = str(dtype).rpartition("x")
    return (base, int(lanes)) if base and lanes.isdigit() else (str(dtype), 1)


def _lanes(dtype: Any) -> int:
    return _split_dtype(dtype)[1]


def _with_lanes(dtype: str, lanes: int) -> str:
    base = _split_dtype(dtype)[0]
    return base if lanes == 1 else f"{base}x{lanes}"


def slice_lanes(e: Any, start: int, n: int) -> Any:
    """Lanes [start, start+n) of a vector expression, rebuilt from its parts."""
    if isinstance(e, tir.Ramp):
        return tir.Ramp(e.base + e.stride * start, e.stride, n)
    if isinstance(e, tir.Broadcast):
        return tir.Broadcast(e.value, n)
    if isinstance(e, tir.BufferLoad):
        return tir.BufferLoad(e.buffer, [*e.indices[:-1], slice_lanes(e.indices[-1], start, n)])
    if isinstance(e, tir.Cast):
        return tir.Cast(_with_lanes(str(e.dtype), n), slice_lanes(e.value, start, n))
    if isinstance(e, _BINARY):
        return type(e)(slice_lanes(e.a, start, n), slice_lanes(e.b, start, n))
    if isinstance(e, tir.Select):
        return tir.Select(slice_lanes(e.condition, start, n), slice_lanes(e.true_value, start, n), slice_lanes(e.false_value, start, n))
    if isinstance(e, tir.Call) and str(e.op.name) == vocab.TIRX_IF_THEN_ELSE:
        args = [slice_lanes(a, start, n) if _lanes(a.dtype) > 1 else a for a in e.args]
        return tir.if_then_else(*args)
    if _lanes(e.dtype) == 1:
        return e
    raise CodegenError(f"cannot split the {e.dtype} expression {type(e).__name__} into Metal vectors")


def split_store(store: Any) -> Any:
    """A store of more than 4 lanes as 4-lane stores in lane order (None when it is narrow enough)."""
    lanes = _lanes(store.value.dtype)
    if lanes <= METAL_MAX_LANES:
        return None
    if lanes % METAL_MAX_LANES:
        raise CodegenError(f"cannot split a {lanes}-lane store to {store.buffer.name} into Metal vectors")
    parts = [
        tir.BufferStore(store.buffer, slice_lanes(store.value, start, METAL_MAX_LANES), [slice_lanes(store.indices[-1], start, METAL_MAX_LANES)])
        for start in range(0, lanes, METAL_MAX_LANES)
    ]
    return tir.SeqStmt(parts)


def split_wide_vectors(func: Any) -> Any:
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, split_store, [vocab.TIRX_BUFFERSTORE])
    return func.with_body(body)


SplitWideVectors = per_function_pass("tilelang_metal.SplitWideVectors", split_wide_vectors)
