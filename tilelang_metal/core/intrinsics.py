"""The plugin's intrinsics between its passes and its printer, defined once.

Matrix operations, one vocabulary per operation:
- cooperative tensors: the plugin's own `tlm_ct_mma` extern call (TVM has no builtin for MPP);
- simdgroup matrices: TVM's builtins (`tirx.simdgroup_load/store`, `make_filled_simdgroup_matrix`,
  `simdgroup_multiply_accumulate`), which tilelang's own copies of `metal.simdgroup` buffers use too.

Every operand list is written here; lowering builds calls with `build_*`, passes and the printer
read them back with `match_*`, so an operand added to an intrinsic changes this module only.

The late MSL legalization (`legalize/`) adds: `tlm_copy16` (a 16-byte move between two ends it
proved 16-byte aligned, one `uint4` load and store; `tlm_packed_copy16` at element alignment),
Metal's simdgroup shuffles and lane-wise `select` (CUDA-width shuffles), and `tlm_atomic` (an
element atomic in the Metal form chosen for it).
GEMM lowering adds `tlm_packed_load` / `tlm_packed_store` (vectors at element alignment) and their
aligned flavour for edge tiles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..host import tir
from ..target.isa import REGISTRY, MatrixInstruction
from ..host import vocab


@dataclass(frozen=True)
class CooperativeMma:
    """C chunk `c_chunk` += A[a_offset : +left] x B[b_offset : +right] on one MPP matmul2d.

    A, B and C are per-thread arrays in the instruction's lane layout; the call names the
    instruction by its key (`isa.REGISTRY.resolve`: a registered instruction or its transposed variant)."""

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
    return tir.Evaluate(tir.call_extern("handle", CT_MMA, c, c_chunk, a, a_offset, b, b_offset, inst.key))


def match_ct_mma(call: Any) -> CooperativeMma | None:
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS or str(call.args[0].value) != CT_MMA:
        return None
    c, c_chunk, a, a_offset, b, b_offset, name = call.args[1:]
    return CooperativeMma(c, c_chunk, a, a_offset, b, b_offset, REGISTRY.resolve(str(name.value)))


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


# ---------------------------------------------------------------- 16-byte copies
# The packed flavour `tlm_packed_copy16` moves 16 bytes between ends aligned to their element only
# (a row pitch of 4097 halves): legalize.UseWideCopies makes it of an element loop over 16 bytes
# (kernels/gemm.py's `copy_runs`), after the barriers are planned on the plain loads and stores;
# printed as a copy of a 16-byte struct of elements.
COPY16 = "tlm_copy16"
PACKED_COPY16 = "tlm_packed_copy16"


@dataclass(frozen=True)
class Copy16:
    """dst[dst_offset : +16 bytes] = src[src_offset : +16 bytes]; both ends proved 16-byte aligned
    (`aligned`), or element-aligned only. dst and src are the buffers' data Vars; offsets count
    elements of `dtype`, the element type of both ends."""

    dst: Any
    dst_offset: Any
    src: Any
    src_offset: Any
    dtype: str
    aligned: bool = True


def build_copy16(dst: Any, dst_offset: Any, src: Any, src_offset: Any, *, aligned: bool = True) -> Any:
    dst_at = tir.address_of(tir.BufferLoad(dst, [dst_offset]))
    src_at = tir.address_of(tir.BufferLoad(src, [src_offset]))
    return tir.Evaluate(tir.call_extern("handle", COPY16 if aligned else PACKED_COPY16, dst_at, src_at))


def _address(address: Any, what: str) -> tuple[Any, Any, str]:
    """(data Var, element offset, element dtype) of a `tvm_access_ptr` or an `address_of` element."""
    if op_name(address) == vocab.TIRX_TVM_ACCESS_PTR:
        return address.args[1], address.args[2], str(address.args[0].dtype)
    if op_name(address) == vocab.TIRX_ADDRESS_OF:  # built so, or rebased on a tile pointer (transform/tile_pointers.py)
        element = address.args[0]
        return element.buffer.data, element.indices[-1], str(element.buffer.dtype)
    raise ValueError(f"{what}: the address must stay a tvm_access_ptr or an address_of, got {address}")


def match_copy16(call: Any) -> Copy16 | None:
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS:
        return None
    name = str(call.args[0].value)
    if name not in (COPY16, PACKED_COPY16):
        return None
    dst, dst_offset, dtype = _address(call.args[1], name)
    src, src_offset, src_dtype = _address(call.args[2], name)
    if src_dtype != dtype:
        raise ValueError(f"{name}: both ends must have one element type, got {dtype} and {src_dtype}")
    return Copy16(dst, dst_offset, src, src_offset, dtype, aligned=name == COPY16)


# ---------------------------------------------------------------- packed vector accesses
# A vector access whose first element is only element-aligned (a row pitch of 4097 halves): MSL's
# packed_T2 / T3 / T4 types, which carry the element's alignment. Lowering builds them where it
# proved the lanes contiguous and inside the buffer but not the vector alignment; the address is a
# `tvm_access_ptr` (read or write intent visible to passes, flattened with the buffer), or the
# `address_of` a tile pointer's rebasing makes of it.
# The same calls in an aligned flavour (`tlm_aligned_load` / `tlm_aligned_store`: a plain `half4`
# access) serve edge tiles, where one branch per group holds the run inside the buffer: a call, unlike a
# vector BufferLoad, is not guarded a second time by LegalizeSafeMemoryAccess.
PACKED_LOAD = "tlm_packed_load"
PACKED_STORE = "tlm_packed_store"
ALIGNED_LOAD = "tlm_aligned_load"
ALIGNED_STORE = "tlm_aligned_store"
_LOADS = (PACKED_LOAD, ALIGNED_LOAD)
_ACCESS_CALLS = (PACKED_LOAD, PACKED_STORE, ALIGNED_LOAD, ALIGNED_STORE)
# Element types whose packed vectors MSL has always had; bfloat keeps element accesses (the plugin does not
# rely on a packed bfloat type).
PACKED_ELEMENTS = frozenset({"float16", "float32", "int8", "uint8", "int16", "uint16", "int32", "uint32"})


@dataclass(frozen=True)
class PackedAccess:
    """The vector (`dtype`: its element type and lanes) at element `offset` of `data`, loaded
    (value None) or stored (value)."""

    data: Any  # the buffer's data Var
    offset: Any
    dtype: str  # the vector's dtype, e.g. float16x4
    value: Any = None
    aligned: bool = False  # the offset is a multiple of the lanes: a plain vector access


def packable(dtype: str, lanes: int) -> bool:
    return 2 <= lanes <= 4 and dtype in PACKED_ELEMENTS


def build_packed_load(address: Any, dtype: str, *, aligned: bool = False) -> Any:
    """The vector at `address` (a tvm_access_ptr with read intent) as a `dtype` value."""
    return tir.call_extern(dtype, ALIGNED_LOAD if aligned else PACKED_LOAD, address)


def build_packed_store(address: Any, value: Any, *, aligned: bool = False) -> Any:
    """Store the vector `value` at `address` (a tvm_access_ptr with write intent)."""
    return tir.Evaluate(tir.call_extern("handle", ALIGNED_STORE if aligned else PACKED_STORE, address, value))


def match_packed(call: Any) -> PackedAccess | None:
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS:
        return None
    name = str(call.args[0].value)
    if name not in _ACCESS_CALLS:
        return None
    data, offset, _ = _address(call.args[1], name)
    aligned = name in (ALIGNED_LOAD, ALIGNED_STORE)
    if name in _LOADS:
        return PackedAccess(data, offset, str(call.dtype), aligned=aligned)
    value = call.args[2]
    return PackedAccess(data, offset, str(value.dtype), value, aligned=aligned)


# ---------------------------------------------------------------- simdgroup shuffles
# Metal's whole-simdgroup shuffles, by kind, and its lane-wise select: what legalize/segmented_shuffles.py
# writes CUDA-width shuffles as. Printed by name as ordinary calls; the shuffle's lane operand is a ushort.
SIMD_SHUFFLES = {"xor": "simd_shuffle_xor", "down": "simd_shuffle_down", "up": "simd_shuffle_up", "index": "simd_shuffle"}
SELECT = "select"  # MSL select(if_false, if_true, condition): both operands evaluated, unlike `?:`


def build_simd_shuffle(kind: str, value: Any, lane_operand: Any) -> Any:
    """`simd_shuffle_<kind>(value, (ushort)lane_operand)` over the whole simdgroup."""
    return tir.call_extern(value.dtype, SIMD_SHUFFLES[kind], value, tir.Cast("uint16", lane_operand))


def match_simd_shuffle(call: Any) -> tuple[str, Any, Any] | None:
    """(kind, value, lane operand) of a call `build_simd_shuffle` made, or None."""
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS:
        return None
    name = str(call.args[0].value)
    kind = next((k for k, n in SIMD_SHUFFLES.items() if n == name), None)
    return None if kind is None else (kind, call.args[1], call.args[2].value)


def build_select(condition: Any, if_true: Any, if_false: Any) -> Any:
    """`condition ? if_true : if_false` with both operands evaluated by every thread (a simd collective
    inside either must be reached by the whole simdgroup)."""
    return tir.call_extern(if_true.dtype, SELECT, if_false, if_true, condition)


def match_select(call: Any) -> tuple[Any, Any, Any] | None:
    """(condition, if_true, if_false) of a call `build_select` made, or None."""
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS or str(call.args[0].value) != SELECT:
        return None
    if_false, if_true, condition = call.args[1:]
    return condition, if_true, if_false


# ---------------------------------------------------------------- element atomics
# legalize/element_atomics.py writes every TileLang element atomic as one of these, the form chosen and the
# 32-bit word of a 16-bit element computed in TIR; the printer spells each as one MSL call.
ATOMIC = "tlm_atomic"
NATIVE = "native"  # atomic_fetch_<kind>_explicit on atomic_int / atomic_uint / atomic_float
CAS_FLOAT = "cas_float"  # float32 max / min: a compare-and-swap loop on the float's bits
CAS_HALF = "cas_half"  # a 16-bit float element inside its 32-bit word (select: the element's bit shift)
CAS_HALF_VECTOR = "cas_half_vector"  # 2 / 4 lanes of a 16-bit float add (select: 1 at an odd first element)
LOAD = "load"  # atomic_load_explicit
STORE = "store"  # atomic_store_explicit


@dataclass(frozen=True)
class Atomic:
    """One relaxed atomic on element `index` of the data var `var` (for the CAS_HALF forms: the first
    element of the 32-bit word). `value` has the buffer's element type (None for a load); its value is
    the previous contents (a store's is nothing)."""

    form: str
    kind: str  # add / max / min ("" for load / store)
    var: Any
    index: Any
    value: Any = None
    select: Any = None


def build_atomic(dtype: str, form: str, kind: str, var: Any, index: Any, value: Any = None, select: Any = None) -> Any:
    extra = [a for a in (value, select) if a is not None]
    if select is not None and value is None:
        raise ValueError("an atomic with a word select needs a value")
    return tir.call_extern(dtype, ATOMIC, tir.StringImm(form), tir.StringImm(kind), var, index, *extra)


def match_atomic(call: Any) -> Atomic | None:
    if not isinstance(call, tir.Call) or op_name(call) not in _EXTERN_OPS or str(call.args[0].value) != ATOMIC:
        return None
    form, kind, var, index, *rest = call.args[1:]
    value = rest[0] if rest else None
    select = rest[1] if len(rest) > 1 else None
    return Atomic(str(form.value), str(kind.value), var, index, value, select)
