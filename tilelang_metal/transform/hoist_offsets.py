"""Hoist the position-only part of every device / threadgroup address to the top of the kernel.

The terms of a flattened address that depend only on the threadgroup and thread position
(blockIdx, simdgroup id, lane, swizzled tile) are the same in every loop iteration: each distinct
one becomes a `Bind` in the kernel prelude (`__off0`, `__off1`, ...), so the hot loops read
`A + (__off0 + k_outer * 16 + 1024)` instead of recomputing the position part per access.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from .function_pass import per_function_pass
from ..core.ir_attrs import find_nodes
from .kernel_prelude import launch_vars, prelude_vars, prepend, rewrite_inside_launch, with_prelude_vars
from .simdgroup_indices import LANE_ID_ATTR, SIMDGROUP_ID_ATTR
from ..host import vocab

OFFSET_PREFIX = "__off"


def _terms(e: Any) -> list[Any]:
    if isinstance(e, tir.Add):
        return _terms(e.a) + _terms(e.b)
    return [e]


def _memory_vars(func: Any) -> set:
    """Data variables of device buffers (kernel parameters) and of threadgroup memory."""
    out = {p for p in func.params if str(p.dtype) == "handle"}
    for node in find_nodes(func.body, [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND]):
        if isinstance(node, tir.AllocBuffer):
            if str(node.buffer.scope()).startswith("shared"):
                out.add(node.buffer.data)
        elif str(node.var.dtype) == "handle":
            out.add(node.var)  # a typed view into a merged threadgroup pool
    return out


class _Hoister:
    def __init__(self, positions: set):
        self.positions = positions
        self.binds: list[Any] = []
        self.known: dict[int, Any] = {}  # structural hash -> [(expr, var)]
        self._only: dict[Any, bool] = {}

    def position_only(self, e: Any) -> bool:
        if isinstance(e, (tir.IntImm, tir.FloatImm)):
            return False
        hit = self._only.get(e)
        if hit is None:
            free = tvm.tirx.analysis.undefined_vars(e, [])
            hit = bool(free) and all(v in self.positions for v in free)
            self._only[e] = hit
        return hit

    def var_for(self, e: Any) -> Any:
        key = tvm.ir.structural_hash(e)
        for expr, var in self.known.get(key, []):
            if tvm.ir.structural_equal(expr, e):
                return var
        var = tir.Var(f"{OFFSET_PREFIX}{len(self.binds)}", e.dtype)
        self.binds.append(tir.Bind(var, e))
        self.known.setdefault(key, []).append((e, var))
        return var

    def index(self, index: Any) -> Any:
        if isinstance(index, tir.Ramp):
            base = self.index(index.base)
            return index if base.same_as(index.base) else tir.Ramp(base, index.stride, index.lanes)
        terms = _terms(index)
        fixed = [t for t in terms if self.position_only(t)]
        if not fixed or (len(terms) == 1 and isinstance(terms[0], tir.Var)):
            return index
        part = fixed[0]
        for t in fixed[1:]:
            part = part + t
        out = self.var_for(part)
        for t in terms:
            if not any(t.same_as(f) for f in fixed):
                out = tir.Add(out, t)
        return out


def hoist_function(func: Any) -> Any:
    known = prelude_vars(func)
    memory = _memory_vars(func)
    hoisters: list[_Hoister] = []

    def hoist_inner(chain: list[Any], inner: Any) -> Any:
        positions = set(launch_vars(chain)) | set(known)
        for attr in (SIMDGROUP_ID_ATTR, LANE_ID_ATTR):
            if func.attrs is not None and attr in func.attrs:
                positions.add(func.attrs[attr])
        hoister = _Hoister(positions)
        hoisters.append(hoister)

        def rewrite(node: Any) -> Any:
            if isinstance(node, tir.BufferLoad) and node.buffer.data in memory and len(node.indices) == 1:
                index = hoister.index(node.indices[0])
                return None if index.same_as(node.indices[0]) else tir.BufferLoad(node.buffer, [index])
            if isinstance(node, tir.BufferStore) and node.buffer.data in memory and len(node.indices) == 1:
                index = hoister.index(node.indices[0])
                return None if index.same_as(node.indices[0]) else tir.BufferStore(node.buffer, node.value, [index])
            if isinstance(node, tir.Call) and str(node.op.name) == vocab.TIRX_TVM_ACCESS_PTR and node.args[1] in memory:
                args = list(node.args)
                args[2] = hoister.index(args[2])
                return tir.Call(node.dtype, node.op, args)
            return None

        inner = tvm.tirx.stmt_functor.ir_transform(inner, None, rewrite, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE, vocab.TIRX_CALL])
        return prepend(inner, known, hoister.binds) if hoister.binds else inner

    body = rewrite_inside_launch(func.body, hoist_inner)
    new_vars = [bind.var for h in hoisters for bind in h.binds]
    if not new_vars:
        return func
    return with_prelude_vars(func.with_body(body), new_vars)


HoistPositionOffsets = per_function_pass("tilelang_metal.HoistPositionOffsets", hoist_function, kernels_only=True)
