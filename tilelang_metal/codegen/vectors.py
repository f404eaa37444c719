"""Metal vectors stop at 4 lanes: split wider TIR vector expressions into 4-lane parts."""

from __future__ import annotations

from typing import Any

from ..host import tir
from ..errors import CodegenError
from .msl_types import split_dtype
from .operators import BINARY_OPS
from ..host import vocab


def _with_lanes(dtype: str, lanes: int) -> str:
    base, _ = split_dtype(dtype)
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
    if type(e) in BINARY_OPS or isinstance(e, (tir.Min, tir.Max)):
        return type(e)(slice_lanes(e.a, start, n), slice_lanes(e.b, start, n))
    if isinstance(e, tir.Select):
        return tir.Select(slice_lanes(e.condition, start, n), slice_lanes(e.true_value, start, n), slice_lanes(e.false_value, start, n))
    if isinstance(e, tir.Call) and str(e.op.name) == vocab.TIRX_IF_THEN_ELSE:
        args = [slice_lanes(a, start, n) if split_dtype(str(a.dtype))[1] > 1 else a for a in e.args]
        return tir.if_then_else(*args)
    if split_dtype(str(e.dtype))[1] == 1:
        return e
    raise CodegenError(f"cannot split the {e.dtype} expression {type(e).__name__} into Metal vectors")
