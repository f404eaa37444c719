"""Printing of the plugin's element atomics (`intrinsics.ATOMIC`, written by legalize/element_atomics.py,
which chose each form) as relaxed MSL atomics. A mixin of the kernel printer.

NATIVE, LOAD, STORE: `atomic_fetch_<kind>_explicit` / `atomic_load_explicit` / `atomic_store_explicit`
on `atomic_int` / `atomic_uint` / `atomic_float`. The compare-and-swap forms call a helper template
written once per kernel file (the pointer type is a template parameter so one helper serves device
and threadgroup memory) on the 32-bit `atomic_uint` word: float32 max / min on the float's own bits,
float16 / bfloat16 add / max / min on the word that contains the element (little-endian: the even
element is the low half), and 2 / 4 lanes of a float16 / bfloat16 add, two lanes in one word being one
compare-and-swap.
"""

from __future__ import annotations

from ..core import intrinsics
from ..errors import CodegenError
from .msl_types import msl_type, split_dtype

NATIVE_ATOMIC_TYPES = {"int32": "atomic_int", "uint32": "atomic_uint", "float32": "atomic_float"}
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
    """Needs from the host printer: `expr`, `offset`, `space_of`, `elem_dtype`, `ref`; fills
    `support_code` (helper name -> MSL text, printed once per file)."""

    support_code: dict[str, str]

    def atomic(self, atomic: intrinsics.Atomic) -> str:
        """An element atomic as an MSL expression (its value is the previous value)."""
        var, form = atomic.var, atomic.form
        name, space, dtype = self.ref(var, store=form == intrinsics.STORE), self.space_of(var), self.elem_dtype(var)
        element = f"{name} + ({self.offset(atomic.index)})"
        if form == intrinsics.LOAD:
            space = space if space.startswith("const") else f"const {space}"
            return f"atomic_load_explicit(({space} {NATIVE_ATOMIC_TYPES[dtype]}*)({element}), memory_order_relaxed)"
        value = self.expr(atomic.value)
        if form == intrinsics.STORE:
            return f"atomic_store_explicit(({space} {NATIVE_ATOMIC_TYPES[dtype]}*)({element}), {value}, memory_order_relaxed)"
        if form == intrinsics.NATIVE:
            return f"atomic_fetch_{atomic.kind}_explicit(({space} {NATIVE_ATOMIC_TYPES[dtype]}*)({element}), {value}, memory_order_relaxed)"
        if form == intrinsics.CAS_FLOAT:
            helper, self.support_code[helper] = float32_helper(atomic.kind)
            return f"{helper}(({space} atomic_uint*)({element}), {value})"
        word = f"({space} atomic_uint*)({name} + {self.expr(atomic.index)})"  # the index is `i - (i & 1)`
        select = f"(uint){self.expr(atomic.select)}"
        if form == intrinsics.CAS_HALF:
            helper, self.support_code[helper] = half_width_helper(atomic.kind, dtype)
            return f"{helper}({word}, {select}, {value})"
        if form == intrinsics.CAS_HALF_VECTOR:
            helper, self.support_code[helper] = half_width_vector_helper(dtype)
            lanes = split_dtype(str(atomic.value.dtype))[1]
            return f"__tlm_atomic_add_{msl_type(dtype)}{lanes}({word}, {select}, {value})"
        raise CodegenError(f"unknown atomic form {form!r}")
