"""16-byte copies as one `uint4` move (`intrinsics.COPY16`), where both ends are proved aligned.

A vectorized copy of 16 bytes in more than 4 lanes (8 halves, 16 bytes) is legal TIR but no Metal
vector: the printer would split it into 4-lane parts. When the store and the load are contiguous
single-index accesses of device, threadgroup or `alignas(16)` thread memory (of the buffer's own
element type) and both offsets are provably multiples of the lane count for every thread, the copy
becomes one `tlm_copy16` call. The proof substitutes the values of the `Bind`s printed before the
store (prelude offsets, tile origins) and reads LowerIntrin's shifts and masks as division and modulo.
"""

from __future__ import annotations

from typing import Any

from .. import intrinsics
from ..host import tir, tvm
from ..host import vocab
from ..ir_attrs import THREAD_ARRAY_ALIGN_ATTR, storage_of
from ..scopes import SHARED_SCOPES
from ..transform.function_pass import per_function_pass
from ..transform.integer_bits import bits_as_arithmetic

COPY_BITS = 128
SUBSTITUTION_DEPTH = 4  # prelude values may refer to earlier prelude variables


def _pointee_dtype(var: Any) -> str | None:
    element = getattr(getattr(var, "type_annotation", None), "element_type", None)
    return str(element.dtype) if element is not None and hasattr(element, "dtype") else None


class _WideCopies:
    """One kernel: which data vars may take a `uint4` move (with their element type), the values of
    the Binds seen so far in program order, and the rewrite of each eligible store."""

    def __init__(self, func: Any):
        self.analyzer = tvm.arith.Analyzer()
        self.bound_values: dict[Any, Any] = {}
        self.device: dict[Any, str] = {}  # data var -> element dtype
        self.threadgroup: dict[Any, str] = {}
        self.aligned_thread: dict[Any, str] = {}  # thread arrays declared alignas(16)
        self.allocated: set = set()
        for var in func.params:
            dtype = _pointee_dtype(var) if str(var.dtype) == "handle" else None
            if dtype is not None:
                self.device[var] = dtype
        self.matrices = storage_of(func)

    def element_dtype(self, var: Any) -> str | None:
        """The element type of a buffer that may take a `uint4` move; None for any other."""
        for table in (self.device, self.threadgroup, self.aligned_thread):
            if var in table:
                return table[var]
        return None

    def preorder(self, node: Any) -> None:
        if isinstance(node, tir.AllocBuffer):
            self._allocate(node)
        elif isinstance(node, tir.Bind):
            self._bind(node.var, node.value)
        return None

    def _allocate(self, node: Any) -> None:
        buf = node.buffer
        var = buf.data
        if var in self.allocated:
            return  # unrolled copies of a loop body re-allocate the same array: the first one counts
        self.allocated.add(var)
        if str(buf.scope()) in SHARED_SCOPES:
            self.threadgroup[var] = str(buf.dtype)
        elif var not in self.matrices and node.annotations and int(node.annotations.get(THREAD_ARRAY_ALIGN_ATTR, 0)) >= COPY_BITS // 8:
            self.aligned_thread[var] = str(buf.dtype)  # matrix objects are never moved as uint4

    def _bind(self, var: Any, value: Any) -> None:
        if str(var.dtype) != "handle":
            self.bound_values[var] = value
            return
        if not isinstance(value, tir.Call):
            return
        op = str(value.op.name)
        if op == vocab.TIRX_ADDRESS_OF and value.args[0].buffer.data in self.device:
            self.device[var] = self.device[value.args[0].buffer.data]  # a tile pointer keeps its buffer's type
        elif op == vocab.TIRX_HANDLE_ADD_BYTE_OFFSET and value.args[0] in self.threadgroup:
            dtype = _pointee_dtype(var)  # a typed view into the merged threadgroup pool
            if dtype is not None:
                self.threadgroup[var] = dtype

    def postorder(self, node: Any) -> Any:
        return self._as_copy16(node) if isinstance(node, tir.BufferStore) else None

    def _as_copy16(self, store: Any) -> Any:
        value = store.value
        if not isinstance(value, tir.BufferLoad) or len(store.indices) != 1 or len(value.indices) != 1:
            return None
        dtype = tvm.DataType(str(value.dtype))
        if dtype.lanes <= 4 or dtype.bits * dtype.lanes != COPY_BITS:
            return None  # up to 4 lanes is a Metal vector already
        for buf, index in ((store.buffer, store.indices[0]), (value.buffer, value.indices[0])):
            if self.element_dtype(buf.data) != str(buf.dtype):
                return None
            if not (isinstance(index, tir.Ramp) and isinstance(index.stride, tir.IntImm) and int(index.stride.value) == 1):
                return None
            if not self._provably_multiple(index.base, dtype.lanes):
                return None
        return intrinsics.build_copy16(store.buffer, store.indices[0].base, value.buffer, value.indices[0].base)

    def _provably_multiple(self, index: Any, factor: int) -> bool:
        """`index % factor == 0` for every thread, with the earlier bindings substituted."""
        for _ in range(SUBSTITUTION_DEPTH):
            index = tvm.tirx.stmt_functor.substitute(index, self.bound_values)
        return self.analyzer.can_prove(tir.floormod(bits_as_arithmetic(index), factor) == 0)


def use_wide_copies(func: Any) -> Any:
    rewriter = _WideCopies(func)
    kinds = [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND, vocab.TIRX_BUFFERSTORE]
    body = tvm.tirx.stmt_functor.ir_transform(func.body, rewriter.preorder, rewriter.postorder, kinds)
    return func.with_body(body)


UseWideCopies = per_function_pass("tilelang_metal.UseWideCopies", use_wide_copies)
