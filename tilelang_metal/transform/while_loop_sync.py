"""`SyncWhileLoops`: a threadgroup barrier at the end of a `while` body that both writes and reads
threadgroup memory.

tilelang's ThreadSync orders threadgroup memory inside a body and across the iterations of a `for`
loop, but not across the iterations of a `while` loop: a stream-K kernel whose `while` loop stages
each tile piece in threadgroup memory writes the next piece's tile while slower threads still read
the last one (the emulator's race checker reports it). The barrier goes at the end of the body
unless the body already ends with one; its cost is one barrier per `while` iteration. Conservative:
any threadgroup buffer written and read in the body counts, whether or not a thread would read
another thread's element.

A `while` whose condition differs between threads cannot hold a barrier (threads leave the loop after
different numbers of iterations). There the body gets none when each threadgroup buffer it writes is
accessed at one index expression that depends on the thread (each thread keeps to its own element);
any other exchange through threadgroup memory in such a loop is refused in one line.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..core.scopes import SHARED_SCOPES
from ..errors import MetalLoweringError
from .barriers import storage_sync, sync_scope
from .function_pass import per_function_pass
from .uniformity import ThreadDependence, exchanged_buffers
from ..host import vocab


def _threadgroup(buffer: Any) -> bool:
    return str(buffer.scope()) in SHARED_SCOPES


def _exchanges_through_threadgroup_memory(body: Any) -> bool:
    """Whether the body writes a threadgroup buffer and also reads it: through a load, or through any
    other use of its data pointer (the matrix loads take the pointer)."""
    written: set = set()
    used: set = set()

    def visit(node: Any) -> None:
        if isinstance(node, tir.BufferStore) and _threadgroup(node.buffer):
            written.add(node.buffer.data)
        elif isinstance(node, tir.BufferLoad) and _threadgroup(node.buffer):
            used.add(node.buffer.data)
        elif isinstance(node, tir.Var):
            used.add(node)

    tvm.tirx.stmt_functor.post_order_visit(body, visit)
    return bool(written & used)


def _ends_with_barrier(body: Any) -> bool:
    last = body.seq[-1] if isinstance(body, tir.SeqStmt) else body
    return sync_scope(last) in SHARED_SCOPES + ("global",)  # both order threadgroup memory


def sync_function(func: Any) -> Any:
    thread = ThreadDependence(func)

    def add_barrier(node: Any) -> Any:
        body = node.body
        if not _exchanges_through_threadgroup_memory(body) or _ends_with_barrier(body):
            return None
        if thread.depends(node.condition):
            exchanged = exchanged_buffers(body, thread, _threadgroup)
            if exchanged:
                raise MetalLoweringError(
                    f"a while loop whose condition ({node.condition}) differs between threads writes threadgroup "
                    f"buffer {', '.join(exchanged)} that other threads read, and no barrier may sit in such a loop. "
                    f"Loop while any thread has work (a uniform condition) and guard the body per thread."
                )
            return None
        return tir.While(node.condition, tir.SeqStmt([body, storage_sync("shared")]))

    return func.with_body(tvm.tirx.stmt_functor.ir_transform(func.body, None, add_barrier, [vocab.TIRX_WHILE]))


SyncWhileLoops = per_function_pass("tilelang_metal.SyncWhileLoops", sync_function)
