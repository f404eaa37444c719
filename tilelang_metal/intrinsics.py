"""The matrix vocabulary between the plugin's lowerings and its printer, defined once.

One vocabulary per operation:
- cooperative tensors: the plugin's own `tlm_ct_mma` extern call (TVM has no builtin for MPP);
- simdgroup matrices: TVM's builtins (`tirx.simdgroup_load/store`, `make_filled_simdgroup_matrix`,
  `simdgroup_multiply_accumulate`), which tilelang's own copies of `metal.simdgroup` buffers use too.

Every operand list is written here; lowering builds calls with `build_*`, passes and the printer
read them back with `match_*`, so an operand added to an intrinsic changes this module only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .host import tir
from .isa import REGISTRY, MatrixInstruction
from .host import vocab


@dataclass(frozen=True)
class CooperativeMma:
    """C chunk `c_chunk` += A[a_offset : +left] x B[b_offset : +right] on one MPP matmul2d.

    A, B and C are per-thread arrays in the instruction's lane layout; the call names the
    instruction (`isa.REGISTRY`)."""

    c: Any
    c_chunk: Any
    a: Any
    a_offset: Any
    b: Any
    b_offset: Any
    instruction: MatrixInstruction


CT_MMA = "tlm_ct_mma"
_EXTERN_OPS = (vocab.TIRX_CALL_EXTERN, vocab.TIRX_CALL_PURE_EXTERN)

SG_LOAD = vocab.TIRX_SIMDGROUP_LOAD
SG_STORE = vocab.TIRX_SIMDGROUP_STORE
SG_FILL = vocab.TIRX_MAKE_FILLED_SIMDGROUP_MATRIX
SG_MMA = vocab.TIRX_SIMDGROUP_MULTIPLY_ACCUMULATE
SIMDGROUP_OPS = (SG_LOAD, SG_STORE, SG_FILL, SG_MMA)


def op_name(call: Any) -> str:
    return str(getattr(call.op, "name", ""))


def build_ct_mma(inst: MatrixInstruction, c: Any, c_chunk: Any, a: Any, a_offset: Any, b: Any, b_offset: Any) -> Any:
    return tir.Evaluate(tir.call_extern("handle", CT_MMA, c, c_chunk, a, a_offset, b, b_offset, inst.name))


def match_ct_mma(call: Any) -> CooperativeMma | None:
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS or str(call.args[0].value) != CT_MMA:
        return None
    c, c_chunk, a, a_offset, b, b_offset, name = call.args[1:]
    return CooperativeMma(c, c_chunk, a, a_offset, b, b_offset, REGISTRY.named(str(name.value)))


# simdgroup_matrix<T, rows, cols> operations: `matrix` is an array of matrices, `index` selects one.
# TVM's builtins carry the matrix shape on loads, stores and fills (not on the multiply).
def build_sg_load(matrix: Any, index: Any, address: Any, stride: Any, transpose: bool, rows: int, cols: int) -> Any:
    return tir.Evaluate(tir.call_intrin("handle", SG_LOAD, matrix, index, address, stride, rows, cols, tir.const(transpose, "bool")))


def build_sg_store(matrix: Any, index: Any, address: Any, stride: Any, rows: int, cols: int) -> Any:
    return tir.Evaluate(tir.call_intrin("handle", SG_STORE, matrix, index, address, stride, rows, cols, tir.const(False, "bool")))


def build_sg_fill(matrix: Any, index: Any, value: Any, rows: int, cols: int) -> Any:
    """Matrix `index` of `matrix` := every element `value` (make_filled_simdgroup_matrix)."""
    return tir.Evaluate(tir.call_intrin("handle", SG_FILL, matrix, index, value, rows, cols))


def sg_shape(call: Any) -> tuple[int, int] | None:
    """(rows, cols) a simdgroup load, store or fill names (None for other calls)."""
    name = op_name(call)
    if name in (SG_LOAD, SG_STORE):
        return int(call.args[4]), int(call.args[5])
    if name == SG_FILL:
        return int(call.args[3]), int(call.args[4])
    return None


def build_sg_mma(c: Any, c_index: Any, a: Any, a_index: Any, b: Any, b_index: Any) -> Any:
    """C[c_index] += A[a_index] x B[b_index]."""
    return tir.Evaluate(tir.call_intrin("handle", SG_MMA, c, c_index, a, a_index, b, b_index, c, c_index))


def simdgroup_matrix_operands(call: Any) -> list[Any]:
    """The matrix-array variables a simdgroup builtin touches (empty for other calls)."""
    name = op_name(call)
    if name == SG_MMA:
        return [call.args[0], call.args[2], call.args[4], call.args[6]]
    if name in (SG_LOAD, SG_STORE, SG_FILL):
        return [call.args[0]]
    return []


def mma_accumulator(call: Any) -> Any | None:
    """The accumulator variable of a matrix multiply-accumulate call of either vocabulary."""
    ct = match_ct_mma(call)
    if ct is not None:
        return ct.c
    if isinstance(call, tir.Call) and op_name(call) == SG_MMA:
        return call.args[0]
    return None
