"""Per-iteration tile pointers into read-only device buffers (the spec 1.4 `__src` source shape).

In a loop whose body reads a read-only device buffer at several offsets that differ only by a
constant (`A + (__off0 + k_outer * 16 + 1024)`, `A + (__off0 + k_outer * 16 + 2048)`, ...), the
common part is bound once at the top of the body to a tile pointer,
`const device half* __src = (A + (__off0 + (k_outer * 16)));`, and the loads read
`*(const device half4*)(__src + 1024)`: base + tile offset + simdgroup offset + K induction,
computed once per K step. The loads are the same elements; only the address arithmetic moves.
Runs in the codegen stage after the position offsets are hoisted.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from ..host import vocab

POINTER_NAME = "__src"


def _terms(e: Any) -> list[Any]:
    if isinstance(e, tir.Add):
        return _terms(e.a) + _terms(e.b)
    return [e]


def _split(index: Any) -> tuple[Any, int] | None:
    """(non-constant part, constant part) of a flat element offset; None when it is all constant."""
    base = index.base if isinstance(index, tir.Ramp) else index
    rest, const = [], 0
    for t in _terms(base):
        if isinstance(t, tir.IntImm):
            const += int(t.value)
        else:
            rest.append(t)
    if not rest:
        return None
    total = rest[0]
    for t in rest[1:]:
        total = total + t
    return total, const


def _uses(e: Any, var: Any) -> bool:
    return any(v.same_as(var) for v in tvm.tirx.analysis.undefined_vars(e, []))


class _Pointers:
    def __init__(self, readonly: set):
        self.readonly = readonly

    def loop(self, loop: Any) -> Any | None:
        """The loop with tile pointers bound at the top of its body, or None when none applies."""
        groups: dict[tuple[Any, int], list[Any]] = {}  # (buffer var, structural hash of the common part)
        for load in find_nodes(loop.body, [vocab.TIRX_BUFFERLOAD]):
            var = load.buffer.data
            if var not in self.readonly or len(load.indices) != 1:
                continue
            split = _split(load.indices[0])
            if split is None or not _uses(split[0], loop.loop_var):
                continue
            groups.setdefault((var, tvm.ir.structural_hash(split[0])), []).append((load, split))
        binds, replace = [], {}
        for (var, _), members in groups.items():
            common = members[0][1][0]
            members = [(ld, sp) for ld, sp in members if tvm.ir.structural_equal(sp[0], common)]
            if len({id(ld) for ld, _ in members}) < 2:
                continue
            buf = members[0][0].buffer
            pointer = tir.Var(POINTER_NAME, tvm.ir.PointerType(tvm.ir.PrimType(str(buf.dtype)), "global"))
            view = tir.decl_buffer(buf.shape, buf.dtype, name=POINTER_NAME, data=pointer)
            binds.append(tir.Bind(pointer, tir.call_intrin("handle", vocab.TIRX_ADDRESS_OF, tir.BufferLoad(buf, [common]))))
            for load, (_, const) in members:
                index = load.indices[0]
                offset = tir.const(const, index.dtype if not isinstance(index, tir.Ramp) else index.base.dtype)
                new_index = tir.Ramp(offset, index.stride, index.lanes) if isinstance(index, tir.Ramp) else offset
                replace[load] = tir.BufferLoad(view, [new_index])
        if not binds:
            return None

        def swap(node: Any) -> Any:
            return replace.get(node)

        body = tvm.tirx.stmt_functor.ir_transform(loop.body, None, swap, [vocab.TIRX_BUFFERLOAD])
        body = tir.SeqStmt([*binds, body])
        return tir.For(loop.loop_var, loop.min, loop.extent, loop.kind, body, loop.thread_binding, loop.annotations)


def rewrite_function(func: Any) -> Any:
    attrs = func.attrs or {}
    readonly_index = {int(i) for i in attrs.get(vocab.READONLY_PARAMS_ATTR, [])}
    readonly = {p for i, p in enumerate(func.params) if i in readonly_index and str(p.dtype) == "handle"}
    if not readonly:
        return func
    pointers = _Pointers(readonly)

    def post(node: Any) -> Any:
        if node.kind != tir.ForKind.SERIAL or find_nodes(node.body, [vocab.TIRX_FOR]):
            return None  # innermost serial loops only (the K loop of a GEMM)
        return pointers.loop(node)

    body = tvm.tirx.stmt_functor.ir_transform(func.body, None, post, [vocab.TIRX_FOR])
    return func if body.same_as(func.body) else func.with_body(body)


UseTilePointers = per_function_pass("tilelang_metal.UseTilePointers", rewrite_function, kernels_only=True)
