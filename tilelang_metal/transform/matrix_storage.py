"""Decide which per-thread arrays live in matrix objects, and record it on the function.

GemmMetal hands the printer flat per-thread arrays in the instruction's lane layout:
- an array used as the destination of `tlm_ct_mma` becomes destination cooperative tensors, one per
  fragment, when every access to it has a constant index (the whole K loop then keeps C inside the
  MPP destinations and no thread array exists: "elided"); otherwise it stays an array and each run
  copies its chunk in and out;
- an array used by the simdgroup builtins becomes an array of `simdgroup_matrix<T, 8, 8>` (always
  possible: simdgroup matrices may form arrays).

Each decision names its instruction (`isa.REGISTRY`): a `tlm_ct_mma` call carries it, the simdgroup
builtins carry their matrix shape (8x8, the only one MSL has).

The decision is stored as the function attribute `MATRIX_STORAGE_ATTR` (data var -> encoded
`MatrixStorage`), so the printer only reads it.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir
from ..core.ir_attrs import COOPERATIVE_TENSOR_STORAGE, MATRIX_STORAGE_ATTR, SIMDGROUP_MATRIX_STORAGE, MatrixStorage, find_nodes
from ..target.isa import REGISTRY, MatrixInstruction
from .function_pass import per_function_pass
from ..host import vocab


def _constant_index(index: Any) -> bool:
    if isinstance(index, tir.IntImm):
        return True
    return isinstance(index, tir.Ramp) and isinstance(index.base, tir.IntImm)


def _element_count(buf: Any) -> int:
    count = 1
    for dim in buf.shape:
        count *= int(dim)
    return count


def decide(body: Any) -> dict[Any, MatrixStorage]:
    allocs: dict[Any, Any] = {}
    cooperative: dict[Any, intrinsics.CooperativeMma] = {}
    keys: dict[Any, set] = {}  # accumulator -> the instruction keys (transposes) of its mmas
    simdgroup: set = set()
    sg_shapes: dict[Any, tuple[int, int]] = {}
    accesses = []
    for node in find_nodes(body, [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_CALL, vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE]):
        if isinstance(node, tir.AllocBuffer):
            allocs[node.buffer.data] = node.buffer
        elif isinstance(node, (tir.BufferLoad, tir.BufferStore)):
            accesses.append(node)
        else:
            mma = intrinsics.match_ct_mma(node)
            if mma is not None:
                cooperative.setdefault(mma.c, mma)
                keys.setdefault(mma.c, set()).add(mma.instruction.key)
            simdgroup.update(intrinsics.simdgroup_matrix_operands(node))
            shape = intrinsics.sg_shape(node)
            if shape is not None:
                sg_shapes.setdefault(node.args[0], shape)
    decisions: dict[Any, MatrixStorage] = {}
    for var in simdgroup:
        buf = allocs[var]
        inst = REGISTRY.simdgroup_matrix(*sg_shapes.get(var, ()))
        # a `metal.simdgroup` buffer stores whole tiles (tilelang's convention); a thread array
        # in lane layout holds the instruction's elements per lane for each matrix
        per_matrix = inst.m * inst.n if str(buf.scope()) == "metal.simdgroup" else inst.dest_elems
        decisions[var] = MatrixStorage(SIMDGROUP_MATRIX_STORAGE, max(1, _element_count(buf) // per_matrix), instruction_name=inst.name)
    non_constant = {node.buffer.data for node in accesses if not all(_constant_index(i) for i in node.indices)}
    for var, mma in cooperative.items():
        inst = mma.instruction
        decisions[var] = MatrixStorage(
            COOPERATIVE_TENSOR_STORAGE,
            _element_count(allocs[var]) // inst.dest_elems,
            # one destination tensor type per accumulator: mmas of different transposes copy in and out
            elided=var not in non_constant and len(keys[var]) == 1,
            a_dtype=str(allocs[mma.a].dtype),
            b_dtype=str(allocs[mma.b].dtype),
            instruction_name=inst.key,
        )
    return decisions


def record_function(func: Any) -> Any:
    decisions = decide(func.body)
    if not decisions:
        return func
    return func.with_attr(MATRIX_STORAGE_ATTR, {var: d.encode() for var, d in decisions.items()})


RecordMatrixStorage = per_function_pass("tilelang_metal.RecordMatrixStorage", record_function, kernels_only=True)
