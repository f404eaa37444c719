"""Register staging of a software-pipelined K loop's global -> threadgroup copies.

Metal has no asynchronous global -> threadgroup copy (no cp.async): a `T.copy` lowers to device
loads whose values are stored straight into threadgroup memory, so in a `T.Pipelined` loop the
copies of tile k+1 and the barrier after them wait for the device loads before the matrix
operations of tile k can start. Register staging splits each such copy in two: the device loads
into a thread-local array stay where they were (before the matrix operations), the stores from that
array into threadgroup memory move to the end of the loop body (after them). The loads are then
in flight while the matrix operations run.

Two passes, one concept:
- `stage_loops` (the marking, the last step of `gemm_plans.RecordGemmPlans`, which sets the
  `register_staging` flag of the plans of the marked loops' T.gemm calls) runs right after InjectSoftwarePipeline, where the loop body still has one
  block per tile op and the tile ops' regions are exact. It marks a pipelined loop when every leading
  `T.copy` from global into shared memory writes a pipeline version that no later statement of the
  body reads (proved per residue of the loop variable modulo the stage count) and no later statement
  writes that buffer: only then may its stores be delayed to the end of the body.
- `SplitStagedCopies` runs on the flat device IR right after ThreadSync. In a marked loop it splits
  the leading statements that store a value read from global memory into a marked buffer (vector
  widths, `if_then_else` masks, enclosing unrolled loops and guards kept), so the value is computed
  at the same place and only its store moves, and it places the loop's barriers itself: one per K
  step between the loads and the matrix operations, one after the loop (ThreadSync, seeing only
  buffer offsets, would put one on each side of the moved stores).

Cost: one register array per dtype per loop, of the elements each thread copies per K step
(`(block_M * block_K + block_K * block_N) / threads`), live across the matrix operations.
"""

from __future__ import annotations

from typing import Any

import math
from dataclasses import replace

from ..host import gemm_call_fields, tile_op_name, tile_region, tir, tvm, with_call_annotations
from .. import config
from ..performance import register_budget
from ..config import LoweringOptions
from ..target.capabilities import TargetCapabilities
from ..target.isa import SIMD_WIDTH
from ..performance.register_budget import RegisterEstimate
from ..core.scopes import FRAGMENT_SCOPES
from ..planning import GEMM_PLAN_ANNOTATION, encode_plan, plan_of_call, recorded_plan
from .kernel_launches import kernels
from ..core.ir_attrs import THREAD_ARRAY_ALIGN_ATTR  # AllocBuffer annotation: the printer declares alignas(N)
from ..core.ir_attrs import find_nodes, with_decisions
from .barriers import is_threadgroup_barrier, storage_sync, sync_scope
from .function_pass import per_function_pass
from ..host import vocab

PIPELINE_STAGES_ATTR = "tl_pipelined_num_stages"  # loop annotation InjectSoftwarePipeline leaves
STAGED_BUFFERS_ATTR = "tilelang_metal.register_staging"  # names of the buffers whose copies may split

_PURE_CALLS = (vocab.TIRX_IF_THEN_ELSE, vocab.TIRX_LIKELY, vocab.TIRX_REINTERPRET)
_GLOBAL_SCOPES = ("global", "")
STAGED_PREFIX = "staged_"  # name of the register arrays (one per dtype)


def _is_global(buffer: Any) -> bool:
    return str(buffer.scope()) in _GLOBAL_SCOPES


def _is_shared(buffer: Any) -> bool:
    return str(buffer.scope()).startswith("shared")


def _statements(body: Any) -> list[Any]:
    return list(body.seq) if isinstance(body, tir.SeqStmt) else [body]


# ---------------------------------------------------------------------------------------------
# Marking (tile level, right after InjectSoftwarePipeline)
# ---------------------------------------------------------------------------------------------


