"""16-byte copies as one `uint4` move (`intrinsics.COPY16`), where both ends are proved aligned.

A vectorized copy of 16 bytes in more than 4 lanes (8 halves, 16 bytes) is legal TIR but no Metal
vector: the printer would split it into 4-lane parts. When the store and the load are contiguous
single-index accesses of device, threadgroup or `alignas(16)` thread memory (of the buffer's own
element type) and both offsets are provably multiples of the lane count for every thread, the copy
becomes one `tlm_copy16` call. The proof substitutes the values of the `Bind`s printed before the
store (prelude offsets, tile origins) and reads LowerIntrin's shifts and masks as division and modulo.

An element loop over 16 bytes between two device, threadgroup or thread buffers (`for v: dst[d + v] =
src[s + v]`: what tilelang leaves of a copy whose vector alignment it cannot prove, as in
kernels.gemm.copy_runs at an odd row pitch, through its run registers) becomes one move as well:
`tlm_copy16` when both ends are proved 16-byte aligned (a thread array: declared alignas(16)), else
`tlm_packed_copy16` (a struct of 16 bytes of elements, aligned to its element). This runs after
tilelang planned the barriers, which saw plain element accesses.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
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
        if isinstance(node, tir.For):
            return self._run_as_copy16(node)
        return self._as_copy16(node) if isinstance(node, tir.BufferStore) else None

    def _run_as_copy16(self, loop: Any) -> Any:
        """`for v in [0, n): dst[d + v] = src[s + v]`, n elements of 16 bytes in all between two
        different device, threadgroup or thread buffers, as one move: `tlm_copy16` when both ends are
        provably 16-byte aligned, else the packed flavour (element alignment). A copy the vectorizer
        left element by element (it could not prove a vector alignment) so costs one access."""
        store = loop.body
        if not (isinstance(store, tir.BufferStore) and isinstance(store.value, tir.BufferLoad)):
            return None
        load = store.value
        if len(store.indices) != 1 or len(load.indices) != 1 or store.buffer.data.same_as(load.buffer.data):
            return None
        if not (isinstance(loop.min, tir.IntImm) and int(loop.min.value) == 0 and isinstance(loop.extent, tir.IntImm)):
            return None
        dtype = tvm.DataType(str(load.dtype))
        lanes = int(loop.extent.value)
        if dtype.lanes != 1 or str(store.buffer.dtype) != str(load.buffer.dtype) or dtype.bits * lanes != COPY_BITS:
            return None
        bases, aligned_ends = [], True
        for buf, index in ((store.buffer, store.indices[0]), (load.buffer, load.indices[0])):
            space = self.memory.space.get(buf.data)
            if space not in (DEVICE, THREADGROUP, THREAD) or self.memory.dtype.get(buf.data) != str(buf.dtype):
                return None
            if space == THREAD and buf.data in self.memory.matrices:
                return None  # a simdgroup / cooperative matrix has no element addresses
            # a thread array (copy_runs' run registers) takes the packed move unless declared alignas(16)
            aligned_ends = aligned_ends and self.element_dtype(buf.data) is not None
            base = self.analyzer.simplify(tvm.tirx.stmt_functor.substitute(index, {loop.loop_var: tir.const(0, loop.loop_var.dtype)}))
            if not self.analyzer.can_prove_equal(index - base, loop.loop_var):
                return None  # not consecutive elements in v
            bases.append(base)
        dst_base, src_base = bases
        if aligned_ends and all(self._provably_multiple(base, lanes) for base in bases):
            return intrinsics.build_copy16(store.buffer, dst_base, load.buffer, src_base)
        return intrinsics.build_copy16(store.buffer, dst_base, load.buffer, src_base, aligned=False)

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
    kinds = [vocab.TIRX_ALLOCBUFFER, vocab.TIRX_BIND, vocab.TIRX_BUFFERSTORE, vocab.TIRX_FOR]
    body = tvm.tirx.stmt_functor.ir_transform(func.body, rewriter.preorder, rewriter.postorder, kinds)
    return func.with_body(body)


UseWideCopies = per_function_pass("tilelang_metal.UseWideCopies", use_wide_copies)
