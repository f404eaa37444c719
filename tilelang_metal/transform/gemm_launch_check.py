"""Refuse `T.gemm` in kernels launched with 2-D or 3-D threads, at lower time.

Simdgroups are consecutive runs of 32 linear thread indices, and GemmMetal partitions the tile by
simdgroup using the x thread index. With threads=(32, 4) tilelang hands the GEMM only the x range,
so every y row would redo the same one-simdgroup GEMM; the clear fix is a 1-D launch.
"""

from __future__ import annotations

from typing import Any

from ..errors import GemmLoweringError
from .function_pass import per_function_pass
from .ir_query import find_nodes
from .kernel_launches import kernels
from ..host import vocab

GEMM_OP = vocab.GEMM_TILE_OP


def check_function(func: Any) -> None:
    for kernel, launch in kernels(func.body):  # each kernel of the module has its own launch
        if launch.is_one_dimensional:
            continue
        if not any(getattr(call.op, "name", "") == GEMM_OP for call in find_nodes(kernel, [vocab.TIRX_CALL])):
            continue
        total = launch.threads
        raise GemmLoweringError(
            f"T.gemm on Metal needs a 1-D thread launch, got {launch.shape_text()}; simdgroups are runs of 32 linear "
            f"threads. Launch with threads={total or 'N'} and index threads through T.get_thread_binding()."
        )


def _checked(func: Any) -> Any:
    check_function(func)
    return func


CheckGemmLaunch = per_function_pass("tilelang_metal.CheckGemmLaunch", _checked)
