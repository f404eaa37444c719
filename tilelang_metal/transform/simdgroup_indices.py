"""Express the 1-D thread index through the Metal execution attributes (simdgroup id, lane id).

GemmMetal and layout inference write lane and simdgroup as `tx % 32` and `tx // 32`, which lets
the stock passes bound them. This last plugin pass substitutes `tx = simdgroup * 32 + lane` and
simplifies with the attributes' ranges, so the MSL reads `__simd_group_id & 1`, `__lane >> 4`
instead of re-deriving both from `threadIdx.x` in every address. Only 1-D threadgroups qualify:
there the linear thread index equals `threadIdx.x` and simdgroups are consecutive runs of 32.

The two new variables are recorded on the function (`SIMDGROUP_ID_ATTR`, `LANE_ID_ATTR`), so the
printer binds them to the hardware attributes by identity: a user variable that happens to have the
same name stays an ordinary variable.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..core.ir_attrs import LANE_ID_ATTR, SIMDGROUP_ID_ATTR
from ..target.isa import SIMD_WIDTH
from .function_pass import per_function_pass
from .kernel_launches import launch_of
from ..host import vocab



def canonicalize_function(func: Any) -> Any:
    launch = launch_of(func.body)  # a device kernel: one launch
    threads = launch.threads
    if launch.tx is None or not launch.is_one_dimensional or threads is None:
        return func
    tx = launch.tx
    sg = tir.Var("simdgroup_id", "int32")
    lane = tir.Var("lane_id", "int32")
    analyzer = tvm.arith.Analyzer()
    analyzer.bind(sg, tvm.ir.Range(0, max(1, -(-threads // SIMD_WIDTH))))
    analyzer.bind(lane, tvm.ir.Range(0, SIMD_WIDTH))
    body = tvm.tirx.stmt_functor.substitute(func.body, {tx: sg * SIMD_WIDTH + lane})

    def simplify(node: Any) -> Any:
        return analyzer.simplify(node)

    body = tvm.tirx.stmt_functor.ir_transform(body, None, simplify, [vocab.TIRX_FLOORDIV, vocab.TIRX_FLOORMOD])
    return func.with_body(body).with_attr(SIMDGROUP_ID_ATTR, sg).with_attr(LANE_ID_ATTR, lane)


UseSimdgroupIndices = per_function_pass("tilelang_metal.UseSimdgroupIndices", canonicalize_function, kernels_only=True)