def _staging_copy(stmt: Any) -> Any | None:
    """The destination region of a block holding one `T.copy` from global into shared memory."""
    if not isinstance(stmt, tir.SBlockRealize):
        return None
    body = stmt.block.body
    if not (isinstance(body, tir.Evaluate) and tile_op_name(body.value) == "copy"):
        return None
    call = body.value
    if len(call.args) < 2:
        return None
    src, dst = tile_region(call.args[0]), tile_region(call.args[1])
    if not (_is_global(src.buffer) and _is_shared(dst.buffer)):
        return None
    return dst


def _accesses(stmt: Any, staged: set) -> list[tuple[Any, bool]] | None:
    """Every access of a statement to the staged buffers as (region, is_write), or None when one
    cannot be bounded (the buffer's pointer used directly). Block read / write annotations are not
    used: InjectSoftwarePipeline widens them to the whole multi-versioned buffer."""
    out = []
    for node in find_nodes(stmt, [vocab.TIRX_CALL, vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE, vocab.TIRX_VAR]):
        if isinstance(node, tir.Var):
            if node in staged:
                return None
        elif isinstance(node, tir.Call):
            if str(node.op.name) in (vocab.TL_TILEOP_REGION, vocab.REGION_OP):
                region = tile_region(node)
                if region.buffer.data in staged:
                    out.append((region, int(node.args[1]) != 1))
        elif node.buffer.data in staged:
            out.append((tile_region(tir.BufferLoad(node.buffer, node.indices)), isinstance(node, tir.BufferStore)))
    return out


def _same_shape(a: Any, b: Any) -> bool:
    analyzer = tvm.arith.Analyzer()
    return len(a.shape) == len(b.shape) and all(analyzer.can_prove_equal(x, y) for x, y in zip(a.shape, b.shape))


def _bounds(region: Any) -> list[tuple[Any, Any]]:
    extents = [1] * (len(region.mins) - len(region.extents)) + list(region.extents)
    return list(zip(region.mins, extents))


def _disjoint(write: Any, read: Any, loop_var: Any, stages: int) -> bool:
    """Whether two regions of one buffer are disjoint for every value of `loop_var`: for each residue
    of the loop variable modulo the stage count, some dimension's ranges provably do not overlap."""
    quotient = tir.Var("stage_round", loop_var.dtype)
    for residue in range(stages):
        analyzer = tvm.arith.Analyzer()
        value = quotient * stages + residue
        found = False
        for (w_min, w_ext), (r_min, r_ext) in zip(_bounds(write), _bounds(read)):
            w_lo = analyzer.simplify(tvm.tirx.stmt_functor.substitute(w_min, {loop_var: value}))
            r_lo = analyzer.simplify(tvm.tirx.stmt_functor.substitute(r_min, {loop_var: value}))
            w_hi = analyzer.simplify(w_lo + w_ext)
            r_hi = analyzer.simplify(r_lo + r_ext)
            if analyzer.can_prove(w_hi <= r_lo) or analyzer.can_prove(r_hi <= w_lo):
                found = True
                break
        if not found:
            return False
    return True


def _stageable(loop: Any) -> list[str]:
    """Names of the buffers whose leading copies in this pipelined loop may store late."""
    stages = loop.annotations.get(PIPELINE_STAGES_ATTR)
    if stages is None or int(stages) < 2:
        return []
    body = _statements(loop.body)
    written: dict[Any, list[Any]] = {}
    count = 0
    for stmt in body:
        region = _staging_copy(stmt)
        if region is None:
            break
        written.setdefault(region.buffer.data, []).append(region)
        count += 1
    rest = body[count:]
    if not written or not rest:
        return []
    names = {var.name for var in written}
    if len(names) != len(written):  # two staged buffers with one name: the flat pass could not tell them apart
        return []
    for stmt in rest:
        accesses = _accesses(stmt, set(written))
        if accesses is None:
            return []
        for region, is_write in accesses:
            if is_write:
                return []
            for write in written[region.buffer.data]:
                if not _same_shape(write.buffer, region.buffer):  # a view of another shape: indices not comparable
                    return []
                if not _disjoint(write, region, loop.loop_var, int(stages)):
                    return []
    return sorted(names)


