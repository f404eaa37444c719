"""`LowerMetalTileOps`: rewrite the tile ops tilelang has no Metal implementation for into plain TIR.

Runs after LayoutInference (which records fragment layouts in the blocks' `layout_map`) and before
LowerTileOp (which would stop with "requires a target-specific implementation"). What it emits is
ordinary TIR on the logical buffers plus parallel loops annotated with a fragment layout, which
LowerTileOp then partitions over threads like any `T.Parallel` loop.

The barriers of the threadgroup exchanges these ops create come from tilelang's ThreadSync, which
runs later; when a kernel turns it off (`tl.disable_thread_storage_sync`, for kernels that place
their own `T.sync_threads`), the ops carry their own, and two barriers that end up next to each
other (one op's last and the next op's first, or the kernel's own `T.sync_threads`) become one.
Such an op under control flow that differs between threads is refused: its barriers would be
divergent.
"""

from __future__ import annotations

from typing import Any

from ..host import (
    LAYOUT_MAP_ATTR,
    call_annotations,
    PARALLEL_LOOP_LAYOUT_ATTR,
    fragment_view,
    thread_storage_sync_disabled,
    tile_op_name,
    tile_region,
    tir,
    tvm,
)
from ..errors import MetalLoweringError
from ..transform.barriers import merge_adjacent_barriers, sync_scope
from ..transform.function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from ..transform.kernel_launches import ThreadLaunch, rewrite_kernels
from ..transform.uniformity import ThreadDependence
from .tile_atomics import ELEMENT_OPS as ATOMIC_TILE_OPS, check_half_width_atomics, lower_atomic_tile_op
from .cumsum import lower_cumsum
from .reduce import KINDS, ReduceCall, lower_fragment_reduce, lower_local_reduce
from .reducer import lower_finalize_reducer
from ..host import vocab

PLUGIN_TILE_OPS = ("reduce", "cumsum", "cummax", "finalize_reducer")


def _thread_x(launch: ThreadLaunch | None) -> tuple[Any, int]:
    """threadIdx.x and the thread count of the kernel holding the tile ops (None, 1 outside any)."""
    if launch is None or launch.tx is None:
        return None, 1
    threads = launch.threads
    if not launch.is_one_dimensional or threads is None:
        raise MetalLoweringError(
            f"reductions and scans on Metal need a 1-D threadgroup of static size, this kernel launches {launch.shape_text()}: "
            f"use T.Kernel(..., threads={threads or 'N'}) with an int and index threads through T.get_thread_binding()"
        )
    return launch.tx, threads


def _whole(region: Any, what: str) -> Any:
    if not region.is_whole_buffer():
        raise MetalLoweringError(
            f"{what} on a part of {region.buffer.name} is not supported on Metal; pass the whole buffer (or copy the part into its own buffer)"
        )
    return region.buffer


def _reduce(call: Any, layouts: dict[Any, Any], tx: Any, threads: int, own_barriers: bool) -> tuple[Any, list[Any]]:
    src = _whole(tile_region(call.args[0]), "T.reduce")
    dst = _whole(tile_region(call.args[1]), "T.reduce")
    kind = str(call.args[2].value)
    if kind not in KINDS:
        raise MetalLoweringError(f"T.reduce_{kind} is not supported on Metal (supported: {', '.join(KINDS)})")
    op = ReduceCall(src, dst, kind, int(call.args[3].value), bool(call.args[4].value))
    scopes = (src.scope(), dst.scope())
    if scopes[0] == "local" and scopes[1] in ("local", "local.var"):
        return lower_local_reduce(op)
    if scopes != ("local.fragment", "local.fragment"):
        raise MetalLoweringError(f"T.reduce from {scopes[0]} to {scopes[1]} is not supported on Metal")
    if src not in layouts or dst not in layouts:
        raise MetalLoweringError(f"T.reduce: layout inference left no layout for {src.name} or {dst.name}")
    if tx is None:
        raise MetalLoweringError("T.reduce on fragments needs a thread launch (T.Kernel(..., threads=N))")
    return lower_fragment_reduce(op, fragment_view(layouts[src]), fragment_view(layouts[dst]), tx, threads, PARALLEL_LOOP_LAYOUT_ATTR, own_barriers)


