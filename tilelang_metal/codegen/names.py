"""Identifiers in the generated MSL: TIR variable names made legal, unique and unreserved.

MSL is C++14 plus address-space keywords, vector type names and a standard library that the
kernel sees through `using namespace metal`: a parameter called `max`, `uint` or `threadgroup`
would not compile or would shadow a builtin. Names starting with `__` belong to the printer (its
temporaries and the hardware position parameters), so user names never take that form.
"""

from __future__ import annotations

import re
from typing import Any

from ..host import DEBUG_PRINT_EXTERNS

_CPP_KEYWORDS = """
alignas alignof and and_eq asm auto bitand bitor bool break case catch char char16_t char32_t class
compl const constexpr const_cast continue decltype default delete do double dynamic_cast else enum
explicit export extern false float for friend goto if inline int long mutable namespace new noexcept
not not_eq nullptr operator or or_eq private protected public register reinterpret_cast return short
signed sizeof static static_assert static_cast struct switch template this thread_local throw true try
typedef typeid typename union unsigned using virtual void volatile wchar_t while
""".split()

_MSL_KEYWORDS = """
kernel vertex fragment device constant threadgroup thread threadgroup_imageblock ray_data object_data
metal stage_in visible intersection mesh object packed half bfloat uint ushort uchar ulong size_t
ptrdiff_t atomic atomic_int atomic_uint atomic_bool atomic_float sampler texture1d texture2d texture3d
texturecube depth2d mpp simdgroup_matrix half8x8 float8x8 simdgroup_half8x8 simdgroup_float8x8
simdgroup_bfloat8x8 mem_flags memory_order
""".split()

# Vector and matrix type names of every scalar (half4, uint2, float4x4, bool3, ...).
_SCALARS = ("bool", "char", "uchar", "short", "ushort", "int", "uint", "long", "ulong", "half", "bfloat", "float")
_VECTOR_TYPES = [f"{s}{n}" for s in _SCALARS for n in (2, 3, 4)] + [
    f"{s}{r}x{c}" for s in ("half", "float", "bfloat") for r in (2, 3, 4) for c in (2, 3, 4)
]

# Functions and macros of the Metal standard library the printer (or a user's extern call) may use.
_LIBRARY = """
abs absdiff acos acosh as_type asin asinh atan atan2 atanh cbrt ceil clamp clz copysign cos cosh cospi
cross ctz distance divide dot erf exp exp10 exp2 extract_bits fabs fdim floor fma fmax fmax3 fmin fmin3
fmod fract frexp hadd insert_bits isfinite isinf isnan isnormal ldexp length log log10 log2 mad max
max3 median3 min min3 mix modf mulhi nan nextafter normalize popcount pow powr precise fast rhadd rint
rotate round rsqrt select sign signbit sin sincos sinh sinpi smoothstep sqrt step tan tanh tanpi trunc
threadgroup_barrier simdgroup_barrier simd_sum simd_max simd_min simd_product simd_and simd_or simd_xor
simd_shuffle simd_shuffle_xor simd_shuffle_up simd_shuffle_down simd_broadcast simd_prefix_inclusive_sum
simd_prefix_exclusive_sum simd_all simd_any simd_ballot simdgroup_load simdgroup_store
simdgroup_multiply_accumulate simdgroup_multiply make_filled_simdgroup_matrix atomic_fetch_add_explicit
atomic_fetch_sub_explicit atomic_fetch_max_explicit atomic_fetch_min_explicit atomic_load_explicit
atomic_store_explicit atomic_exchange_explicit atomic_compare_exchange_weak_explicit
memory_order_relaxed INFINITY NAN HUGE_VALF MAXFLOAT FLT_MAX FLT_MIN INT_MAX INT_MIN UINT_MAX
""".split()

# T.print's functions (the emulator's shim defines them): a variable of that name would shadow them.
RESERVED = frozenset(_CPP_KEYWORDS) | frozenset(_MSL_KEYWORDS) | frozenset(_VECTOR_TYPES) | frozenset(_LIBRARY) | frozenset(DEBUG_PRINT_EXTERNS)


def legal_base(hint: str) -> str:
    """`hint` as a C identifier that is neither reserved nor printer-owned."""
    base = re.sub(r"\W", "_", hint) or "v"
    if base[0].isdigit():
        base = "v_" + base
    if base.startswith("__"):
        base = "u" + base
    if base in RESERVED:
        base += "_"
    return base


class NameTable:
    """One MSL name per TIR variable, unique within a kernel. Variables with a fixed spelling (the
    hardware positions) are bound by identity with `bind`, never recognised by their name."""

    def __init__(self) -> None:
        self._names: dict[Any, str] = {}
        self._taken: set[str] = set()

    def bind(self, var: Any, text: str) -> None:
        self._names[var] = text

    def has(self, var: Any) -> bool:
        return var in self._names

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def taken(self, name: str) -> bool:
        return name in self._taken

    def rename(self, var: Any) -> str:
        """A fresh name for `var` from here on: a `Bind` repeated in one scope (the body of an
        unrolled loop binds the same variable once per copy) must declare a new constant."""
        self._names.pop(var, None)
        return self(var)

    def __call__(self, var: Any) -> str:
        name = self._names.get(var)
        if name is not None:
            return name
        base = legal_base(str(var.name))
        candidate, k = base, 1
        while candidate in self._taken:
            candidate, k = f"{base}_{k}", k + 1
        self._taken.add(candidate)
        self._names[var] = candidate
        return candidate
