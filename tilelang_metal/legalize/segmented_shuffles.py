"""CUDA-width warp shuffles as Metal's whole-simdgroup shuffles plus the segment arithmetic, in TIR.

A Metal simdgroup is 32 lanes wide, like a CUDA warp. A shuffle with `width < 32` works in segments
of `width` lanes (CUDA semantics): a lane whose source falls past the end of its segment keeps its
own value (xor, down), a lane whose source falls before its segment start keeps its own value (up),
and an indexed shuffle reads lane `srcLane % width` of its own segment. Every shuffle is executed
by all lanes and only its result is masked (`intrinsics.build_select`, MSL's `select`, which
evaluates both operands): a Metal simd collective must be reached by the whole simdgroup. Widths are
powers of two <= 32; a constant width outside that is refused with the op and the width.

The calls rewritten: TileLang's `tl.shfl_*_sync` (and the `tvm_warp_shuffle*` that
transform/keep_shuffle_widths.py turned into them before LowerIntrin), TVM's `tvm_warp_shuffle*` should any
remain, and TVM's `metal.simd_shuffle*` (whole simdgroup). The lane id is the function's
`LANE_ID_ATTR` variable (added when the kernel has none), which the printer binds to Metal's
`thread_index_in_simdgroup`.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..errors import CodegenError
from ..host import tir, tvm
from ..host import vocab
from ..core.ir_attrs import LANE_ID_ATTR
from ..target.isa import SIMD_WIDTH
from ..transform.function_pass import per_function_pass

# op -> (kind, value operand, lane / delta / mask operand, width operand or None for a whole simdgroup)
WARP_SHUFFLES = {
    vocab.TL_SHFL_XOR_SYNC: ("xor", 1, 2, 3),
    vocab.TL_SHFL_DOWN_SYNC: ("down", 1, 2, 3),
    vocab.TL_SHFL_UP_SYNC: ("up", 1, 2, 3),
    vocab.TL_SHFL_SYNC: ("index", 1, 2, 3),
    vocab.TIRX_TVM_WARP_SHUFFLE: ("index", 1, 2, 3),
    vocab.TIRX_TVM_WARP_SHUFFLE_DOWN: ("down", 1, 2, 3),
    vocab.TIRX_TVM_WARP_SHUFFLE_UP: ("up", 1, 2, 3),
    vocab.TIRX_METAL_SIMD_SHUFFLE: ("index", 0, 1, None),
    vocab.TIRX_METAL_SIMD_SHUFFLE_DOWN: ("down", 0, 1, None),
    vocab.TIRX_METAL_SIMD_SHUFFLE_UP: ("up", 0, 1, None),
}


def check_width(width: int) -> None:
    if width <= 0 or width > SIMD_WIDTH or width & (width - 1):
        raise ValueError(f"shuffle width {width} is not a power of two in [1, 32] (a Metal simdgroup has 32 lanes)")


def _int32(e: Any) -> Any:
    return e if str(e.dtype) == "int32" else tir.Cast("int32", e)


def segment_shuffle(kind: str, value: Any, operand: Any, width: Any, lane: Any) -> Any:
    """The CUDA shuffle of `kind` over segments of `width` lanes (an int, or an int32 expression)."""
    whole = isinstance(width, int) and width == SIMD_WIDTH
    if kind == "index":
        if whole:
            return intrinsics.build_simd_shuffle("index", value, tir.bitwise_and(operand, SIMD_WIDTH - 1))
        low = width - 1  # the lane within a segment
        source = tir.bitwise_and(lane, tir.bitwise_not(_as_expr(low))) + tir.bitwise_and(operand, low)
        return intrinsics.build_simd_shuffle("index", value, source)
    shuffled = intrinsics.build_simd_shuffle(kind, value, operand)
    if whole:
        return shuffled  # past the edge Metal leaves a lane its own value, as CUDA does
    low = width - 1
    if kind == "xor":
        keep = tir.bitwise_xor(lane, operand) < tir.bitwise_or(lane, low) + 1  # the source is in this segment
    elif kind == "down":
        keep = tir.bitwise_and(lane, low) + operand < width
    else:
        keep = tir.bitwise_and(lane, low) >= operand
    return intrinsics.build_select(keep, shuffled, value)


def _as_expr(x: Any) -> Any:
    return tir.const(x, "int32") if isinstance(x, int) else x


class _Shuffles:
    def __init__(self, func: Any):
        attrs = func.attrs or {}
        self.lane = attrs[LANE_ID_ATTR] if LANE_ID_ATTR in attrs else None
        self.new_lane = False

    def lane_id(self) -> Any:
        if self.lane is None:
            self.lane, self.new_lane = tir.Var("lane_id", "int32"), True
        return self.lane

    def rewrite(self, call: Any) -> Any:
        if not isinstance(call.op, tvm.ir.Op):
            return None
        op = str(call.op.name)
        spec = WARP_SHUFFLES.get(op)
        if spec is None:
            return None
        kind, value_at, operand_at, width_at = spec
        value, operand = call.args[value_at], _int32(call.args[operand_at])
        if str(value.dtype).endswith("64"):
            raise CodegenError(f"{op} on {value.dtype}: Metal simd shuffles take 8- to 32-bit values; shuffle the halves as 32-bit values")
        width: Any = SIMD_WIDTH
        if width_at is not None:
            w = call.args[width_at]
            if isinstance(w, tir.IntImm):
                try:
                    check_width(int(w.value))
                except ValueError as err:
                    raise CodegenError(f"{op}: {err}") from None
                width = int(w.value)
            else:
                width = _int32(w)
        whole = isinstance(width, int) and width == SIMD_WIDTH
        return segment_shuffle(kind, value, operand, width, None if whole else self.lane_id())


def lower_shuffle_widths(func: Any) -> Any:
    shuffles = _Shuffles(func)
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, shuffles.rewrite, [vocab.TIRX_CALL])
    func = func.with_body(body)
    return func.with_attr(LANE_ID_ATTR, shuffles.lane) if shuffles.new_lane else func


LowerShuffleWidths = per_function_pass("tilelang_metal.LowerShuffleWidths", lower_shuffle_widths)