def _finalize_reducer(call: Any, layouts: dict[Any, Any], tx: Any, threads: int, own_barriers: bool) -> tuple[Any, list[Any]]:
    reducer = tile_region(call.args[0]).buffer
    if reducer not in layouts:
        raise MetalLoweringError(f"T.finalize_reducer: layout inference left no layout for {reducer.name}")
    if tx is None:
        raise MetalLoweringError("T.finalize_reducer needs a thread launch (T.Kernel(..., threads=N))")
    annotations = call_annotations(call)
    rest = [int(a.value) for a in call.args[2:]]
    steps = list(zip(rest[0::2], rest[1::2])) if "plan" in annotations else None
    view = fragment_view(layouts[reducer])
    return lower_finalize_reducer(
        reducer, view, int(call.args[1].value), steps, annotations.get("seed"), tx, threads, PARALLEL_LOOP_LAYOUT_ATTR, own_barriers
    )


_OP_CALLS = {"reduce": "T.reduce", "finalize_reducer": "T.finalize_reducer", "cumsum": "T.cumsum", "cummax": "T.cummax"}


def _divergence(node: Any, thread: ThreadDependence) -> str | None:
    """How a loop or branch differs between threads (None when every thread takes it alike)."""
    if isinstance(node, tir.IfThenElse) and thread.depends(node.condition):
        return f"`if {node.condition}`"
    if isinstance(node, tir.While) and thread.depends(node.condition):
        return f"`while {node.condition}`"
    if isinstance(node, tir.For) and (thread.depends(node.min) or thread.depends(node.extent)):
        return f"a loop over range({node.min}, {node.min} + {node.extent})"
    return None


def _named_apart(stmt: Any, buffers: list[Any], taken: set[str]) -> tuple[Any, list[Any]]:
    """`stmt` and its scratch `buffers`, each renamed `<name>_<k>` if an earlier op of the kernel took its name
    (two reductions into `m` both make `m_red_scratch`). MergeSharedMemoryAllocations orders the buffers it
    places at one offset by name and then by address, so two equal names came out in either order from one
    process to the next: different MSL for the same kernel, and an emulator cache miss in each process."""
    renamed: dict[Any, Any] = {}
    for buf in buffers:
        name, k = str(buf.name), 0
        while name in taken:
            k += 1
            name = f"{buf.name}_{k}"
        taken.add(name)
        if name != str(buf.name):
            renamed[buf] = tir.decl_buffer(buf.shape, buf.dtype, name, scope=buf.scope())
    if not renamed:
        return stmt, buffers

    def rebind(node: Any) -> Any:
        target = renamed.get(node.buffer)
        if target is None:
            return None
        if isinstance(node, tir.BufferLoad):
            return tir.BufferLoad(target, node.indices, node.predicate)
        return tir.BufferStore(target, node.value, node.indices, node.predicate)

    stmt = tvm.tirx.stmt_functor.ir_transform(stmt, None, rebind, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE])
    return stmt, [renamed.get(buf, buf) for buf in buffers]