def _copy_elements(loop: Any) -> dict[str, int]:
    """Elements per dtype the loop's leading global -> shared copies move per K step (all threads)."""
    out: dict[str, int] = {}
    for stmt in _statements(loop.body):
        region = _staging_copy(stmt)
        if region is None:
            break
        elements = 1
        for extent in region.extents:
            elements *= int(extent) if isinstance(extent, (int, tir.IntImm)) else 0
        dtype = str(region.buffer.dtype)
        out[dtype] = out.get(dtype, 0) + elements
    return out


def loop_registers(loop: Any, threads: int, capabilities: TargetCapabilities, fragment_ct: bool) -> RegisterEstimate | None:
    """The register estimate of a pipelined loop with register staging: the T.gemm calls in its body
    (accumulators and operand fragments as GemmMetal would plan them) plus the staging array; None
    when a copy's size is not a constant (nothing to compare)."""
    copies = _copy_elements(loop)
    if any(n <= 0 for n in copies.values()):
        return None
    staging = sum(register_budget.registers(math.ceil(n / threads), dtype) for dtype, n in copies.items())
    sites = [(c, f) for c, f in ((c, gemm_call_fields(c)) for c in find_nodes(loop.body, [vocab.TIRX_CALL])) if f is not None and f.a_buffer is not None]
    accumulator = operands = 0
    shared = False
    for call, f in sites:
        c_scope = str(f.c_buffer.scope())
        planned = plan_of_call(call, f, threads, capabilities, fragment_ct)  # the plan GemmMetal will read (recorded by gemm_plans.py)
        part = planned.partition
        if part is None:
            continue  # GemmMetal refuses it with its own message
        one = register_budget.gemm_registers(
            M=f.m, N=f.n, instruction=planned.instruction, partition=part, a_dtype=str(f.a_buffer.dtype),
            b_dtype=str(f.b_buffer.dtype), acc_dtype=str(f.c_buffer.dtype) if c_scope in FRAGMENT_SCOPES else "float32", shared=True)
        accumulator += one.accumulator
        operands += one.operands
        shared = True
    return register_budget.RegisterEstimate(accumulator, operands, 0, staging, register_budget.address_registers(shared=True))


def _loop_threads(func: Any) -> dict[Any, int]:
    """Loop variable of each pipelined loop -> threads of the kernel it runs in."""
    found = {}
    for kernel, launch in kernels(func.body):
        for loop in find_nodes(kernel, [vocab.TIRX_FOR]):
            if PIPELINE_STAGES_ATTR in loop.annotations and launch.threads:
                found[loop.loop_var] = int(launch.threads)
    return found


def _fits(loop: Any, threads: int | None, capabilities: TargetCapabilities, names: list[str], options: LoweringOptions, decisions: list[str]) -> bool:
    """Whether staging this loop keeps the register estimate within the budget; adds the decision
    for `--explain` to `decisions` when it does not."""
    if threads is None or threads % SIMD_WIDTH:
        return True  # no estimate: staging as before (a GEMM refuses such a launch itself)
    estimate = loop_registers(loop, threads, capabilities, options.fragment_ct)
    if estimate is None or estimate.fits:
        return True
    subject = f"the pipelined loop over {loop.loop_var.name} (copies into {', '.join(names)})"
    decisions.append(register_budget.RegisterDecision("register staging", subject, config.PREFIX + "REGISTER_STAGING", estimate).describe())
    return False


def mark_function(func: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    mode = options.register_staging
    if mode == config.OFF:
        return func
    threads_of = _loop_threads(func) if mode == config.FIT else {}
    decisions: list[str] = []  # on the function for --explain (ir_attrs.DECISIONS_ATTR)

    def postorder(node: Any) -> Any:
        if PIPELINE_STAGES_ATTR not in node.annotations:
            return None
        names = _stageable(node)
        if not names:
            return None
        if mode == config.FIT and not _fits(node, threads_of.get(node.loop_var), capabilities, names, options, decisions):
            return None
        annotations = dict(node.annotations.items())
        annotations[STAGED_BUFFERS_ATTR] = names
        return tir.For(node.loop_var, node.min, node.extent, node.kind, _with_staging_flag(node.body), node.thread_binding, annotations)

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, postorder, [vocab.TIRX_FOR])
    return with_decisions(func.with_body(body), decisions)


