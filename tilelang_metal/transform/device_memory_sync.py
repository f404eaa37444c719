"""Order device-memory accesses that threads of one threadgroup exchange: `mem_device` barriers.

TileLang statements at tile level (a `T.Parallel` loop, a `T.gemm`, a `T.copy`) each distribute
their elements over the threads in their own way. When one statement writes a device buffer and a
later one reads or writes the same buffer (or reads it first and writes it later), an element may
pass from one thread to another through device memory: without a barrier the second statement can
read a stale value (a `T.gemm(..., clear_accum=False)` accumulating into a C that a `T.Parallel`
just initialised). tilelang's ThreadSync orders threadgroup memory only (it skips the global scope),
so this pass inserts `tvm_storage_sync("global")` (printed as
`threadgroup_barrier(mem_flags::mem_device)`) between such statements, and at the end of a loop
body whose tail conflicts with its head (the next iteration).

Runs at tile level, before layout inference, on statement sequences outside `T.Parallel` loops
(whose bodies run per element, not per statement). Conservative: two statements touching the same
device buffer are ordered even when every thread happens to touch only its own elements; the
cost is one barrier, the alternative a silent race. Ordering across threadgroups is not possible
with barriers and is the race checker's business.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._host import REGION_READ, REGION_WRITE, tile_op_region, tir
from .function_pass import per_function_pass
from .ir_query import find_nodes


def device_barrier() -> Any:
    return tir.Evaluate(tir.call_intrin("int32", "tirx.tvm_storage_sync", tir.StringImm("global")))


@dataclass
class _Accesses:
    reads: set = field(default_factory=set)
    writes: set = field(default_factory=set)

    def conflicts(self, later: _Accesses) -> bool:
        return bool(self.writes & (later.reads | later.writes)) or bool(self.reads & later.writes)

    def add(self, other: _Accesses) -> None:
        self.reads |= other.reads
        self.writes |= other.writes


def _is_barrier(stmt: Any) -> bool:
    if not isinstance(stmt, tir.Evaluate) or not isinstance(stmt.value, tir.Call):
        return False
    call = stmt.value
    return str(call.op.name) == "tirx.tvm_storage_sync" and str(call.args[0].value) == "global"


class _Planner:
    def __init__(self, device: set):
        self.device = device

    def accesses(self, stmt: Any) -> _Accesses:
        out = _Accesses()
        for node in find_nodes(stmt, ["tirx.BufferLoad", "tirx.BufferStore", "tirx.Call"]):
            if isinstance(node, tir.Call):
                region = tile_op_region(node)
                if region is None or region[0].data not in self.device:
                    continue
                if region[1] & REGION_READ:
                    out.reads.add(region[0].data)
                if region[1] & REGION_WRITE:
                    out.writes.add(region[0].data)
            elif node.buffer.data in self.device:
                (out.writes if isinstance(node, tir.BufferStore) else out.reads).add(node.buffer.data)
        return out

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
            if pending.conflicts(acc):
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
            if len(stmts) > 1 and tail.conflicts(head):
                stmts.append(device_barrier())  # the next iteration's head reads what this tail wrote
            body = stmts[0] if len(stmts) == 1 else tir.SeqStmt(stmts)
            return tir.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding, stmt.annotations)
        if isinstance(stmt, tir.IfThenElse):
            then_case = self.visit(stmt.then_case)
            else_case = self.visit(stmt.else_case) if stmt.else_case is not None else None
            return tir.IfThenElse(stmt.condition, then_case, else_case)
        if isinstance(stmt, (tir.AttrStmt, tir.SBlockRealize)) or hasattr(stmt, "body"):
            return _with_body(stmt, self.visit(_body(stmt)))
        return stmt


def _statements(stmt: Any) -> list[Any]:
    return list(stmt.seq) if isinstance(stmt, tir.SeqStmt) else [stmt]


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
    body = _Planner(device).visit(func.body)
    return func.with_body(body)


SyncDeviceMemory = per_function_pass("tilelang_metal.SyncDeviceMemory", sync_function)
