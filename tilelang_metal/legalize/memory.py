"""What a late pass needs to know about a kernel's buffers at a point of its body, as the printer
sees them: the memory space and element type of each data variable (parameters, threadgroup arrays and
their typed pool views, tile pointers, thread arrays) and the values of the `Bind`s seen so far.
Fed in program order by `visit` from an `ir_transform` preorder callback."""

from __future__ import annotations

from typing import Any

from ..host import tir
from ..host import vocab
from ..core.ir_attrs import COOPERATIVE_TENSOR_STORAGE, THREAD_ARRAY_ALIGN_ATTR, storage_of
from ..core.scopes import SHARED_SCOPES

DEVICE, THREADGROUP, THREAD = "device", "threadgroup", "thread"


def pointee_dtype(var: Any) -> str | None:
    element = getattr(getattr(var, "type_annotation", None), "element_type", None)
    return str(element.dtype) if element is not None and hasattr(element, "dtype") else None


class KernelMemory:
    def __init__(self, func: Any):
        self.space: dict[Any, str] = {}  # data var -> DEVICE | THREADGROUP | THREAD
        self.dtype: dict[Any, str] = {}  # data var -> element dtype
        self.alignment: dict[Any, int] = {}  # thread array -> alignas bytes
        self.bound_values: dict[Any, Any] = {}  # non-pointer Bind var -> value, latest first seen in order
        self.readonly: set = set()  # device data vars the kernel never writes (const device)
        self.matrices = storage_of(func)
        readonly = vocab.readonly_param_indices(func)
        for index, var in enumerate(func.params):
            dtype = pointee_dtype(var) if str(var.dtype) == "handle" else None
            if dtype is not None:
                self._record(var, DEVICE, dtype)
                if index in readonly:
                    self.readonly.add(var)

    def _record(self, var: Any, space: str, dtype: str) -> None:
        self.space[var], self.dtype[var] = space, dtype

    def visit(self, node: Any) -> None:
        if isinstance(node, tir.AllocBuffer):
            self._allocate(node)
        elif isinstance(node, tir.Bind):
            self._bind(node.var, node.value)

    def _allocate(self, node: Any) -> None:
        buf = node.buffer
        var = buf.data
        if var in self.space:
            return  # unrolled copies of a loop body re-allocate the same array: the first one counts
        if str(buf.scope()) in SHARED_SCOPES:
            self._record(var, THREADGROUP, str(buf.dtype))
            return
        storage = self.matrices.get(var)
        # a cooperative accumulator kept as an array is float32, like the MPP destination
        self._record(var, THREAD, "float32" if storage is not None and not storage.elided and storage.kind == COOPERATIVE_TENSOR_STORAGE else str(buf.dtype))
        if storage is None and node.annotations:
            self.alignment[var] = int(node.annotations.get(THREAD_ARRAY_ALIGN_ATTR, 0))

    def _bind(self, var: Any, value: Any) -> None:
        if str(var.dtype) != "handle":
            self.bound_values[var] = value
            return
        if not isinstance(value, tir.Call):
            return
        op = str(value.op.name)
        if op == vocab.TIRX_ADDRESS_OF and self.space.get(value.args[0].buffer.data) == DEVICE:
            source = value.args[0].buffer.data
            self._record(var, DEVICE, self.dtype[source])  # a tile pointer keeps its buffer's type and constness
            if source in self.readonly:
                self.readonly.add(var)
        elif op == vocab.TIRX_HANDLE_ADD_BYTE_OFFSET and self.space.get(value.args[0]) == THREADGROUP:
            dtype = pointee_dtype(var)  # a typed view into the merged threadgroup pool
            if dtype is not None:
                self._record(var, THREADGROUP, dtype)
