"""`SplitBranchBarriers`: the threadgroup barriers tilelang's ThreadSync places inside a branch whose
condition differs between threads, moved to where every thread reaches them.

A branch taken by some threads only (`if tx < 64:` writing threadgroup memory and reading other
threads' entries) gets its barrier from ThreadSync inside the branch, as a CUDA named barrier over
the threads that take it (`tvm_storage_sync("shared", id, count)`). Metal has no named barrier over
part of a threadgroup: its `threadgroup_barrier` waits for every thread, so the printer refused the
kernel. The branch is split at its barriers instead, as `SyncDeviceMemory` does for its device
barriers (`split_at_barriers`): ifs on the same condition with whole-threadgroup barriers between
them (the k-th barrier of the then and of the else branch become one). Where that is not sound (a
barrier in a loop of the branch, a condition reading what the branch writes) the branch is left as
it was and the printer's refusal stands.
"""

from __future__ import annotations

from typing import Any

from ..errors import MetalLoweringError
from ..host import tvm, vocab
from .barriers import sync_scope
from .device_memory_sync import split_at_barriers
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .uniformity import ThreadDependence


def _threadgroup_or_device_barrier(stmt: Any) -> str | None:
    scope = sync_scope(stmt)
    return None if scope == "warp" else scope


def split_function(func: Any) -> Any:
    if not any(_threadgroup_or_device_barrier(node) for node in find_nodes(func.body, [vocab.TIRX_EVALUATE])):
        return func
    thread = ThreadDependence(func)

    def split(branch: Any) -> Any:
        if not thread.depends(branch.condition):
            return None
        cases = [branch.then_case] + ([branch.else_case] if branch.else_case is not None else [])
        if not any(_threadgroup_or_device_barrier(node) for case in cases for node in find_nodes(case, [vocab.TIRX_EVALUATE])):
            return None
        try:
            return split_at_barriers(branch.condition, branch.then_case, branch.else_case, _threadgroup_or_device_barrier, "threadgroup memory")
        except MetalLoweringError:
            return None  # no sound split: unchanged (the printer refuses a barrier over part of the threadgroup)

    return func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, split, [vocab.TIRX_IFTHENELSE]))


SplitBranchBarriers = per_function_pass("tilelang_metal.SplitBranchBarriers", split_function)