def _with_staging_flag(body: Any) -> Any:
    """`body` with `register_staging` set on the plans recorded on its T.gemm calls."""

    def flag(call: Any) -> Any:
        plan = recorded_plan(call)
        if plan is None or plan.register_staging:
            return None
        return with_call_annotations(call, {GEMM_PLAN_ANNOTATION: encode_plan(replace(plan, register_staging=True))})

    return tvm.tirx.stmt_functor.ir_transform(body, None, flag, [vocab.TIRX_CALL])


def stage_loops(mod: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    """Mark the pipelined loops whose copies may split (see `mark_function`), on every PrimFunc, and
    set the flag on the plans of their T.gemm calls: the last step of `gemm_plans.RecordGemmPlans`."""
    return per_function_pass("tilelang_metal.MarkRegisterStaging", lambda func: mark_function(func, capabilities, options))(mod)


# ---------------------------------------------------------------------------------------------
# Splitting (flat device IR, right after ThreadSync)
# ---------------------------------------------------------------------------------------------


def _global_value(value: Any) -> bool:
    """A value computed from global memory only (no threadgroup or thread memory, no side effects)."""
    for node in find_nodes(tir.Evaluate(value), [vocab.TIRX_BUFFERLOAD, vocab.TIRX_CALL]):
        if isinstance(node, tir.BufferLoad) and not _is_global(node.buffer):
            return False
        if isinstance(node, tir.Call) and str(node.op.name) not in _PURE_CALLS:
            return False
    return True


def _copy_shape(stmt: Any, names: set[str] | None) -> tuple[int, int] | None:
    """(elements one execution of a copy statement stores, widest vector), or None when it is not a
    splittable copy into one of `names` (None: any name, for statements already checked)."""
    if isinstance(stmt, tir.BufferStore):
        ok = (
            _is_shared(stmt.buffer)
            and (names is None or stmt.buffer.data.name in names)
            and stmt.predicate is None
            and len(stmt.indices) == 1
            and _global_value(stmt.value)
        )
        lanes = stmt.value.dtype.lanes
        return (lanes, lanes) if ok else None
    if isinstance(stmt, tir.For):
        if not (isinstance(stmt.min, tir.IntImm) and isinstance(stmt.extent, tir.IntImm)):
            return None
        if stmt.kind not in (tir.ForKind.SERIAL, tir.ForKind.UNROLLED) or stmt.thread_binding is not None:
            return None
        inner = _copy_shape(stmt.body, names)
        return None if inner is None else (inner[0] * int(stmt.extent.value), inner[1])
    if isinstance(stmt, tir.IfThenElse):
        if stmt.else_case is not None or find_nodes(tir.Evaluate(stmt.condition), [vocab.TIRX_BUFFERLOAD, vocab.TIRX_CALL]):
            return None
        return _copy_shape(stmt.then_case, names)
    if isinstance(stmt, tir.SeqStmt):
        shapes = [_copy_shape(part, names) for part in stmt.seq]
        if any(shape is None for shape in shapes) or any(shape[0] % shapes[0][1] for shape in shapes):
            return None  # parts of unequal vector widths: an offset could break a part's alignment
        return sum(shape[0] for shape in shapes), max(shape[1] for shape in shapes)
    return None


def _split(stmt: Any, regs: Any, offset: Any) -> tuple[Any, Any]:
    """(device loads into `regs` from `offset`, stores from `regs` into threadgroup memory)."""
    if isinstance(stmt, tir.BufferStore):
        lanes = stmt.value.dtype.lanes
        index = tir.Ramp(offset, 1, lanes) if lanes > 1 else offset
        load = tir.BufferStore(regs, stmt.value, [index])
        store = tir.BufferStore(stmt.buffer, tir.BufferLoad(regs, [index]), list(stmt.indices))
        return load, store
    if isinstance(stmt, tir.For):
        per_iteration = _copy_shape(stmt.body, None)[0]
        fresh = tir.Var(stmt.loop_var.name + "_st", stmt.loop_var.dtype)
        load_body, store_body = _split(stmt.body, regs, offset + (stmt.loop_var - stmt.min) * per_iteration)
        store_body = tvm.tirx.stmt_functor.substitute(store_body, {stmt.loop_var: fresh})
        load = tir.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, load_body, None, stmt.annotations)
        store = tir.For(fresh, stmt.min, stmt.extent, stmt.kind, store_body, None, stmt.annotations)
        return load, store
    if isinstance(stmt, tir.IfThenElse):
        load_body, store_body = _split(stmt.then_case, regs, offset)
        return tir.IfThenElse(stmt.condition, load_body, None), tir.IfThenElse(stmt.condition, store_body, None)
    loads, stores = [], []
    for part in stmt.seq:
        load, store = _split(part, regs, offset)
        loads.append(load)
        stores.append(store)
        offset = offset + _copy_shape(part, None)[0]
    return tir.SeqStmt(loads), tir.SeqStmt(stores)


