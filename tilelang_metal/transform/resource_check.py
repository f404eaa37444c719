"""Refuse kernels that exceed Metal's per-threadgroup resources, at lower time, in one place."""

from __future__ import annotations

from typing import Any

from .._host import tvm
from ..errors import MetalLoweringError
from .function_pass import per_function_pass
from .ir_query import find_nodes

THREADGROUP_MEMORY_BYTES = 32 * 1024  # Apple GPUs: 32 KiB of threadgroup memory per threadgroup
MAX_THREADS_PER_THREADGROUP = 1024


def _bytes(buf: Any) -> int:
    count = 1
    for dim in buf.shape:
        count *= int(dim)
    return count * (int(tvm.DataType(str(buf.dtype)).bits) // 8)


def check_function(func: Any) -> Any:
    name = str(func.attrs.get("global_symbol", "kernel")) if func.attrs is not None else "kernel"
    shared = [node.buffer for node in find_nodes(func.body, ["tirx.AllocBuffer"]) if str(node.buffer.scope()).startswith("shared")]
    used = sum(_bytes(buf) for buf in shared)
    if used > THREADGROUP_MEMORY_BYTES:
        sizes = ", ".join(f"{buf.name} {_bytes(buf)} B" for buf in shared)
        raise MetalLoweringError(
            f"kernel {name} needs {used} bytes of threadgroup memory ({sizes}); Metal allows {THREADGROUP_MEMORY_BYTES} "
            "(32 KiB). Use smaller shared tiles, fewer pipeline stages, or the direct-global GEMM (no staging)."
        )
    threads = 1
    for tag, extent in func.attrs["thread_extent"].items():
        value = getattr(extent, "value", None)
        if str(tag).startswith("threadIdx") and value is not None:
            threads *= int(value)
    if threads > MAX_THREADS_PER_THREADGROUP:
        raise MetalLoweringError(
            f"kernel {name} launches {threads} threads per threadgroup; Metal allows at most {MAX_THREADS_PER_THREADGROUP}. "
            "Use fewer threads in T.Kernel(..., threads=...)."
        )
    return func


CheckThreadgroupResources = per_function_pass("tilelang_metal.CheckThreadgroupResources", check_function, kernels_only=True)
