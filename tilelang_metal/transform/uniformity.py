"""Which expressions may differ between the threads of one threadgroup.

A barrier may only sit in control flow that every thread of the threadgroup takes alike. The plugin's
barrier passes ask this module whether a condition or a loop extent depends on the thread index: on a
`threadIdx.*` variable, directly or through `Bind` variables defined from one, or through a
thread-private buffer (`local` scope) that is written from one. Loads of device or threadgroup
memory at thread-independent indices count as uniform (every thread reads the same element).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..host import REGION_WRITE, tile_op_region, tir, tvm, vocab
from ..core.ir_attrs import find_nodes

_THREAD_TAG_PREFIX = "threadIdx"


def _vars_in(node: Any) -> set[Any]:
    found: set[Any] = set()

    def visit(n: Any) -> None:
        if isinstance(n, tir.Var):
            found.add(n)
        elif isinstance(n, (tir.BufferLoad, tir.BufferStore)):
            found.add(n.buffer.data)

    tvm.tirx.stmt_functor.post_order_visit(node if isinstance(node, tir.Stmt) else tir.Evaluate(node), visit)
    return found


class ThreadDependence:
    """The variables of one function whose value may differ per thread (a fixed point over its
    definitions: thread indices, binds of them, thread-private buffers stored from them)."""

    def __init__(self, func_or_stmt: Any):
        body = func_or_stmt.body if isinstance(func_or_stmt, tir.PrimFunc) else func_or_stmt
        self.vars: set[Any] = set()
        for attr in find_nodes(body, [vocab.TIRX_ATTRSTMT]):
            if str(attr.attr_key) == "thread_extent" and str(attr.node.thread_tag).startswith(_THREAD_TAG_PREFIX):
                self.vars.add(attr.node.var)
        definitions: list[tuple[Any, set[Any]]] = []
        for bind in find_nodes(body, [vocab.TIRX_BIND]):
            definitions.append((bind.var, _vars_in(bind.value)))
        for store in find_nodes(body, [vocab.TIRX_BUFFERSTORE]):
            if str(store.buffer.scope()).startswith("local"):
                definitions.append((store.buffer.data, _vars_in(store.value) | _index_vars(store)))
        changed = True
        while changed:
            changed = False
            for var, uses in definitions:
                if var not in self.vars and uses & self.vars:
                    self.vars.add(var)
                    changed = True

    def depends(self, expr: Any) -> bool:
        return bool(_vars_in(expr) & self.vars)


def _index_vars(store: Any) -> set[Any]:
    out: set[Any] = set()
    for index in store.indices:
        out |= _vars_in(index)
    return out


def exchanged_buffers(body: Any, thread: ThreadDependence, selects: Callable[[Any], bool]) -> list[str]:
    """Names of the buffers `selects` accepts that the body writes and that a thread may reach at
    another thread's element: through a tile op (distributed over the threads in its own way), at
    more than one index expression, or at one index that is the same for every thread. Control flow
    that differs between threads may touch only the others (no barrier can order them there)."""
    indices: dict[Any, list[Any]] = {}
    names: dict[Any, str] = {}
    written: set = set()
    tiled: set = set()
    for node in find_nodes(body, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE, vocab.TIRX_CALL]):
        if isinstance(node, tir.Call):
            region = tile_op_region(node)
            if region is not None and selects(region[0]):
                tiled.add(region[0].data)
                names[region[0].data] = region[0].name
                if region[1] & REGION_WRITE:
                    written.add(region[0].data)
        elif selects(node.buffer):
            indices.setdefault(node.buffer.data, []).append(node.indices)
            names[node.buffer.data] = node.buffer.name
            if isinstance(node, tir.BufferStore):
                written.add(node.buffer.data)
    shared = []
    for data in written:
        if data in tiled:
            shared.append(names[data])
            continue
        first, *rest = indices[data]
        private = all(thread.depends(i) for i in first) and all(
            len(other) == len(first) and all(tvm.ir.structural_equal(a, b) for a, b in zip(first, other)) for other in rest
        )
        if not private:
            shared.append(names[data])
    return sorted(shared)
