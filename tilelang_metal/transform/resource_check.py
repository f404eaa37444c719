"""Refuse kernels that exceed Metal's per-threadgroup resources, at lower time, in one place.

The threadgroup-memory refusal names every buffer as the kernel declared it. When the check runs,
that information is gone from the IR: InjectSoftwarePipeline has multiplied pipelined buffers by
their stage count, FlattenBuffer has made them 1-D, and tilelang's MergeSharedMemoryAllocations
has packed them into one byte pool (`buf_dyn_shmem`, where buffers with disjoint lifetimes may
overlap). So `ThreadgroupBufferLog` records the declared shapes before pipelining, the stage counts
after it, and which kernel holds which buffer before merging, keyed by the buffers' data variables
(every one of those passes keeps them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..host import tile_op_name, tile_region, tir, tvm
from ..errors import MetalLoweringError
from ..target.limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES, THREADGROUP_MEMORY_TEXT
from ..core.scopes import SHARED_SCOPES
from ..core.ir_attrs import find_nodes
from ..host import vocab

__all__ = ["CheckThreadgroupResources", "ThreadgroupBuffer", "ThreadgroupBufferLog", "MAX_THREADS_PER_THREADGROUP", "THREADGROUP_MEMORY_BYTES"]


def _elements(shape: Any) -> int:
    count = 1
    for dim in shape:
        count *= int(dim)
    return count


def _dtype_bytes(dtype: Any) -> int:
    return max(1, int(tvm.DataType(str(dtype)).bits) * int(tvm.DataType(str(dtype)).lanes) // 8)


def _static_shape(buf: Any) -> tuple[int, ...] | None:
    """The buffer's shape, or None when an extent is symbolic (not known before launch)."""
    if not all(isinstance(d, tir.IntImm) for d in buf.shape):
        return None
    return tuple(int(d) for d in buf.shape)


def _bytes(buf: Any) -> int:
    """Bytes of a threadgroup allocation; a symbolic extent counts as 0 (the emulator's launch
    check and Metal's pipeline creation still see the real size)."""
    shape = _static_shape(buf)
    return _elements(shape) * _dtype_bytes(buf.dtype) if shape is not None else 0


def _is_shared(buf: Any) -> bool:
    return str(buf.scope()) in SHARED_SCOPES


@dataclass(frozen=True)
class ThreadgroupBuffer:
    """One threadgroup buffer as the kernel declared it."""

    name: str
    dtype: str
    shape: tuple[int, ...]  # as declared: before pipelining multiplies it and flattening makes it 1-D
    scope: str
    stages: int = 1  # copies InjectSoftwarePipeline keeps of it (1: not multi-buffered)
    gemm_operand: bool = False  # an A or B operand of a T.gemm
    declared: bool = True  # False for buffers the lowering itself added (reduction scratch, ...)

    @property
    def nbytes(self) -> int:
        return _elements(self.shape) * _dtype_bytes(self.dtype) * self.stages

    def describe(self) -> str:
        text = f"{self.name} {self.dtype}[{', '.join(str(d) for d in self.shape)}]"
        if self.stages > 1:
            return f"{text} x {self.stages} pipeline stages = {self.nbytes} B"
        return f"{text} {self.nbytes} B"


class ThreadgroupBufferLog:
    """The threadgroup buffers of one lowering, recorded at three points of the pipeline (see the
    module docstring), plus the staging bypass's reasons for keeping a T.gemm's shared operands."""

    def __init__(self) -> None:
        self._declared: dict[Any, ThreadgroupBuffer] = {}  # data var -> buffer as declared
        self._kernels: dict[str, list[tuple[Any, ThreadgroupBuffer]]] = {}  # kernel -> (data var, buffer)
        self.staging_kept: list[str] = []  # why the staging bypass left a T.gemm's operands in threadgroup memory

    def record_declared(self, mod: Any) -> None:
        """Before InjectSoftwarePipeline: shapes as written and which buffers feed a T.gemm."""
        for func in _prim_funcs(mod):
            operands = set()
            for call in find_nodes(func.body, [vocab.TIRX_CALL]):
                if tile_op_name(call) == "gemm":
                    operands.update(tile_region(call.args[i]).buffer.data for i in (0, 1))
            for block in find_nodes(func.body, [vocab.TIRX_SBLOCK]):
                for buf in block.alloc_buffers:
                    shape = _static_shape(buf)
                    if _is_shared(buf) and shape is not None:
                        self._declared[buf.data] = ThreadgroupBuffer(buf.name, str(buf.dtype), shape, str(buf.scope()), gemm_operand=buf.data in operands)

    def record_pipelined(self, mod: Any) -> None:
        """After InjectSoftwarePipeline: a multi-buffered allocation gained a leading stage dimension."""
        for func in _prim_funcs(mod):
            for block in find_nodes(func.body, [vocab.TIRX_SBLOCK]):
                for buf in block.alloc_buffers:
                    known = self._declared.get(buf.data)
                    shape = _static_shape(buf)
                    if known is not None and shape is not None and len(shape) == len(known.shape) + 1 and shape[1:] == known.shape:
                        self._declared[buf.data] = ThreadgroupBuffer(
                            known.name, known.dtype, known.shape, known.scope, shape[0], known.gemm_operand
                        )

    def record_kernels(self, mod: Any) -> None:
        """Before MergeSharedMemoryAllocations: the threadgroup buffers of each device kernel."""
        for gvar, func in mod.functions.items():
            if not isinstance(func, tir.PrimFunc):
                continue
            found = []
            for node in find_nodes(func.body, [vocab.TIRX_ALLOCBUFFER]):
                buf = node.buffer
                shape = _static_shape(buf)
                if _is_shared(buf) and shape is not None:
                    known = self._declared.get(buf.data)
                    if known is None:  # added by the lowering: its own (flat) shape
                        known = ThreadgroupBuffer(buf.name, str(buf.dtype), shape, str(buf.scope()), declared=False)
                    found.append((buf.data, known))
            if found:
                self._kernels[gvar.name_hint] = found

    def kernel_buffers(self, kernel: str) -> list[tuple[Any, ThreadgroupBuffer]] | None:
        return self._kernels.get(kernel)