def _drop_first_barrier(stmt: Any) -> tuple[Any, bool]:
    """`stmt` without the threadgroup barrier it runs first (before anything but declarations), if
    there is one. A barrier that also orders device memory is never dropped."""
    if is_threadgroup_barrier(stmt):
        return tir.Evaluate(0), True
    if isinstance(stmt, tir.AttrStmt):
        body, found = _drop_first_barrier(stmt.body)
        return (tir.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body) if found else stmt), found
    if isinstance(stmt, tir.SeqStmt):
        parts = list(stmt.seq)
        for i, part in enumerate(parts):
            if isinstance(part, (tir.AllocBuffer, tir.DeclBuffer)):
                continue
            new, found = _drop_first_barrier(part)
            if found:
                parts[i] = new
                return tir.SeqStmt(parts), True
            return stmt, False
    return stmt, False


def _no_barrier(stmt: Any) -> Any:
    return tir.Evaluate(0) if is_threadgroup_barrier(stmt) else None


def _writes_threadgroup(stmt: Any) -> bool:
    """Whether a statement may write threadgroup memory (a pointer passed anywhere but a read-only
    `tvm_access_ptr` counts as a write)."""
    for node in find_nodes(stmt, [vocab.TIRX_BUFFERSTORE, vocab.TIRX_CALL]):
        if isinstance(node, tir.BufferStore):
            if _is_shared(node.buffer):
                return True
            continue
        name = str(node.op.name)
        if name == vocab.TIRX_TVM_STORAGE_SYNC:
            continue
        if name == vocab.TIRX_TVM_ACCESS_PTR:
            if _pointer_scope(node.args[1]).startswith("shared") and int(node.args[4]) & 2:
                return True
            continue
        for arg in node.args:
            if isinstance(arg, tir.Var) and _pointer_scope(arg).startswith("shared"):
                return True
            if isinstance(arg, tir.Call) and str(arg.op.name) == vocab.TIRX_ADDRESS_OF and _is_shared(arg.args[0].buffer):
                return True
    return False


def _pointer_scope(var: Any) -> str:
    annotation = getattr(var, "type_annotation", None)
    return str(getattr(annotation, "storage_scope", "")) if annotation is not None else ""


