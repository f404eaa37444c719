"""Keep the segment width of TVM's warp shuffles through LowerIntrin.

`tvm_warp_shuffle(mask, value, lane, width, warp_size)` (and `_up` / `_down`) is what TileLang's
Hadamard example calls directly and what TVM's LowerThreadAllreduce emits. For Metal, LowerIntrin
(which tilelang runs after `lower_metal`) rewrites it to `metal.simd_shuffle(value, lane)`, dropping
`width`: a 16-lane shuffle then reads across the whole simdgroup (lanes 16-31 get lanes 0-15's
values) and a sub-width shuffle down / up crosses segment edges. CUDA's semantics are per segment
of `width` lanes. This pass turns the calls into TileLang's `tl.shfl_sync` / `tl.shfl_up_sync` /
`tl.shfl_down_sync`, same operands minus `warp_size`, which LowerIntrin leaves alone and the
late legalization builds with the width honoured (legalize/segmented_shuffles.py)."""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from .function_pass import per_function_pass
from ..host import vocab

_SEGMENT_SHUFFLES = {
    vocab.TIRX_TVM_WARP_SHUFFLE: vocab.TL_SHFL_SYNC,
    vocab.TIRX_TVM_WARP_SHUFFLE_UP: vocab.TL_SHFL_UP_SYNC,
    vocab.TIRX_TVM_WARP_SHUFFLE_DOWN: vocab.TL_SHFL_DOWN_SYNC,
}


def _rewrite(call: Any) -> Any:
    if not isinstance(call.op, tvm.ir.Op):
        return None
    target = _SEGMENT_SHUFFLES.get(str(call.op.name))
    if target is None:
        return None
    mask, value, lane, width = call.args[:4]
    return tir.Call(call.dtype, vocab.get_op(target), [mask, value, lane, width])


def keep_shuffle_widths(func: Any) -> Any:
    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, _rewrite, [vocab.TIRX_CALL])
    return func.with_body(body)


KeepShuffleWidths = per_function_pass("tilelang_metal.KeepShuffleWidths", keep_shuffle_widths)
