"""Launch 2-D / 3-D threadgroups that hold tile ops as one linear thread index.

tilelang's layout inference and tile-op lowering (`T.copy`, `T.Parallel`, `T.fill`, `T.gemm`,
reductions) partition work over `threadIdx.x` only: with `threads=(16, 8)` every `threadIdx.y` row
redid the whole tile, so a read-modify-write ran 8 times. A Metal threadgroup of (X, Y, Z) threads
is the same threads as one of X*Y*Z: `thread_index_in_threadgroup` is x + X*(y + Y*z) and
simdgroups are runs of 32 of those linear ids. So such a kernel is relaunched with one x extent of
X*Y*Z threads, and the user's own indices become x = t % X, y = t / X % Y, z = t / (X*Y): every
thread keeps its identity and the tile ops spread over all of them. Kernels without tile ops keep
their launch as written.
"""

from __future__ import annotations

from typing import Any

from ..errors import MetalLoweringError
from ..host import THREAD_EXTENT_ATTR, tir, tvm
from ..host import vocab
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .kernel_launches import THREAD_TAGS, ThreadLaunch, rewrite_kernels

# TVM's allreduce names its thread variables by identity: they must stay launch variables
_THREAD_VAR_INTRINSICS = (vocab.TIRX_TVM_THREAD_ALLREDUCE,)


def _spread_over_threads(call: Any) -> bool:
    """A tile op tilelang partitions over the threads: any but a region operand and a fill of one
    thread's own array (`T.clear` of a `T.alloc_local`), which each thread runs whole."""
    name = vocab.tile_op_name(call)
    if name is None or name == "region":
        return False
    if name == "fill":
        return vocab.tile_region(call.args[0]).buffer.scope() != "local"
    return True


def _tile_op_count(kernel: Any) -> int:
    parallel = sum(1 for loop in find_nodes(kernel, [vocab.TIRX_FOR]) if loop.kind == tir.ForKind.PARALLEL)
    return parallel + sum(1 for call in find_nodes(kernel, [vocab.TIRX_CALL]) if _spread_over_threads(call))


def _linearized(kernel: Any, launch: ThreadLaunch) -> Any:
    if launch.is_one_dimensional or _tile_op_count(kernel) == 0:
        return kernel
    extents = [launch.extent(tag) for tag in THREAD_TAGS]
    if any(n is None for n in extents):
        raise MetalLoweringError(
            f"tile ops (T.copy, T.Parallel, T.gemm, T.reduce_*) need a static thread launch, this kernel launches "
            f"{launch.shape_text()}: use T.Kernel(..., threads=N) with an int and index threads through T.get_thread_binding()"
        )
    for call in find_nodes(kernel, [vocab.TIRX_CALL]):
        if str(getattr(call.op, "name", "")) in _THREAD_VAR_INTRINSICS:
            raise MetalLoweringError(
                f"a kernel launched with {launch.shape_text()} mixes tile ops with tvm_thread_allreduce: tile ops "
                f"run such a launch as one linear thread index, the allreduce needs its own; use threads={launch.threads} "
                f"and index threads through T.get_thread_binding(), or move the allreduce to a kernel without tile ops"
            )
    if "threadIdx.x" not in launch.bindings:  # no x attribute to take over
        raise MetalLoweringError(f"a kernel launched with {launch.shape_text()} has no threadIdx.x: use threads={launch.threads}")
    total = launch.threads
    linear = tir.Var("thread_linear", launch.tx.dtype)
    substitutions: dict[Any, Any] = {}
    stride = 1
    for tag, extent in zip(THREAD_TAGS, extents):
        if tag in launch.bindings:
            var = launch.bindings[tag][0]
            index = tir.floordiv(linear, stride) if stride > 1 else linear
            substitutions[var] = tir.floormod(index, extent) if stride * extent < total else index
            if var.dtype != linear.dtype:
                substitutions[var] = tir.Cast(var.dtype, substitutions[var])
        stride *= extent
    new_iter = tir.IterVar(tvm.ir.Range(0, total), linear, tir.IterVar.ThreadIndex, "threadIdx.x")

    def relaunch(node: Any) -> Any:
        if not (isinstance(node, tir.AttrStmt) and str(node.attr_key) == THREAD_EXTENT_ATTR):
            return None
        tag = str(node.node.thread_tag)
        if tag not in THREAD_TAGS:
            return None
        if tag == "threadIdx.x":
            return tir.AttrStmt(new_iter, THREAD_EXTENT_ATTR, tir.const(total, linear.dtype), node.body)
        # y / z: unit extents on fresh variables (the user's are expressions of the linear index now);
        # tilelang's ThreadSync expects all three thread attributes, as MaterializeKernelLaunch writes them
        unit = tir.IterVar(tvm.ir.Range(0, 1), tir.Var(node.node.var.name + "_unit", node.node.var.dtype), tir.IterVar.ThreadIndex, tag)
        return tir.AttrStmt(unit, THREAD_EXTENT_ATTR, tir.const(1, node.value.dtype), node.body)

    body = tvm.tirx.stmt_functor.ir_transform(kernel, None, relaunch, [vocab.TIRX_ATTRSTMT])
    return tvm.tirx.stmt_functor.substitute(body, substitutions)


def _linearize_function(func: Any) -> Any:
    body = rewrite_kernels(func.body, _linearized)
    return func if body.same_as(func.body) else func.with_body(body)


LinearizeThreadLaunch = per_function_pass("tilelang_metal.LinearizeThreadLaunch", _linearize_function)