def _split_loop(loop: Any, analyzer: Any) -> Any:
    names = {str(n) for n in loop.annotations[STAGED_BUFFERS_ATTR]}
    annotations = {k: v for k, v in loop.annotations.items() if k != STAGED_BUFFERS_ATTR}
    unchanged = tir.For(loop.loop_var, loop.min, loop.extent, loop.kind, loop.body, loop.thread_binding, annotations)
    body = _statements(loop.body)
    leading, scope, count = [], None, 0
    for stmt in body:
        if is_threadgroup_barrier(stmt):  # ThreadSync's barrier before the copies: replaced below
            scope = scope or sync_scope(stmt)
        elif _copy_shape(stmt, names) is not None:
            leading.append(stmt)
        else:
            break
        count += 1
    rest = body[count:]
    if not leading or not rest:
        return unchanged
    rest_stmt = tir.SeqStmt(rest) if len(rest) > 1 else rest[0]
    if _writes_threadgroup(rest_stmt):  # its own barriers may order those writes: keep all but the first
        rest_stmt, _ = _drop_first_barrier(rest_stmt)
    else:  # it only reads threadgroup memory, so its barriers ordered the copies' stores, which moved
        rest_stmt = tvm.tirx.stmt_functor.ir_transform(rest_stmt, None, _no_barrier, [vocab.TIRX_EVALUATE])
    scope = scope or "shared"
    by_dtype: dict[str, list[Any]] = {}
    for stmt in leading:
        dtype = str(find_nodes(stmt, [vocab.TIRX_BUFFERSTORE])[0].buffer.dtype)
        by_dtype.setdefault(dtype, []).append(stmt)
    allocs, loads, stores = [], [], []
    for dtype, stmts in by_dtype.items():
        pieces, offset, widest = [], 0, 1
        for stmt in stmts:
            elements, lanes = _copy_shape(stmt, names)
            offset = -(-offset // lanes) * lanes  # each vector at a multiple of its width (aligned moves)
            pieces.append((stmt, offset))
            offset += elements
            widest = max(widest, lanes * tvm.DataType(dtype).bits // 8)
        regs = tir.decl_buffer((offset,), dtype, name=f"{STAGED_PREFIX}{dtype}", scope="local")
        align = {THREAD_ARRAY_ALIGN_ATTR: 16} if widest >= 16 else None
        allocs.append(tir.AllocBuffer(regs, align))
        for stmt, start in pieces:
            load, store = _split(stmt, regs, tir.const(start, "int32"))
            loads.append(load)
            stores.append(store)
    barrier = storage_sync(scope)
    # one barrier per K step: it orders the previous step's threadgroup stores before this step's
    # reads (RAW) and the previous step's reads of the version stored now before the stores (WAR)
    new_body = tir.SeqStmt(allocs + loads + [barrier, rest_stmt] + stores)
    new_body = tvm.tirx.stmt_functor.ir_transform(new_body, None, lambda n: _simplify_staged(n, analyzer), [vocab.TIRX_BUFFERSTORE, vocab.TIRX_BUFFERLOAD])
    new_loop = tir.For(loop.loop_var, loop.min, loop.extent, loop.kind, new_body, loop.thread_binding, annotations)
    return tir.SeqStmt([new_loop, barrier])  # the last step's stores before whatever reads them next


def _simplify_staged(node: Any, analyzer: Any) -> Any:
    if not node.buffer.name.startswith(STAGED_PREFIX) or str(node.buffer.scope()) != "local":
        return None
    indices = [analyzer.simplify(i) for i in node.indices]
    if isinstance(node, tir.BufferStore):
        return tir.BufferStore(node.buffer, node.value, indices)
    return tir.BufferLoad(node.buffer, indices)


def split_function(func: Any) -> Any:
    analyzer = tvm.arith.Analyzer()

    def postorder(node: Any) -> Any:
        if STAGED_BUFFERS_ATTR not in node.annotations:
            return None
        return _split_loop(node, analyzer)

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, postorder, [vocab.TIRX_FOR])
    if body.same_as(func.body):
        return func
    return func.with_body(tvm.tirx.stmt_functor.ir_transform(body, None, _merge_adjacent_barriers, [vocab.TIRX_SEQSTMT]))


def _merge_adjacent_barriers(seq: Any) -> Any:
    """One barrier where two follow each other (the one after a split loop and ThreadSync's own, which
    may open the next statement)."""
    flat: list[Any] = []
    for stmt in seq.seq:
        flat.extend(stmt.seq if isinstance(stmt, tir.SeqStmt) else [stmt])
    kept: list[Any] = []
    for stmt in flat:
        if kept and is_threadgroup_barrier(kept[-1]) and _drop_first_barrier(stmt)[1]:
            kept.pop()  # `stmt` starts with its own barrier
        kept.append(stmt)
    return None if len(kept) == len(seq.seq) and len(flat) == len(seq.seq) else tir.SeqStmt(kept)


SplitStagedCopies = per_function_pass("tilelang_metal.SplitStagedCopies", split_function)
