"""Printing of TileLang's element atomics (`T.atomic_add/max/min`, `T.atomic_addx2/x4`, with or
without `return_prev`; `T.atomic_load` / `T.atomic_store`) as MSL atomics. A mixin of the kernel printer.

Native MSL atomics (relaxed order only): `atomic_fetch_add/max/min_explicit` on `atomic_int` /
`atomic_uint`, and `atomic_fetch_add_explicit` on `atomic_float` (MSL 3.0). Everything else is a
compare-and-swap loop on a 32-bit `atomic_uint` word, written once per kernel file as a helper
template (the pointer type is a template parameter so one helper serves device and threadgroup):
float32 max / min on the float's own bits, and float16 / bfloat16 add / max / min on the word that
contains the element (little-endian: the even element is the low half). Metal has no vector
atomics: the x2 / x4 forms are one element atomic per lane, except on float16 / bfloat16, where two
lanes in one word are one compare-and-swap. The x2 / x4 source is a pointer (the frontend's
`T.atomic_addx2/x4`) or a vector value (what tilelang's vectorizer makes of a 16-bit `T.atomic_add`).
"""

from __future__ import annotations

from typing import Any

from ..host import tir
from ..errors import CodegenError
from .msl_types import msl_type, split_dtype
from ..host import vocab

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
NATIVE_ATOMIC_TYPES = {"int32": "atomic_int", "uint32": "atomic_uint", "float32": "atomic_float"}
HALF_WIDTH = ("float16", "bfloat16")
RELAXED = 0  # tilelang's memory-order id of "relaxed"; 0 is also what an absent order means
MEMORY_ORDER_NAMES = {0: "relaxed", 1: "consume", 2: "acquire", 3: "release", 4: "acq_rel", 5: "seq_cst"}

LOAD_STORE_OPS = (vocab.TL_ATOMIC_LOAD_ELEM_OP, vocab.TL_ATOMIC_STORE_ELEM_OP)


def _is_address(arg: Any) -> bool:
    return isinstance(arg, tir.Call) and str(arg.op.name) in (vocab.TIRX_ADDRESS_OF, vocab.TIRX_TVM_ACCESS_PTR)


def _check_relaxed(op: str, order: Any) -> None:
    if not isinstance(order, tir.IntImm) or int(order.value) != RELAXED:
        name = MEMORY_ORDER_NAMES.get(int(order.value), str(order)) if isinstance(order, tir.IntImm) else str(order)
        raise CodegenError(
            f"{op} with memory_order={name!r}: Metal atomics are relaxed only; pass memory_order='relaxed' "
            "and order through barriers"
        )


_COMBINE = {"add": "old + value", "max": "max(old, value)", "min": "min(old, value)"}


def float32_helper(kind: str) -> tuple[str, str]:
    """(name, MSL text) of the CAS loop for float32 max / min on the float's bits."""
    name = f"__tlm_atomic_{kind}_float"
    text = f"""template <typename P>
inline float {name}(P word, float value) {{
  uint seen = atomic_load_explicit(word, memory_order_relaxed);
  for (;;) {{
    const float old = as_type<float>(seen);
    const uint desired = as_type<uint>({_COMBINE[kind]});
    if (desired == seen || atomic_compare_exchange_weak_explicit(word, &seen, desired, memory_order_relaxed, memory_order_relaxed)) {{
      return old;
    }}
  }}
}}
"""
    return name, text


def half_width_helper(kind: str, dtype: str) -> tuple[str, str]:
    """(name, MSL text) of the CAS loop for a 16-bit float element inside its 32-bit word."""
    ty = msl_type(dtype)
    name = f"__tlm_atomic_{kind}_{ty}"
    text = f"""template <typename P>
inline {ty} {name}(P word, uint shift, {ty} value) {{
  uint seen = atomic_load_explicit(word, memory_order_relaxed);
  for (;;) {{
    const {ty} old = as_type<{ty}>(ushort(seen >> shift));
    const {ty} next = {ty}({_COMBINE[kind]});
    const uint desired = (seen & ~(0xffffu << shift)) | (uint(as_type<ushort>(next)) << shift);
    if (desired == seen || atomic_compare_exchange_weak_explicit(word, &seen, desired, memory_order_relaxed, memory_order_relaxed)) {{
      return old;
    }}
  }}
}}
"""
    return name, text


