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
from ..transform.function_pass import per_function_pass
from ..transform.integer_bits import bits_as_arithmetic
from .memory import DEVICE, THREAD, THREADGROUP, KernelMemory

COPY_BITS = 128
SUBSTITUTION_DEPTH = 4  # prelude values may refer to earlier prelude variables


class _WideCopies:
    """One kernel: its buffers as seen so far in program order, and the rewrite of each eligible store."""

    def __init__(self, func: Any):
        self.analyzer = tvm.arith.Analyzer()
        self.memory = KernelMemory(func)

    def element_dtype(self, var: Any) -> str | None:
        """The element type of a buffer that may take a `uint4` move; None for any other."""
        space = self.memory.space.get(var)
        if space in (DEVICE, THREADGROUP) or (space == THREAD and self.memory.alignment.get(var, 0) >= COPY_BITS // 8):
            return self.memory.dtype[var]
        return None

    def preorder(self, node: Any) -> None:
        self.memory.visit(node)
        return None

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
            index = tvm.tirx.stmt_functor.substitute(index, self.memory.bound_values)
        return self.analyzer.can_prove(tir.floormod(bits_as_arithmetic(index), factor) == 0)


def use_wide_copies(func: Any) -> Any:
    rewriter = _WideCopies(func)
    kinds = [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND, vocab.TIRX_BUFFERSTORE]
    body = tvm.tirx.stmt_functor.ir_transform(func.body, rewriter.preorder, rewriter.postorder, kinds)
    return func.with_body(body)


UseWideCopies = per_function_pass("tilelang_metal.UseWideCopies", use_wide_copies)
