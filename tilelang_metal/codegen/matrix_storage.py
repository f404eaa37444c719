"""Which thread arrays the printer turns into matrix objects (storage elision).

GemmMetal hands the printer flat per-thread arrays in the instruction's lane layout:
- an array used as the destination of `tlm_ct_mma` becomes destination cooperative tensors, one
  per 16-element chunk, when every access to it has a constant index (the whole K loop then keeps
  C inside the MPP destinations and no thread array exists); otherwise it stays an array and each
  run copies its chunk in and out;
- an array used by `tlm_sg_*` becomes an array of `simdgroup_matrix<T, 8, 8>`, element `2f + e`
  being `thread_elements()[e]` of matrix `f` (always possible: simdgroup matrices may form arrays).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .._host import tir
from ..transform.ir_query import find_nodes
from ..gemm.lane_layout import CT_DEST_ELEMS, SG_ELEMS_PER_LANE
from ..gemm.tir_build import CT_MMA, SG_LOAD, SG_MMA, SG_STORE


@dataclass
class AllocInfo:
    dtype: str
    count: int
    scope: str


@dataclass
class CooperativeAccumulator:
    count: int
    a_dtype: str
    b_dtype: str
    elided: bool = True

    @property
    def chunks(self) -> int:
        return self.count // CT_DEST_ELEMS


@dataclass
class MatrixStorage:
    allocs: dict[Any, AllocInfo] = field(default_factory=dict)
    cooperative: dict[Any, CooperativeAccumulator] = field(default_factory=dict)
    simdgroup: set = field(default_factory=set)

    @property
    def uses_cooperative_tensors(self) -> bool:
        return bool(self.cooperative)


def _extern_name(call: Any) -> str | None:
    if not isinstance(call, tir.Call) or getattr(call.op, "name", "") not in ("tirx.call_extern", "tirx.call_pure_extern"):
        return None
    return str(call.args[0].value)


def _constant_index(index: Any) -> bool:
    if isinstance(index, tir.IntImm):
        return True
    return isinstance(index, tir.Ramp) and isinstance(index.base, tir.IntImm)


def analyze(body: Any) -> MatrixStorage:
    storage = MatrixStorage()
    mma_operands: list[tuple[Any, Any, Any]] = []
    accesses = []
    for node in find_nodes(body, ["tirx.AllocBuffer", "tirx.Call", "tirx.BufferLoad", "tirx.BufferStore"]):
        if isinstance(node, tir.AllocBuffer):
            buf = node.buffer
            count = 1
            for dim in buf.shape:
                count *= int(dim)
            storage.allocs[buf.data] = AllocInfo(str(buf.dtype), count, str(buf.scope()))
        elif isinstance(node, (tir.BufferLoad, tir.BufferStore)):
            accesses.append(node)
        else:
            name = _extern_name(node)
            if name == CT_MMA:
                mma_operands.append((node.args[1], node.args[3], node.args[5]))
            elif name == SG_MMA:
                storage.simdgroup.update([node.args[1], node.args[3], node.args[5]])
            elif name in (SG_LOAD, SG_STORE):
                storage.simdgroup.add(node.args[1])
            elif getattr(node.op, "name", "") in TVM_SIMDGROUP_BUILTINS:
                # tilelang's own lowering of copies/fills of `metal.simdgroup` buffers
                storage.simdgroup.update(a for a in node.args if isinstance(a, tir.Var) and a.dtype == "handle")
    for c, a, b in mma_operands:
        if c not in storage.cooperative:
            storage.cooperative[c] = CooperativeAccumulator(storage.allocs[c].count, storage.allocs[a].dtype, storage.allocs[b].dtype)
    if storage.cooperative:
        for node in accesses:
            acc = storage.cooperative.get(node.buffer.data)
            if acc is not None and not all(_constant_index(i) for i in node.indices):
                acc.elided = False
    return storage


TVM_SIMDGROUP_BUILTINS = (
    "tirx.simdgroup_load",
    "tirx.simdgroup_store",
    "tirx.make_filled_simdgroup_matrix",
    "tirx.simdgroup_multiply_accumulate",
)


def sg_count(info: AllocInfo) -> int:
    """Matrices in a simdgroup array: a `metal.simdgroup` buffer stores whole 8x8 tiles (64 elements
    each, tilelang's convention); a thread array in lane layout holds 2 elements per matrix."""
    if info.scope == "metal.simdgroup":
        return max(1, info.count // 64)
    return info.count // SG_ELEMS_PER_LANE
