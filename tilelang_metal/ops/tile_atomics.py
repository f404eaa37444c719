"""Tile-level atomics `T.atomic_add/max/min(dst_region, src)` (tile ops `tl.tileop.atomicadd`,
`atomicmax`, `atomicmin`) rewritten for Metal into the element form.

tilelang resolves both the layout inference and the lowering of these ops through C++ registries
with no Metal entry, so the rewrite runs *before* LayoutInference: the tile op becomes exactly the
loop a user would write, `for i, j in T.Parallel(...): T.atomic_add(dst[..], src[..])`. Layout
inference then gives the loop a layout (a fragment source's own layout, or a thread distribution
for shared / device sources) and LowerTileOp partitions it over threads. Metal has no vector
atomics: tilelang's vectorizer makes a 16-bit add 2-lane (`tl.atomic_addx2_elem_op` with a vector
value), which the printer writes as a compare-and-swap per 32-bit word (codegen/atomic_printer.py).
"""

from __future__ import annotations

from typing import Any

from ..host import call_annotations, tile_region, tir, tvm
from ..errors import MetalLoweringError
from ..host import vocab

ELEMENT_OPS = {"atomicadd": vocab.TL_ATOMIC_ADD_ELEM_OP, "atomicmax": vocab.TL_ATOMIC_MAX_ELEM_OP, "atomicmin": vocab.TL_ATOMIC_MIN_ELEM_OP}
USER_NAMES = {"atomicadd": "T.atomic_add", "atomicmax": "T.atomic_max", "atomicmin": "T.atomic_min"}
MEMORY_ORDER_NAMES = {1: "consume", 2: "acquire", 3: "release", 4: "acq_rel", 5: "seq_cst"}


def _full_rank(region: Any) -> tuple[list[Any], list[Any]]:
    """(mins, extents) with one extent per buffer dimension (leading unit dims made explicit)."""
    ndim = len(region.buffer.shape)
    extents = [tir.const(1, "int32")] * (ndim - len(region.extents)) + list(region.extents)
    return list(region.mins), extents


def _is_one(e: Any) -> bool:
    return isinstance(e, tir.IntImm) and int(e.value) == 1


def _region_or_none(arg: Any) -> Any:
    try:
        return tile_region(arg)
    except TypeError:
        return None


def lower_atomic_tile_op(call: Any, name: str) -> Any:
    """The parallel loop nest of element atomics that replaces one tile-level atomic call."""
    what = USER_NAMES[name]
    order = call_annotations(call).get("memory_order")
    if order is not None and int(order) != 0:
        raise MetalLoweringError(
            f"{what} with memory_order={MEMORY_ORDER_NAMES.get(int(order), order)!r}: Metal atomics are relaxed only; "
            "drop memory_order (or pass 'relaxed')"
        )
    dst = tile_region(call.args[1])
    dst_mins, dst_extents = _full_rank(dst)
    src = _region_or_none(call.args[0])
    if dst.buffer.scope() not in ("global", "shared", "shared.dyn"):
        raise MetalLoweringError(
            f"{what} into {dst.buffer.name} ({dst.buffer.scope()}): Metal atomics need device or threadgroup memory"
        )
    loop_dims = [d for d, e in enumerate(dst_extents) if not _is_one(e)]
    loop_vars = [tir.Var(f"atomic_i{k}", "int32") for k in range(len(loop_dims))]
    dst_index = list(dst_mins)
    for var, d in zip(loop_vars, loop_dims):
        dst_index[d] = dst_mins[d] + var
    if src is None:
        value = call.args[0]
    else:
        src_mins, src_extents = _full_rank(src)
        src_dims = [d for d, e in enumerate(src_extents) if not _is_one(e)]
        analyzer = tvm.arith.Analyzer()
        if src_dims and (
            len(src_dims) != len(loop_dims)
            or not all(analyzer.can_prove_equal(src_extents[s], dst_extents[d]) for s, d in zip(src_dims, loop_dims))
        ):
            shape = lambda ext: "x".join(str(e) for e in ext)  # noqa: E731
            raise MetalLoweringError(
                f"{what}: source {src.buffer.name} region {shape(src_extents)} does not match destination "
                f"{dst.buffer.name} region {shape(dst_extents)}; give regions of the same shape"
            )
        src_index = list(src_mins)
        for var, s in zip(loop_vars, src_dims):
            src_index[s] = src_mins[s] + var
        value = tir.BufferLoad(src.buffer, src_index)
    if str(value.dtype) != str(dst.buffer.dtype):
        value = tir.Cast(str(dst.buffer.dtype), value)
    address = tvm.tirx.call_intrin("handle", vocab.TIRX_ADDRESS_OF, tir.BufferLoad(dst.buffer, dst_index))
    body: Any = tir.Evaluate(tir.Call("handle", vocab.get_op(ELEMENT_OPS[name]), [address, value]))
    for var, d in reversed(list(zip(loop_vars, loop_dims))):
        body = tir.For(var, 0, dst_extents[d], tir.ForKind.PARALLEL, body)
    if not loop_dims:  # a one-element region: a parallel loop of one, so one thread does it, not all
        body = tir.For(tir.Var("atomic_i0", "int32"), 0, 1, tir.ForKind.PARALLEL, body)
    return body


HALF_WIDTH_ATOMIC_OPS = (
    vocab.TL_ATOMIC_ADD_ELEM_OP, vocab.TL_ATOMIC_ADD_RET_ELEM_OP, vocab.TL_ATOMIC_MAX_ELEM_OP, vocab.TL_ATOMIC_MAX_RET_ELEM_OP,
    vocab.TL_ATOMIC_MIN_ELEM_OP, vocab.TL_ATOMIC_MIN_RET_ELEM_OP,
    vocab.TL_ATOMIC_ADDX2_ELEM_OP, vocab.TL_ATOMIC_ADDX2_RET_ELEM_OP, vocab.TL_ATOMIC_ADDX4_ELEM_OP, vocab.TL_ATOMIC_ADDX4_RET_ELEM_OP,
)


def check_half_width_atomics(calls: list[Any]) -> None:
    """16-bit float atomics are compare-and-swap loops on the 32-bit word holding the element, so the
    last element of an odd-length buffer would need bytes past its end: refuse it here, by name."""
    for call in calls:
        if not (isinstance(call, tir.Call) and str(call.op.name) in HALF_WIDTH_ATOMIC_OPS):
            continue
        addr = call.args[0]
        if not (isinstance(addr, tir.Call) and str(addr.op.name) in (vocab.TIRX_ADDRESS_OF, vocab.TL_ACCESS_PTR)):
            continue  # the frontend writes T.access_ptr(dst[i], ...), the tile rewrite address_of(dst[i])
        buffer = addr.args[0].buffer
        if str(buffer.dtype) not in ("float16", "bfloat16"):
            continue
        count = 1
        for dim in buffer.shape:
            if not isinstance(dim, tir.IntImm):
                return  # symbolic: the emulator's bounds check reports the overrun at run time
            count *= int(dim.value)
        if count % 2:
            raise MetalLoweringError(
                f"atomics on the {buffer.dtype} buffer {buffer.name} of {count} elements: Metal has no 16-bit atomics and "
                "the compare-and-swap works on 32-bit words, so the buffer needs an even number of elements (pad it by one)"
            )
