"""Refuse `T.gemm` in kernels launched with 2-D or 3-D threads, at lower time.

Simdgroups are consecutive runs of 32 linear thread indices, and GemmMetal partitions the tile by
simdgroup using the x thread index. With threads=(32, 4) tilelang hands the GEMM only the x range,
so every y row would redo the same one-simdgroup GEMM; the clear fix is a 1-D launch.
"""

from __future__ import annotations

from typing import Any

from .._host import tir
from ..errors import GemmLoweringError
from .function_pass import per_function_pass
from .ir_query import find_nodes

GEMM_OP = "tl.tileop.gemm"


def check_function(func: Any) -> None:
    extents = {}
    for node in find_nodes(func.body, ["tirx.AttrStmt"]):
        if node.attr_key == "thread_extent" and isinstance(node.value, tir.IntImm):
            extents[str(node.node.thread_tag)] = int(node.value.value)
    extra = {tag: n for tag, n in extents.items() if tag in ("threadIdx.y", "threadIdx.z") and n > 1}
    if not extra:
        return
    if not any(getattr(call.op, "name", "") == GEMM_OP for call in find_nodes(func.body, ["tirx.Call"])):
        return
    total = extents.get("threadIdx.x", 1)
    for n in extra.values():
        total *= n
    shape = ", ".join(f"{tag}={n}" for tag, n in sorted(extents.items()) if tag.startswith("threadIdx"))
    raise GemmLoweringError(
        f"T.gemm on Metal needs a 1-D thread launch, got {shape}; simdgroups are runs of 32 linear "
        f"threads. Launch with threads={total} and index threads through T.get_thread_binding()."
    )


def _checked(func: Any) -> Any:
    check_function(func)
    return func


CheckGemmLaunch = per_function_pass("tilelang_metal.CheckGemmLaunch", _checked)
