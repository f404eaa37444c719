"""Order device-memory accesses that threads of one threadgroup exchange: `mem_device` barriers.

TileLang statements at tile level (a `T.Parallel` loop, a `T.gemm`, a `T.copy`) each distribute
their elements over the threads in their own way. When one statement writes a device buffer and a
later one reads or writes the same buffer (or reads it first and writes it later), an element may
pass from one thread to another through device memory: without a barrier the second statement can
read a stale value (a `T.gemm(..., clear_accum=False)` accumulating into a C that a `T.Parallel`
just initialised). tilelang's ThreadSync orders threadgroup memory only (it skips the global scope),
so this pass inserts `tvm_storage_sync("global")` (printed as
`threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)`: tilelang's ThreadSync,
which runs later, treats any sync as one for threadgroup memory too and adds none beside it) between
such statements, and at the end of a loop body whose tail conflicts with its head (the next iteration).
No barrier goes into control flow that differs between threads: a thread-guarded block (and its
else branch) is split around it, so the barrier sits between two ifs on the same condition where
every thread reaches it, and a loop whose range differs per thread gets none when each thread keeps
to its own elements (refused otherwise).

Runs at tile level, before layout inference, on statement sequences outside `T.Parallel` loops
(whose bodies run per element, not per statement). Each access is a box of elements: a tile-op
region, or the index range of a load / store over the loops of its statement. Two accesses
conflict unless their boxes are provably disjoint in some dimension (rows k and k+1 of an output,
the tiles of two T.copy calls). Conservative otherwise: two statements touching overlapping
elements are ordered even when every thread happens to touch only its own elements; the cost is
one barrier, the alternative a silent race. Ordering across threadgroups is not possible with
barriers and is the race checker's business.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..host import REGION_READ, REGION_WRITE, tile_op_region, tir, tvm
from ..errors import MetalLoweringError
from .barriers import storage_sync, sync_scope
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .uniformity import ThreadDependence, exchanged_buffers
from ..host import vocab


def device_barrier() -> Any:
    return storage_sync("global")


Box = tuple  # ((min, max inclusive) per dimension), or () when unknown: the whole buffer


@dataclass
class _Accesses:
    reads: list = field(default_factory=list)  # (data var, box)
    writes: list = field(default_factory=list)

    def add(self, other: _Accesses) -> None:
        self.reads += other.reads
        self.writes += other.writes


def _disjoint(a: Box, b: Box, analyzer: Any) -> bool:
    if not a or not b or len(a) != len(b):
        return False
    return any(analyzer.can_prove(x_hi < y_lo) or analyzer.can_prove(y_hi < x_lo) for (x_lo, x_hi), (y_lo, y_hi) in zip(a, b))


def _overlap(first: list, second: list, analyzer: Any) -> bool:
    return any(va.same_as(vb) and not _disjoint(ba, bb, analyzer) for va, ba in first for vb, bb in second)


def conflicts(earlier: _Accesses, later: _Accesses, analyzer: Any) -> bool:
    return (
        _overlap(earlier.writes, later.reads, analyzer)
        or _overlap(earlier.writes, later.writes, analyzer)
        or _overlap(earlier.reads, later.writes, analyzer)
    )


def _is_barrier(stmt: Any) -> bool:
    return sync_scope(stmt) == "global"


class _Planner:
    def __init__(self, device: set, thread: ThreadDependence):
        self.device = device
        self.thread = thread
        self.analyzer = tvm.arith.Analyzer()

    def accesses(self, stmt: Any) -> _Accesses:
        out = _Accesses()
        # loops inside the statement: an index is known as an interval over their ranges
        domain = {
            loop.loop_var: tvm.arith.IntervalSet(loop.min, loop.min + loop.extent - 1)
            for loop in find_nodes(stmt, [vocab.TIRX_FOR])
        }
        for node in find_nodes(stmt, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE, vocab.TIRX_CALL]):
            if isinstance(node, tir.Call):
                region = tile_op_region(node)
                if region is None or region[0].data not in self.device:
                    continue
                buf, mask, box = region[0], region[1], self.region_box(node)
                if mask & REGION_READ:
                    out.reads.append((buf.data, box))
                if mask & REGION_WRITE:
                    out.writes.append((buf.data, box))
            elif node.buffer.data in self.device:
                box = self.index_box(node.indices, domain)
                (out.writes if isinstance(node, tir.BufferStore) else out.reads).append((node.buffer.data, box))
        return out

    def region_box(self, call: Any) -> Box:
        origin = call.args[0].indices
        extents = list(call.args[2:])
        if len(extents) != len(origin):
            return ()
        return tuple((lo, lo + ext - 1) for lo, ext in zip(origin, extents))

    def index_box(self, indices: Any, domain: dict) -> Box:
        box = []
        for index in indices:
            if isinstance(index, tir.Ramp):
                return ()  # vector indices do not occur at tile level; unknown is safe
            interval = self.analyzer.int_set(index, domain)
            lo, hi = interval.min_value, interval.max_value
            if not (isinstance(lo, tir.PrimExpr) and isinstance(hi, tir.PrimExpr)) or "inf" in str(lo) or "inf" in str(hi):
                return ()
            box.append((lo, hi))
        return tuple(box)

    def sequence(self, stmts: list[Any]) -> tuple[list[Any], _Accesses, _Accesses, bool]:
        """(the statements with barriers, accesses before the first barrier, after the last, any barrier)."""
        out: list[Any] = []
        head: _Accesses | None = None
        pending = _Accesses()
        for stmt in stmts:
            stmt = self.visit(stmt)
            if _is_barrier(stmt):
                head, pending = head or pending, _Accesses()
                out.append(stmt)
                continue
            acc = self.accesses(stmt)
            if conflicts(pending, acc, self.analyzer):
                out.append(device_barrier())
                head, pending = head or pending, _Accesses()
            pending.add(acc)
            out.append(stmt)
        return out, head if head is not None else pending, pending, head is not None

    def visit(self, stmt: Any) -> Any:
        if isinstance(stmt, tir.SeqStmt):
            stmts, _, _, _ = self.sequence(list(stmt.seq))
            return tir.SeqStmt(stmts)
        if isinstance(stmt, tir.For):
            if stmt.kind == tir.ForKind.PARALLEL:
                return stmt  # per-element body: ordered as one statement by its neighbours
            stmts, head, tail, _ = self.sequence(_statements(stmt.body))
            # A body of one statement is not ordered against its own next iteration; a `Bind` that
            # reads no device memory (`i = tx + 64 * j` before the store) does not make it two.
            accessing = [st for st in stmts if not _is_barrier(st) and (not isinstance(st, tir.Bind) or self.accesses(st).reads)]
            if len(accessing) > 1 and conflicts(tail, head, self.analyzer):
                stmts.append(device_barrier())  # the next iteration's head reads what this tail wrote
            body = stmts[0] if len(stmts) == 1 else tir.SeqStmt(stmts)
            planned = tir.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations)
            if (self.thread.depends(stmt.min) or self.thread.depends(stmt.extent)) and _has_barrier(planned):
                return self.per_thread_loop(stmt)
            return planned
        if isinstance(stmt, tir.IfThenElse):
            then_case = self.visit(stmt.then_case)
            else_case = self.visit(stmt.else_case) if stmt.else_case is not None else None
            if self.thread.depends(stmt.condition) and (_has_barrier(then_case) or (else_case is not None and _has_barrier(else_case))):
                return split_at_barriers(stmt.condition, then_case, else_case)
            return tir.IfThenElse(stmt.condition, then_case, else_case)
        if isinstance(stmt, (tir.AttrStmt, tir.SBlockRealize)) or hasattr(stmt, "body"):
            return _with_body(stmt, self.visit(_body(stmt)))
        return stmt


    def per_thread_loop(self, loop: Any) -> Any:
        """A loop whose bounds differ between threads (a grid-stride `T.serial(start, stop, step)`)
        cannot hold a barrier: threads leave it after different numbers of iterations. It needs none
        when each device buffer it writes is accessed at one thread-dependent index expression (each
        thread keeps to its own elements); any other exchange is refused."""
        exchanged = exchanged_buffers(loop.body, self.thread, lambda buffer: buffer.data in self.device)
        if exchanged:
            raise MetalLoweringError(
                f"a loop whose range (from {loop.min}, {loop.extent} iterations) differs between threads exchanges device buffer "
                f"{', '.join(exchanged)} between threads, and no barrier may sit in such a loop. Loop over a range "
                f"every thread shares and guard the body per thread."
            )
        return loop


def _has_barrier(stmt: Any) -> bool:
    return any(_is_barrier(node) for node in find_nodes(stmt, [vocab.TIRX_EVALUATE]))


def _device_barrier_scope(stmt: Any) -> str | None:
    return "global" if _is_barrier(stmt) else None


def split_at_barriers(
    condition: Any,
    then_case: Any,
    else_case: Any,
    barrier_scope: Callable[[Any], str | None] = _device_barrier_scope,
    medium: str = "device memory",
) -> Any:
    """`if c: S1; barrier; S2 else: E1` with `c` different per thread, as `if c: S1 else: E1`
    `barrier` `if c: S2`: a barrier must be reached by every thread of the threadgroup, so it cannot
    stay inside a branch. The k-th barrier of each branch becomes the k-th barrier between the ifs;
    threads of the two branches were unordered before, and each keeps its own statements in order,
    so the split only adds ordering. The condition is evaluated again after each barrier, which is
    the same test only when neither branch writes what it reads (refused otherwise); likewise a value
    a branch binds before a barrier and uses after it is bound again after it (refused when the
    branches write what it reads). A barrier inside a loop or nested block of a branch is refused
    (no place every thread reaches). `barrier_scope` names the barriers to split at (their scope;
    None for other statements), `medium` what they order (for the errors)."""
    where = f"the block under `if {condition}` (a condition that differs between threads)"
    then_chunks, then_scopes = _chunks(then_case, where, barrier_scope, medium)
    else_chunks, else_scopes = _chunks(else_case, where, barrier_scope, medium) if else_case is not None else ([[]], [])
    branches = [then_case] if else_case is None else [then_case, else_case]
    read = {var for var in _vars(condition)}
    written = set().union(*(_written(branch) for branch in branches))
    if read & written:
        raise MetalLoweringError(
            f"{where} writes a buffer its condition reads and exchanges data between threads through {medium}: "
            f"the barrier it needs would have to re-test the condition. Compute the condition into a "
            f"T.alloc_var before the if."
        )
    then_chunks, else_chunks = (_rebind_crossing(chunks, written, where, medium) for chunks in (then_chunks, else_chunks))
    parts: list[Any] = []
    for k in range(max(len(then_chunks), len(else_chunks))):
        if k:  # the k-th barrier of either branch, the wider one where both have one
            scopes = {scopes[k - 1] for scopes in (then_scopes, else_scopes) if k - 1 < len(scopes)}
            parts.append(storage_sync("global" if "global" in scopes else min(scopes)))
        then_part = _seq(then_chunks[k]) if k < len(then_chunks) else None
        else_part = _seq(else_chunks[k]) if k < len(else_chunks) else None
        if then_part is not None:
            parts.append(tir.IfThenElse(condition, then_part, else_part))
        elif else_part is not None:
            parts.append(tir.IfThenElse(tir.Not(condition), else_part, None))
    return tir.SeqStmt(parts)


def _chunks(branch: Any, where: str, barrier_scope: Callable[[Any], str | None], medium: str) -> tuple[list[list[Any]], list[str]]:
    """The statements of a branch between its top-level barriers, and the barriers' scopes; a
    barrier nested deeper is refused."""
    chunks: list[list[Any]] = [[]]
    scopes: list[str] = []
    for stmt in _flat_statements(branch):
        scope = barrier_scope(stmt)
        if scope is not None:
            chunks.append([])
            scopes.append(scope)
        elif any(barrier_scope(node) is not None for node in find_nodes(stmt, [vocab.TIRX_EVALUATE])):
            raise MetalLoweringError(
                f"{where} exchanges data between threads through {medium} inside a loop or nested block, "
                f"where a barrier every thread reaches cannot be placed. Move the loop out of the if and guard "
                f"its body with the condition instead."
            )
        else:
            chunks[-1].append(stmt)
    return chunks, scopes


def _rebind_crossing(chunks: list[list[Any]], written: set[Any], where: str, medium: str) -> list[list[Any]]:
    """The pieces of a branch with every value bound in one piece and used in a later one bound
    again (as a fresh variable) at the start of that piece: once the pieces sit in separate ifs the
    first binding is out of scope. Evaluating the value again gives the same result only when it
    reads nothing the branches write and calls nothing with side effects; otherwise refused."""
    bound: list[Any] = []  # Bind statements of the earlier pieces, in order
    out: list[list[Any]] = []
    for chunk in chunks:
        used = set().union(*(_vars_in_stmt(stmt) for stmt in chunk)) if chunk else set()
        needed: set[Any] = set()
        for bind in reversed(bound):  # later bindings may use earlier ones: close over them
            if bind.var in used or bind.var in needed:
                needed.add(bind.var)
                used |= _vars_in_stmt(tir.Evaluate(bind.value))
        prefix: list[Any] = []
        fresh: dict[Any, Any] = {}
        for bind in bound:
            if bind.var not in needed:
                continue
            if not _reevaluable(bind.value, written):
                raise MetalLoweringError(
                    f"{where} binds {bind.var.name} before the barrier it needs ({medium}) and uses it after, and "
                    f"its value reads memory the branch writes, so it cannot be computed again after the barrier. "
                    f"Keep the value in a T.alloc_var declared before the if."
                )
            var = tir.Var(bind.var.name, bind.var.dtype)
            prefix.append(tir.Bind(var, tvm.tirx.stmt_functor.substitute(bind.value, fresh)))
            fresh[bind.var] = var
        out.append(prefix + [tvm.tirx.stmt_functor.substitute(stmt, fresh) for stmt in chunk] if fresh else chunk)
        bound += [stmt for stmt in chunk if isinstance(stmt, tir.Bind)]  # in scope for the rest of the branch
    return out


def _written(stmt: Any) -> set[Any]:
    """Data variables of the buffers `stmt` writes: by stores and by tile ops (T.copy, T.fill, ...)."""
    out = {node.buffer.data for node in find_nodes(stmt, [vocab.TIRX_BUFFERSTORE])}
    for call in find_nodes(stmt, [vocab.TIRX_CALL]):
        region = tile_op_region(call)
        if region is not None and region[1] & REGION_WRITE:
            out.add(region[0].data)
    return out


_NO_SIDE_EFFECT = (0, 1)  # TVM's CallEffectKind: kExprAnnotation, kPure


def _reevaluable(value: Any, written: set[Any]) -> bool:
    for node in find_nodes(tir.Evaluate(value), [vocab.TIRX_BUFFERLOAD, vocab.TIRX_CALL]):
        if isinstance(node, tir.BufferLoad):
            if node.buffer.data in written:
                return False
        elif not isinstance(node.op, tvm.ir.Op) or int(node.op.get_attr("TCallEffectKind") or 6) not in _NO_SIDE_EFFECT:
            return False
    return True


def _seq(stmts: list[Any]) -> Any:
    if not stmts:
        return None
    return stmts[0] if len(stmts) == 1 else tir.SeqStmt(stmts)


def _vars_in_stmt(stmt: Any) -> set[Any]:
    found: set[Any] = set()
    tvm.tirx.stmt_functor.post_order_visit(stmt, lambda node: found.add(node) if isinstance(node, tir.Var) else None)
    return found


def _vars(expr: Any) -> set[Any]:
    found: set[Any] = set()

    def visit(node: Any) -> None:
        if isinstance(node, tir.Var):
            found.add(node)
        elif isinstance(node, tir.BufferLoad):
            found.add(node.buffer.data)

    tvm.tirx.stmt_functor.post_order_visit(tir.Evaluate(expr), visit)
    return found


def _statements(stmt: Any) -> list[Any]:
    return list(stmt.seq) if isinstance(stmt, tir.SeqStmt) else [stmt]


def _flat_statements(stmt: Any) -> list[Any]:
    """The statements of nested sequences in order (a branch split inside a branch is one)."""
    if not isinstance(stmt, tir.SeqStmt):
        return [stmt]
    return [inner for item in stmt.seq for inner in _flat_statements(item)]


def _body(stmt: Any) -> Any:
    if isinstance(stmt, tir.SBlockRealize):
        return stmt.block.body
    return stmt.body


def _with_body(stmt: Any, body: Any) -> Any:
    if isinstance(stmt, tir.SBlockRealize):
        block = stmt.block
        new_block = tir.SBlock(
            block.iter_vars, block.reads, block.writes, block.name_hint, body, block.init, block.alloc_buffers, block.match_buffers, block.annotations
        )
        return tir.SBlockRealize(stmt.iter_values, stmt.predicate, new_block)
    if isinstance(stmt, tir.AttrStmt):
        return tir.AttrStmt(stmt.node, stmt.attr_key, stmt.value, body)
    return stmt  # statements with bodies the planner does not rebuild (While, ...) stay as written


def sync_function(func: Any) -> Any:
    device = {buf.data for buf in func.buffer_map.values()}
    if not device:
        return func
    body = _Planner(device, ThreadDependence(func)).visit(func.body)
    return func.with_body(body)


SyncDeviceMemory = per_function_pass("tilelang_metal.SyncDeviceMemory", sync_function)