def half_width_vector_helper(dtype: str) -> tuple[str, str]:
    """(name, MSL text) of the 2- and 4-lane float16 / bfloat16 adds (`T.atomic_addx2/x4`, and what
    tilelang's vectorizer makes of a 16-bit `T.atomic_add` in a vectorized loop). Lanes i, i+1 at an
    even i share one 32-bit word: one compare-and-swap updates both. At an odd i they sit in two
    neighbouring words: one compare-and-swap per word, each replacing only its own half (the other
    half is written back with the bits it was read with, so a concurrent update of it is never lost).
    One text for the word helper and both widths: they call each other, so they print together."""
    ty = msl_type(dtype)
    name = f"__tlm_atomic_add_{ty}2"
    word = f"__tlm_atomic_add_{ty}_halves"
    text = f"""template <typename P>
inline {ty}2 {word}(P word, {ty}2 value, uint halves) {{
  uint seen = atomic_load_explicit(word, memory_order_relaxed);
  for (;;) {{
    const {ty} lo = as_type<{ty}>(ushort(seen));
    const {ty} hi = as_type<{ty}>(ushort(seen >> 16));
    uint desired = seen;
    if (halves & 1u) {{
      desired = (desired & 0xffff0000u) | uint(as_type<ushort>({ty}(lo + value[0])));
    }}
    if (halves & 2u) {{
      desired = (desired & 0x0000ffffu) | (uint(as_type<ushort>({ty}(hi + value[1]))) << 16);
    }}
    if (desired == seen || atomic_compare_exchange_weak_explicit(word, &seen, desired, memory_order_relaxed, memory_order_relaxed)) {{
      return {ty}2(lo, hi);
    }}
  }}
}}
template <typename P>
inline {ty}2 {name}(P word, uint odd, {ty}2 value) {{
  if (odd == 0u) {{
    return {word}(word, value, 3u);
  }}
  const {ty} first = {word}(word, {ty}2({ty}(0), value[0]), 2u)[1];
  const {ty} second = {word}(word + 1, {ty}2(value[1], {ty}(0)), 1u)[0];
  return {ty}2(first, second);
}}
template <typename P>
inline {ty}4 __tlm_atomic_add_{ty}4(P word, uint odd, {ty}4 value) {{
  const {ty}2 low = {name}(word, odd, {ty}2(value[0], value[1]));
  const {ty}2 high = {name}(word + 1, odd, {ty}2(value[2], value[3]));
  return {ty}4(low, high);
}}
"""
    return name, text