def _lower_tile_ops(stmt: Any, layouts: dict[Any, Any], launch: ThreadLaunch | None, own_barriers: bool) -> Any:
    """`stmt` with every plugin tile op lowered for `launch` (the kernel holding `stmt`), with
    their own barriers when `own_barriers`; the scratch each op needs is allocated in its innermost
    enclosing block."""
    if not any(tile_op_name(n.value) in PLUGIN_TILE_OPS for n in find_nodes(stmt, [vocab.TIRX_EVALUATE])):
        return stmt
    tx, threads = _thread_x(launch)
    thread = ThreadDependence(stmt) if own_barriers else None
    divergent: list[str | None] = []  # per enclosing loop / branch: how it differs between threads
    # Scratch of the ops lowered so far and not yet allocated, and for each block being visited the
    # length of `pending` when it was entered: a block allocates only the scratch of the ops inside
    # it. (Taking all of `pending` at the next block to finish would put an op's scratch into a
    # later sibling block, e.g. a GEMM's, when the op sits in a loop outside any block of its own;
    # PlanAndUpdateBufferAllocationLocation then allocated it a second time where it is used:
    # "buffer r_part has already been defined, the Stmt is not SSA".)
    pending: list[Any] = []
    entered: list[int] = []
    scratch_names: set[str] = set()

    def preorder(node: Any) -> Any:
        if isinstance(node, tir.SBlock):
            entered.append(len(pending))
        elif thread is not None and isinstance(node, (tir.IfThenElse, tir.While, tir.For)):
            divergent.append(_divergence(node, thread))
        return None

    def postorder(node: Any) -> Any:
        if isinstance(node, (tir.IfThenElse, tir.While, tir.For)):
            if thread is not None:
                divergent.pop()
            return None
        if isinstance(node, tir.Evaluate):
            name = tile_op_name(node.value)
            if name == "reduce":
                stmt, buffers = _reduce(node.value, layouts, tx, threads, own_barriers)
            elif name == "finalize_reducer":
                stmt, buffers = _finalize_reducer(node.value, layouts, tx, threads, own_barriers)
            elif name in ("cumsum", "cummax"):
                stmt, buffers = lower_cumsum(node.value, name, tx, threads, own_barriers)
            else:
                return None
            where = next((d for d in reversed(divergent) if d is not None), None)
            if where is not None and any(sync_scope(n) is not None for n in find_nodes(stmt, [vocab.TIRX_EVALUATE])):
                raise MetalLoweringError(
                    f"{_OP_CALLS[name]} under {where} (which differs between threads) exchanges data through threadgroup "
                    f"memory; with tl.disable_thread_storage_sync its barriers are the lowering's own, and a barrier there "
                    f"would not be reached by every thread. Move the {_OP_CALLS[name]} out of that loop or branch."
                )
            stmt, buffers = _named_apart(stmt, buffers, scratch_names)
            pending.extend(buffers)
            return stmt
        if isinstance(node, tir.SBlock):
            start = entered.pop()
            inside = pending[start:]
            if not inside:
                return None
            del pending[start:]
            allocs = list(node.alloc_buffers) + inside
            return tir.SBlock(
                node.iter_vars, node.reads, node.writes, node.name_hint, node.body, node.init, allocs, node.match_buffers, node.annotations
            )
        return None

    kinds = [vocab.TIRX_EVALUATE, vocab.TIRX_SBLOCK, vocab.TIRX_IFTHENELSE, vocab.TIRX_WHILE, vocab.TIRX_FOR]
    lowered = tvm.tirx.stmt_functor.ir_transform(stmt, preorder, postorder, kinds)
    if pending:
        raise MetalLoweringError("internal: tile-op scratch buffers found no enclosing block")
    return merge_adjacent_barriers(lowered) if own_barriers else lowered


def lower_function(func: Any) -> Any:
    if not any(tile_op_name(n.value) in PLUGIN_TILE_OPS for n in find_nodes(func.body, [vocab.TIRX_EVALUATE])):
        return func
    layouts: dict[Any, Any] = {}
    for block in find_nodes(func.body, [vocab.TIRX_SBLOCK]):
        if LAYOUT_MAP_ATTR in block.annotations:
            layouts.update(dict(block.annotations[LAYOUT_MAP_ATTR].items()))
    own_barriers = thread_storage_sync_disabled()  # no ThreadSync will place the exchanges' barriers
    # each kernel of the module with its own launch; then whatever lies outside every kernel
    body = rewrite_kernels(func.body, lambda kernel, launch: _lower_tile_ops(kernel, layouts, launch, own_barriers))
    return func.with_body(_lower_tile_ops(body, layouts, None, own_barriers))


LowerMetalTileOps = per_function_pass("tilelang_metal.LowerMetalTileOps", lower_function)


def lower_atomic_function(func: Any) -> Any:
    if any(tile_op_name(n.value) in ATOMIC_TILE_OPS for n in find_nodes(func.body, [vocab.TIRX_EVALUATE])):

        def postorder(node: Any) -> Any:
            name = tile_op_name(node.value)
            return lower_atomic_tile_op(node.value, name) if name in ATOMIC_TILE_OPS else None

        func = func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, postorder, [vocab.TIRX_EVALUATE]))
    check_half_width_atomics(find_nodes(func.body, [vocab.TIRX_CALL]))
    return func


# Before LayoutInference: tilelang's layout inference for tile atomics is target-specific too.
LowerMetalAtomicTileOps = per_function_pass("tilelang_metal.LowerMetalAtomicTileOps", lower_atomic_function)
