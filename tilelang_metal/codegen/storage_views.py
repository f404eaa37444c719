"""Threadgroup and thread storage that `T.view(buf, shape, dtype)` reads with another element type.

tilelang keeps one allocation per data variable and gives each view its own buffer over that
variable; every access carries its own buffer's dtype. Where the buffers over one threadgroup array,
pool view or thread array have different element types, the printer declares the storage once with
the narrowest of them (among those, the one a simdgroup_load / _store takes a pointer of, else the
allocation's own) and reads every other element type through a pointer cast: element i of a view
whose element is r storage elements wide is `*(space T*)(NAME + i * r)`. Every view's element is
then a whole number of storage elements, so the emulator's checked pointers bound every access (and
the racecheck build tracks it byte by byte) as they do vector accesses. Thread storage narrower than
its widest view is declared `alignas` that view's element; threadgroup arrays are 16-byte aligned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core import intrinsics
from ..host import tir, tvm, vocab
from ..core.ir_attrs import find_nodes
from .msl_types import split_dtype


def element_bytes(dtype: str) -> int:
    bits = tvm.DataType(split_dtype(dtype)[0]).bits
    return max(bits, 8) // 8


@dataclass(frozen=True)
class ReinterpretedStorage:
    """One data variable read as several element types."""

    name: str  # the allocation's name (tilelang gives it the last view's), for messages
    dtype: str  # the element type the storage is declared with
    count: int | None  # elements of `dtype` the largest buffer over it spans (None: symbolic shapes only)
    dtypes: frozenset[str]  # every element type the kernel reads or writes it as

    @property
    def align(self) -> int:
        """Bytes of the widest view's element: the alignment the storage needs."""
        return max(element_bytes(d) for d in self.dtypes)

    def ratio(self, dtype: str) -> int:
        """Storage elements per element of `dtype`."""
        return element_bytes(dtype) // element_bytes(self.dtype)


def reinterpreted_storage(body: Any, parameters: set) -> dict[Any, ReinterpretedStorage]:
    """The threadgroup and thread storage of `body` that buffers of more than one element type
    share (device parameters excluded: the printer reinterprets them as same-size types only)."""
    allocated: dict[Any, str] = {}  # data var -> the allocation's element type
    names: dict[Any, str] = {}
    dtypes: dict[Any, set[str]] = {}
    bytes_: dict[Any, int] = {}
    pointed: dict[Any, set[str]] = {}  # data var -> element types of the typed pointers taken into it
    nodes = find_nodes(body, [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_DECLBUFFER, vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE, vocab.TIRX_CALL])
    for node in nodes:
        if isinstance(node, tir.Call):
            if intrinsics.op_name(node) in (intrinsics.SG_LOAD, intrinsics.SG_STORE):
                _note_pointer(node.args[2], pointed)
            continue
        buf = node.buffer
        var = buf.data
        if var in parameters:
            continue
        dtype = split_dtype(str(buf.dtype))[0]
        dtypes.setdefault(var, set()).add(dtype)
        if isinstance(node, tir.AllocBuffer):
            allocated.setdefault(var, dtype)
            names.setdefault(var, str(buf.name))
        count = 1
        for dim in buf.shape:
            if not isinstance(dim, tir.IntImm):
                break
            count *= int(dim.value)
        else:
            if not isinstance(node, (tir.BufferLoad, tir.BufferStore)):  # accesses may use flattened 1-element stand-ins
                bytes_[var] = max(bytes_.get(var, 0), count * element_bytes(dtype))
    out: dict[Any, ReinterpretedStorage] = {}
    for var, seen in dtypes.items():
        if len(seen) < 2:
            continue
        narrowest = min(element_bytes(d) for d in seen)
        candidates = sorted(d for d in seen if element_bytes(d) == narrowest)
        own = allocated.get(var, _pointee_dtype(var))
        matrix = [d for d in candidates if d in pointed.get(var, ())]  # simdgroup_load / _store take a pointer of their type
        dtype = matrix[0] if len(matrix) == 1 else own if own in candidates else candidates[0]
        total = bytes_.get(var)  # element sizes are powers of two: a multiple of the narrowest
        out[var] = ReinterpretedStorage(names.get(var, str(var.name)), dtype, None if total is None else total // narrowest, frozenset(seen))
    return out


def _note_pointer(addr: Any, pointed: dict[Any, set[str]]) -> None:
    """The element type of a matrix load's or store's pointer (`address_of` / `tvm_access_ptr`)."""
    op = intrinsics.op_name(addr) if isinstance(addr, tir.Call) else ""
    if op == vocab.TIRX_ADDRESS_OF:
        load = addr.args[0]
        pointed.setdefault(load.buffer.data, set()).add(split_dtype(str(load.buffer.dtype))[0])
    elif op == vocab.TIRX_TVM_ACCESS_PTR:
        pointed.setdefault(addr.args[1], set()).add(split_dtype(str(addr.args[0].dtype))[0])


def _pointee_dtype(var: Any) -> str | None:
    element = getattr(getattr(var, "type_annotation", None), "element_type", None)
    return split_dtype(str(element.dtype))[0] if element is not None and hasattr(element, "dtype") else None