class AtomicPrinting:
    """Needs from the host printer: `expr`, `offset`, `space_of`, `elem_dtype`, `name_of`,
    `threadgroup`, `device`; fills `support_code` (helper name -> MSL text, printed once per file)."""

    support_code: dict[str, str]

    def atomic_call(self, op: str, e: Any) -> str | None:
        """An element atomic as an MSL expression (its value is the previous value); None when `op`
        is not an atomic."""
        if op in LOAD_STORE_OPS:
            return self._load_or_store(op, e.args)
        spec = ATOMIC_ELEM_OPS.get(op)
        if spec is None:
            return None
        kind, lanes = spec
        args = e.args
        if lanes == 1 and len(args) > 2:
            _check_relaxed(op, args[2])
        var, index = self._atomic_address(op, args[0])
        if lanes == 1:
            return self._element_atomic(op, kind, var, index, self.expr(args[1]), str(args[1].dtype))
        dtype = self.elem_dtype(var)
        vector_type = msl_type(f"{dtype}x{lanes}")
        if _is_address(args[1]):  # T.atomic_addx2/x4(dst, src): a pointer to the source values
            src_var, src_index = self._atomic_address(op, args[1], source=True)
            src_dtype = self.elem_dtype(src_var)
            values = [f"{self.name_of(src_var)}[{self.offset(src_index + t)}]" for t in range(lanes)]
            vector = f"{vector_type}({', '.join(values)})"
        else:  # the vectorizer's form: the source is a vector value (a vector load, a broadcast, a cast)
            src_dtype = split_dtype(str(args[1].dtype))[0]
            vector = self.expr(args[1])
            values = [f"({vector})[{t}]" for t in range(lanes)]
            if src_dtype != dtype:
                vector = f"{vector_type}({vector})"
        if dtype in HALF_WIDTH:
            return self._half_width_vector_add(op, var, index, vector, lanes)
        parts = [self._element_atomic(op, kind, var, index + t, value, src_dtype) for t, value in enumerate(values)]
        if str(e.dtype) == "handle":
            return "(" + ", ".join(parts) + ")"  # one atomic per lane, in lane order
        return f"{msl_type(str(e.dtype))}({', '.join(parts)})"

    def _half_width_vector_add(self, op: str, var: Any, index: Any, vector: str, lanes: int) -> str:
        """A 2- or 4-lane float16 / bfloat16 add (`vector`: the MSL value, already of the buffer's
        element type) as one helper call on the words holding the lanes; its value is the previous lanes."""
        space = self._writable_space(op, var)
        dtype = self.elem_dtype(var)
        ty = msl_type(dtype)
        helper, text = half_width_vector_helper(dtype)
        self.support_code[helper] = text
        i = self.expr(index)
        return f"__tlm_atomic_add_{ty}{lanes}(({space} atomic_uint*)({self.name_of(var)} + ({i} - ({i} & 1))), (uint)({i} & 1), {vector})"

    def _load_or_store(self, op: str, args: Any) -> str:
        """`T.atomic_load(src)` / `T.atomic_store(dst, value)` as `atomic_load/store_explicit`."""
        _check_relaxed(op, args[-1])
        var, index = self._atomic_address(op, args[0])
        dtype = self.elem_dtype(var)
        native = NATIVE_ATOMIC_TYPES.get(dtype)
        if native is None:
            raise CodegenError(f"{op} on {dtype} ({self.name_of(var)}): Metal atomic loads / stores take int32, uint32 or float32")
        space = self.space_of(var)
        if op == vocab.TL_ATOMIC_LOAD_ELEM_OP:
            space = space if space.startswith("const") else f"const {space}"
            return f"atomic_load_explicit(({space} {native}*)({self.name_of(var)} + ({self.offset(index)})), memory_order_relaxed)"
        if space.startswith("const"):
            raise CodegenError(f"{op}: {self.name_of(var)} is read-only in this kernel")
        value = self.expr(args[1])
        if str(args[1].dtype) != dtype:
            value = f"(({msl_type(dtype)})({value}))"
        return f"atomic_store_explicit(({space} {native}*)({self.name_of(var)} + ({self.offset(index)})), {value}, memory_order_relaxed)"

    def _atomic_address(self, op: str, addr: Any, source: bool = False) -> tuple[Any, Any]:
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
        if not source and var not in self.device and var not in self.threadgroup:
            raise CodegenError(
                f"{op} on {self.name_of(var)}: Metal atomics need device or threadgroup memory; "
                "use a T.alloc_shared buffer or a kernel parameter (a thread-local value needs no atomic)"
            )
        return var, index

    def _writable_space(self, op: str, var: Any) -> str:
        space = self.space_of(var)
        if space.startswith("const"):
            raise CodegenError(f"{op}: {self.name_of(var)} is read-only in this kernel")
        return space

    def _element_atomic(self, op: str, kind: str, var: Any, index: Any, value: str, value_dtype: str) -> str:
        dtype = self.elem_dtype(var)
        space = self._writable_space(op, var)
        name = self.name_of(var)
        ty = msl_type(dtype)
        if value_dtype != dtype:
            value = f"(({ty})({value}))"
        native = NATIVE_ATOMIC_TYPES.get(dtype)
        if native is not None and (kind == "add" or dtype != "float32"):
            return f"atomic_fetch_{kind}_explicit(({space} {native}*)({name} + ({self.offset(index)})), {value}, memory_order_relaxed)"
        if dtype == "float32":
            helper, text = float32_helper(kind)
            self.support_code[helper] = text
            return f"{helper}(({space} atomic_uint*)({name} + ({self.offset(index)})), {value})"
        if dtype in HALF_WIDTH:
            helper, text = half_width_helper(kind, dtype)
            self.support_code[helper] = text
            i = self.expr(index)
            return f"{helper}(({space} atomic_uint*)({name} + ({i} - ({i} & 1))), (uint)(({i} & 1) * 16), {value})"
        raise CodegenError(
            f"{op} on {dtype} ({name}): Metal atomics take int32, uint32, float32 (and float16 / bfloat16 through "
            "a compare-and-swap loop); use one of those dtypes"
        )