def _prim_funcs(mod: Any) -> list[Any]:
    return [func for func in mod.functions.values() if isinstance(func, tir.PrimFunc)]


def _names(buffers: list[ThreadgroupBuffer]) -> str:
    return ", ".join(b.name for b in buffers)


def _advice(buffers: list[ThreadgroupBuffer], staging_kept: list[str]) -> str:
    """What to change, for this kernel: GEMM advice only when a T.gemm reads threadgroup operands."""
    largest = sorted((b for b in buffers if b.declared), key=lambda b: -b.nbytes)[:2] or sorted(buffers, key=lambda b: -b.nbytes)[:1]
    pipelined = [b for b in buffers if b.stages > 1]
    most = max((b.stages for b in pipelined), default=1)
    stages = f"fewer T.Pipelined stages (num_stages={most} keeps {_names(pipelined)} {most} times), " if pipelined else ""
    operands = [b for b in buffers if b.gemm_operand]
    if operands:
        kept = f"; the staging bypass keeps the staging because {'; '.join(dict.fromkeys(staging_kept))}" if staging_kept else ""
        others = [b for b in largest if not b.gemm_operand]
        besides = f"; shrink {_names(others)} too" if others else ""
        return (
            f"T.gemm stages {_names(operands)} in threadgroup memory: use smaller block_M/block_N/block_K tiles, {stages}"
            f"or let the T.gemm read A and B from global memory (the direct-global GEMM{kept}){besides}"
        )
    return (
        f"Use smaller tiles for {_names(largest)}, {stages}or T.alloc_fragment instead of T.alloc_shared for data "
        "each thread reads only itself"
    )


def threadgroup_memory_error(kernel: str, allocations: list[Any], log: ThreadgroupBufferLog | None) -> MetalLoweringError:
    """The one-line refusal of a kernel whose threadgroup allocations (after merging) exceed the limit."""
    used = sum(_bytes(buf) for buf in allocations)
    excess = used - THREADGROUP_MEMORY_BYTES
    recorded = log.kernel_buffers(kernel) if log is not None else None
    head = (
        f"kernel {kernel} needs {used} bytes of threadgroup memory, Metal allows {THREADGROUP_MEMORY_BYTES} ({THREADGROUP_MEMORY_TEXT}): "
        f"{excess} bytes must go"
    )
    if not recorded:
        sizes = ", ".join(f"{buf.name} {_bytes(buf)} B" for buf in allocations)
        return MetalLoweringError(f"{head}; {sizes}. Use smaller shared tiles or fewer pipeline stages.")
    parts, everything = [], []
    merged = [buf for data, buf in recorded if not any(a.data.same_as(data) for a in allocations)]
    for alloc in allocations:
        own = next((buf for data, buf in recorded if alloc.data.same_as(data)), None)
        if own is not None:  # not merged: the allocation is the buffer itself
            parts.append(own.describe())
            everything.append(own)
            continue
        members = [buf for buf in merged if buf.scope == str(alloc.scope())]
        pool = f"pool {alloc.name} {_bytes(alloc)} B"
        if members and _bytes(alloc) < sum(b.nbytes for b in members):
            pool += " (buffers with disjoint lifetimes share bytes)"
        parts.append(f"{pool} holds {', '.join(b.describe() for b in members)}" if members else pool)
        everything += members
    return MetalLoweringError(f"{head}; {'; '.join(parts)}. {_advice(everything, log.staging_kept)}.")


def check_function(func: Any, kernel: str, log: ThreadgroupBufferLog | None = None) -> Any:
    shared = [node.buffer for node in find_nodes(func.body, [vocab.TIRX_ALLOCBUFFER]) if _is_shared(node.buffer)]
    if sum(_bytes(buf) for buf in shared) > THREADGROUP_MEMORY_BYTES:
        raise threadgroup_memory_error(kernel, shared, log)
    threads = 1
    for tag, extent in func.attrs["thread_extent"].items():
        value = getattr(extent, "value", None)
        if str(tag).startswith("threadIdx") and value is not None:
            threads *= int(value)
    if threads > MAX_THREADS_PER_THREADGROUP:
        raise MetalLoweringError(
            f"kernel {kernel} launches {threads} threads per threadgroup; Metal allows at most {MAX_THREADS_PER_THREADGROUP}. "
            "Use fewer threads in T.Kernel(..., threads=...)."
        )
    return func


def CheckThreadgroupResources(mod: Any, log: ThreadgroupBufferLog | None = None) -> Any:
    """Check every device kernel (a function with a `thread_extent` launch attribute); `log` names
    the buffers in the threadgroup-memory refusal."""
    for gvar, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc) and func.attrs is not None and "thread_extent" in func.attrs:
            check_function(func, gvar.name_hint, log)
    return mod
