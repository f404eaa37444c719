"""TileLang's element atomics as the Metal atomic each one becomes (`intrinsics.ATOMIC`).

`T.atomic_add/max/min` (with or without `return_prev`), `T.atomic_addx2/x4` and
`T.atomic_load` / `T.atomic_store` arrive as `tl.atomic_*_elem_op` calls on an address. Metal's
atomics are relaxed only: `atomic_fetch_add/max/min_explicit` on `atomic_int` / `atomic_uint`, and
`atomic_fetch_add_explicit` on `atomic_float` (NATIVE). Everything else is a compare-and-swap loop
on a 32-bit `atomic_uint` word, a helper the printer writes once per file: float32 max / min on the
float's own bits (CAS_FLOAT), a float16 / bfloat16 element inside the word that contains it
(CAS_HALF: little-endian, the even element is the low half, so the word starts at `i - (i & 1)`
and the element sits `(i & 1) * 16` bits up). Metal has no vector atomics: the x2 / x4 forms are one
element atomic per lane, except on float16 / bfloat16, where two lanes in one word are one
compare-and-swap (CAS_HALF_VECTOR). The x2 / x4 source is a pointer (the frontend's form) or a
vector value (what tilelang's vectorizer makes of a 16-bit `T.atomic_add`).

Refused here, each in one line naming the op and a fix: a memory order other than relaxed, an atomic
on thread memory or a read-only parameter, an element type Metal has no atomic for.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..errors import CodegenError
from ..host import tir, tvm
from ..host import vocab
from ..transform.function_pass import per_function_pass
from .memory import DEVICE, THREADGROUP, KernelMemory

# op -> (operation, lanes)
ATOMIC_ELEM_OPS = {
    vocab.TL_ATOMIC_ADD_ELEM_OP: ("add", 1),
    vocab.TL_ATOMIC_ADD_RET_ELEM_OP: ("add", 1),
    vocab.TL_ATOMIC_MAX_ELEM_OP: ("max", 1),
    vocab.TL_ATOMIC_MAX_RET_ELEM_OP: ("max", 1),
    vocab.TL_ATOMIC_MIN_ELEM_OP: ("min", 1),
    vocab.TL_ATOMIC_MIN_RET_ELEM_OP: ("min", 1),
    vocab.TL_ATOMIC_ADDX2_ELEM_OP: ("add", 2),
    vocab.TL_ATOMIC_ADDX2_RET_ELEM_OP: ("add", 2),
    vocab.TL_ATOMIC_ADDX4_ELEM_OP: ("add", 4),
    vocab.TL_ATOMIC_ADDX4_RET_ELEM_OP: ("add", 4),
}
NATIVE_ATOMIC_DTYPES = ("int32", "uint32", "float32")
HALF_WIDTH = ("float16", "bfloat16")
RELAXED = 0  # tilelang's memory-order id of "relaxed"; 0 is also what an absent order means
MEMORY_ORDER_NAMES = {0: "relaxed", 1: "consume", 2: "acquire", 3: "release", 4: "acq_rel", 5: "seq_cst"}


def _check_relaxed(op: str, order: Any) -> None:
    if not isinstance(order, tir.IntImm) or int(order.value) != RELAXED:
        name = MEMORY_ORDER_NAMES.get(int(order.value), str(order)) if isinstance(order, tir.IntImm) else str(order)
        raise CodegenError(
            f"{op} with memory_order={name!r}: Metal atomics are relaxed only; pass memory_order='relaxed' "
            "and order through barriers"
        )


def _is_address(arg: Any) -> bool:
    return isinstance(arg, tir.Call) and str(arg.op.name) in (vocab.TIRX_ADDRESS_OF, vocab.TIRX_TVM_ACCESS_PTR)


def _odd(index: Any) -> Any:
    """`index & 1`, built as the node itself (no folding: the printer spells what is written here)."""
    return tir.Call(index.dtype, vocab.get_op(vocab.TIRX_BITWISE_AND), [index, tir.const(1, index.dtype)])


def _word_start(index: Any) -> Any:
    return tir.Sub(index, _odd(index))  # the even element: the low half of the word


class _Atomics:
    def __init__(self, func: Any):
        self.memory = KernelMemory(func)

    def preorder(self, node: Any) -> None:
        self.memory.visit(node)
        return None

    def postorder(self, node: Any) -> Any:
        if isinstance(node, tir.Evaluate):
            return self._statement(node)
        if not isinstance(node, tir.Call) or not isinstance(node.op, tvm.ir.Op):
            return None
        op = str(node.op.name)
        if op in (vocab.TL_ATOMIC_LOAD_ELEM_OP, vocab.TL_ATOMIC_STORE_ELEM_OP):
            return self._load_or_store(op, node.args)
        if op not in ATOMIC_ELEM_OPS:
            return None
        return self._lanes(op, node)  # None: one atomic per lane, as statements (_statement)

    # ------------------------------------------------------------ the forms
    def _lanes(self, op: str, call: Any) -> Any:
        """The call's atomics as one expression; None for one atomic per lane whose values nobody
        reads (a statement: split by `_statement`)."""
        kind, lanes = ATOMIC_ELEM_OPS[op]
        args = call.args
        if lanes == 1 and len(args) > 2:
            _check_relaxed(op, args[2])
        var, index = self._address(op, args[0])
        if lanes == 1:
            return self._element(op, kind, var, index, args[1])
        dtype = self.memory.dtype[var]
        vector_dtype = f"{dtype}x{lanes}"
        if _is_address(args[1]):  # T.atomic_addx2/x4(dst, src): a pointer to the source values
            src_var, src_index = self._address(op, args[1], source=True)
            source = tir.decl_buffer((1,), self.memory.dtype[src_var], str(src_var.name), data=src_var)
            values = [tir.BufferLoad(source, [src_index + t]) for t in range(lanes)]
            vector = tir.Shuffle(values, list(range(lanes)))
        else:  # the vectorizer's form: a vector value (a vector load, a broadcast, a cast)
            vector = args[1]
            values = [tir.Shuffle([vector], [t]) for t in range(lanes)]
        if dtype in HALF_WIDTH:
            self._writable(op, var)
            if str(vector.dtype) != vector_dtype:
                vector = tir.Cast(vector_dtype, vector)
            return intrinsics.build_atomic(str(call.dtype), intrinsics.CAS_HALF_VECTOR, kind, var, _word_start(index), vector, _odd(index))
        parts = [self._element(op, kind, var, index + t, value) for t, value in enumerate(values)]
        if str(call.dtype) == "handle":
            return None
        return tir.Shuffle(parts, list(range(lanes)))

    def _statement(self, stmt: Any) -> Any:
        """A multi-lane atomic whose previous values nobody reads: one statement per lane, in lane order."""
        call = stmt.value
        if not (isinstance(call, tir.Call) and isinstance(call.op, tvm.ir.Op) and str(call.dtype) == "handle"):
            return None
        op = str(call.op.name)
        if op not in ATOMIC_ELEM_OPS or ATOMIC_ELEM_OPS[op][1] == 1:
            return None
        var, index = self._address(op, call.args[0])  # a 16-bit one is one call already (postorder)
        kind, lanes = ATOMIC_ELEM_OPS[op]
        if _is_address(call.args[1]):
            src_var, src_index = self._address(op, call.args[1], source=True)
            source = tir.decl_buffer((1,), self.memory.dtype[src_var], str(src_var.name), data=src_var)
            values = [tir.BufferLoad(source, [src_index + t]) for t in range(lanes)]
        else:
            values = [tir.Shuffle([call.args[1]], [t]) for t in range(lanes)]
        return tir.SeqStmt([tir.Evaluate(self._element(op, kind, var, index + t, value)) for t, value in enumerate(values)])

    def _element(self, op: str, kind: str, var: Any, index: Any, value: Any) -> Any:
        dtype = self.memory.dtype[var]
        self._writable(op, var)
        if str(value.dtype) != dtype:
            value = tir.Cast(dtype, value)
        if dtype in NATIVE_ATOMIC_DTYPES and (kind == "add" or dtype != "float32"):
            return intrinsics.build_atomic(dtype, intrinsics.NATIVE, kind, var, index, value)
        if dtype == "float32":
            return intrinsics.build_atomic(dtype, intrinsics.CAS_FLOAT, kind, var, index, value)
        if dtype in HALF_WIDTH:
            shift = tir.Mul(_odd(index), tir.const(16, index.dtype))
            return intrinsics.build_atomic(dtype, intrinsics.CAS_HALF, kind, var, _word_start(index), value, shift)
        raise CodegenError(
            f"{op} on {dtype} ({var.name}): Metal atomics take int32, uint32, float32 (and float16 / bfloat16 through "
            "a compare-and-swap loop); use one of those dtypes"
        )

    def _load_or_store(self, op: str, args: Any) -> Any:
        _check_relaxed(op, args[-1])
        var, index = self._address(op, args[0])
        dtype = self.memory.dtype[var]
        if dtype not in NATIVE_ATOMIC_DTYPES:
            raise CodegenError(f"{op} on {dtype} ({var.name}): Metal atomic loads / stores take int32, uint32 or float32")
        if op == vocab.TL_ATOMIC_LOAD_ELEM_OP:
            return intrinsics.build_atomic(dtype, intrinsics.LOAD, "", var, index)
        self._writable(op, var)
        value = args[1] if str(args[1].dtype) == dtype else tir.Cast(dtype, args[1])
        return intrinsics.build_atomic("handle", intrinsics.STORE, "", var, index, value)

    # ------------------------------------------------------------ addresses
    def _address(self, op: str, addr: Any, source: bool = False) -> tuple[Any, Any]:
        if isinstance(addr, tir.Call) and str(addr.op.name) == vocab.TIRX_ADDRESS_OF:
            load = addr.args[0]
            if len(load.indices) != 1:
                raise CodegenError(f"{op}: address of {load.buffer.name} is not flattened")
            var, index = load.buffer.data, load.indices[0]
            if isinstance(index, tir.Ramp):  # a vectorized address: its first lane
                index = index.base
        elif isinstance(addr, tir.Call) and str(addr.op.name) == vocab.TIRX_TVM_ACCESS_PTR:
            var, index = addr.args[1], addr.args[2]
        else:
            raise CodegenError(f"{op}: unsupported address {addr}")
        if var not in self.memory.dtype:
            raise CodegenError(f"buffer variable {var.name} is used before it is allocated")
        if not source and self.memory.space.get(var) not in (DEVICE, THREADGROUP):
            raise CodegenError(
                f"{op} on {var.name}: Metal atomics need device or threadgroup memory; "
                "use a T.alloc_shared buffer or a kernel parameter (a thread-local value needs no atomic)"
            )
        return var, index

    def _writable(self, op: str, var: Any) -> None:
        if var in self.memory.readonly:
            raise CodegenError(f"{op}: {var.name} is read-only in this kernel")


def lower_atomics(func: Any) -> Any:
    atomics = _Atomics(func)
    kinds = [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND, vocab.TIRX_CALL, vocab.TIRX_EVALUATE]
    body = tvm.tirx.stmt_functor.ir_transform(func.body, atomics.preorder, atomics.postorder, kinds)
    return func.with_body(body)


LowerAtomics = per_function_pass("tilelang_metal.LowerAtomics", lower_atomics)
