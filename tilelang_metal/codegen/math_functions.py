"""Math calls in MSL: TileLang's math functions, however they reach the printer, as Metal builtins or
as implementations the plugin prints once per file (docs/math.md).

A math function arrives in one of three forms:
- a TVM intrinsic (`tirx.exp`, `tirx.log1p`, ...) that LowerIntrin left alone (it lowers most
  float32 calls but leaves many float16 ones);
- a `call_pure_extern` with the C library name LowerIntrin chose for Metal (`expf`, `log1pf`,
  `atan2f`, `nearbyint`, ...): MSL has no such global functions, so each is mapped back;
- a tilelang fast-math intrinsic (`tl.__exp`, `tl.fast_rcp`, `tl.fma`).
Functions MSL lacks (log1p, hypot, nextafter) become `__tlm_<name>` helpers; float16 helpers
compute in float32 (a half-precision polynomial would lose the last bits of the result).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import CodegenError
from .msl_types import float_literal, split_dtype

# MSL builtins (metal_math / metal_integer / metal_relational), by the name TileLang uses.
_BUILTINS = {
    name: name
    for name in """acos acosh asin asinh atan atanh atan2 ceil copysign cos cosh exp exp2 exp10 fabs floor
    fmod log log2 log10 pow sin sinh sqrt tan tanh trunc rsqrt fma fmax fmin isnan isinf isfinite rint
    popcount clz ctz abs""".split()
}
# Same meaning, another name: TVM's round is round-half-to-even, like rint (MSL's round is not).
_BUILTINS.update({"nearbyint": "rint", "round": "rint"})
# C library float spellings (`expf`) LowerIntrin emits for float32.
_C_FLOAT_NAMES = {f"{name}f": name for name in list(_BUILTINS) + ["log1p", "hypot", "nextafter", "ldexp", "erf"]}
# tilelang fast-math intrinsics: MSL's `fast::` variants exist for float only.
_FAST = {"__exp": "exp", "__exp10": "exp10", "__log": "log", "__log2": "log2", "__log10": "log10", "__sin": "sin", "__cos": "cos", "__tan": "tan"}

# tilelang's packed x2 arithmetic (2-lane vectors: float2, half2) and plain fmul: MSL vectors do it.
_PACKED_OPERATORS = {"add2": "+", "sub2": "-", "mul2": "*", "fmul": "*"}
_PACKED_FUNCTIONS = {"max2": "max", "min2": "min", "abs2": "fabs", "fma2": "fma"}
# IEEE round-to-nearest arithmetic: basic operators are correctly rounded on Metal; division and
# square roots need `precise::` (fast math approximates them), which exists for float only.
_IEEE_OPERATORS = {"ieee_add": "+", "ieee_sub": "-", "ieee_mul": "*"}
_IEEE_PRECISE = {"ieee_fdiv": "divide", "ieee_frcp": "divide", "ieee_fsqrt": "sqrt", "ieee_frsqrt": "rsqrt", "ieee_fmaf": "fma"}

_FLOAT_VECTORS = ("float", "float2", "float3", "float4")

# Precise math (LoweringOptions.precise_math): float32 functions with a `metal::precise::` variant
# the printer uses, so their accuracy does not depend on the runtime's fast-math option.
PRECISE_FUNCTIONS = frozenset("acos asin atan atan2 cos cosh exp exp2 exp10 log log2 log10 pow rsqrt sin sinh sqrt tan tanh".split())
# NaN / infinity tests as bit tests: fast math lets the compiler assume no NaN or infinity exists.
_CLASSIFY_BITS = {"isnan": "(as_type<{u}>({x}) & 0x7fffffffu) > 0x7f800000u",
                  "isinf": "(as_type<{u}>({x}) & 0x7fffffffu) == 0x7f800000u",
                  "isfinite": "(as_type<{u}>({x}) & 0x7fffffffu) < 0x7f800000u"}


def _is_float32(dtype: str) -> bool:
    return split_dtype(dtype)[0] == "float32"


def uint_like(dtype: str) -> str:
    """The MSL unsigned type of a float32 scalar or vector's bits (`uint`, `uint4`)."""
    lanes = split_dtype(dtype)[1]
    return "uint" if lanes == 1 else f"uint{lanes}"


def precise_divide(a: str, b: str) -> str:
    return f"metal::precise::divide({a}, {b})"


def _half_overloads(name: str, arity: int) -> str:
    """float16 overloads computing in float32 through the float implementation."""
    lines = []
    for fv in _FLOAT_VECTORS:
        hv = "half" + fv[len("float") :]
        params = ", ".join(f"{hv} a{i}" for i in range(arity))
        call = ", ".join(f"{fv}(a{i})" for i in range(arity))
        lines.append(f"inline {hv} {name}({params}) {{ return {hv}({name}({call})); }}")
    return "\n".join(lines)


# Helper implementations, written for float (scalar and vector: `select` is lane-wise).
_LOG1P = """// log(1 + x): a degree-8 series below |x| = 1/16 (where rounding 1 + x would lose x's low bits), log(1 + x) above.
// Error: < 2 ulp below 1/16 (series truncation < 1e-9 relative), the rounding of 1 + x (< 1e-6 relative) above.
template <typename T> inline T __tlm_log1p(T x) {
  T series = x * (T(1.0f) + x * (T(-0.5f) + x * (T(1.0f / 3.0f) + x * (T(-0.25f) + x * (T(0.2f)
      + x * (T(-1.0f / 6.0f) + x * (T(1.0f / 7.0f) + x * T(-0.125f))))))));
  return select(log(T(1.0f) + x), series, fabs(x) < T(0.0625f));
}
"""
_HYPOT = """// sqrt(x*x + y*y) without overflow or underflow of the squares: hi * sqrt(1 + (lo/hi)^2); inf wins over NaN.
template <typename T> inline T __tlm_hypot(T x, T y) {
  T ax = fabs(x), ay = fabs(y);
  T hi = max(ax, ay), lo = min(ax, ay);
  T r = lo / select(hi, T(1.0f), hi == T(0.0f));
  T h = hi * sqrt(T(1.0f) + r * r);
  h = select(h, ax + ay, isnan(x) || isnan(y));
  return select(h, select(ay, ax, isinf(x)), isinf(x) || isinf(y));
}
"""
_NEXTAFTER = """// The float next to x in the direction of y, by stepping x's bit pattern.
inline float __tlm_nextafter(float x, float y) {
  if (isnan(x) || isnan(y)) return x + y;
  if (x == y) return y;
  if (x == 0.0f) return copysign(as_type<float>(1u), y);
  uint bits = as_type<uint>(x);
  bits = ((x < y) == (x > 0.0f)) ? bits + 1u : bits - 1u;
  return as_type<float>(bits);
}
inline half __tlm_nextafter(half x, half y) {
  if (isnan(x) || isnan(y)) return x + y;
  if (x == y) return y;
  if (x == half(0.0f)) return copysign(as_type<half>(ushort(1)), y);
  ushort bits = as_type<ushort>(x);
  bits = ((x < y) == (x > half(0.0f))) ? ushort(bits + 1) : ushort(bits - 1);
  return as_type<half>(bits);
}
"""

HELPERS: dict[str, str] = {
    "log1p": _LOG1P + _half_overloads("__tlm_log1p", 1) + "\n",
    "hypot": _HYPOT + _half_overloads("__tlm_hypot", 2) + "\n",
    "nextafter": _NEXTAFTER,
}
# Documented accuracy of each helper (docs/math.md repeats it).
HELPER_ACCURACY = {
    "log1p": "series below |x| = 1/16 (< 2 ulp), log(1 + x) above (rounding of 1 + x, < 1e-6 relative)",
    "hypot": "a few ulp (one division, one sqrt)",
    "nextafter": "exact",
}


@dataclass
class MathCall:
    text: str
    helpers: set[str] = field(default_factory=set)


def _lanes(dtype: str) -> int:
    return split_dtype(dtype)[1]


def canonical_name(name: str) -> str:
    """The TileLang name of a math call given as an intrinsic (`tirx.exp`, `tl.__exp`) or an extern
    C name (`expf`); unchanged when it is not a math function."""
    for prefix in ("tirx.", "tl."):
        if name.startswith(prefix):
            return name[len(prefix) :]
    return _C_FLOAT_NAMES.get(name, name)


def math_call(name: str, args: list[str], arg_dtypes: list[str], dtype: str, precise: bool = False) -> MathCall | None:
    """MSL for the math function `name` (see canonical_name) applied to printed `args`, or None
    when `name` is not a math function. `precise`: float32 functions as `metal::precise::` calls
    and classification as bit tests (docs/math.md, "Precise math"); the explicit fast intrinsics
    (`T.__exp`, `T.fast_rcp`) stay fast."""
    fn = canonical_name(name)
    joined = ", ".join(args)
    if precise and arg_dtypes and _is_float32(arg_dtypes[0]):
        if fn in PRECISE_FUNCTIONS:
            return MathCall(f"metal::precise::{fn}({joined})")
        if fn in _CLASSIFY_BITS:
            return MathCall("(" + _CLASSIFY_BITS[fn].format(u=uint_like(arg_dtypes[0]), x=args[0]) + ")")
        if fn == "sigmoid":
            one = float_literal(1.0, dtype)
            return MathCall(precise_divide(one, f"({one} + metal::precise::exp(-({args[0]})))"))
    if fn in HELPERS:
        return MathCall(f"__tlm_{fn}({joined})", {fn})
    if fn == "ldexp":  # MSL takes an integer exponent; TileLang passes a float
        lanes = _lanes(arg_dtypes[1])
        exponent = f"(int)({args[1]})" if lanes == 1 else f"int{lanes}({args[1]})"
        return MathCall(f"metal::ldexp({args[0]}, {exponent})")
    if fn in _FAST:
        base = _FAST[fn]
        return MathCall(f"fast::{base}({joined})" if split_dtype(dtype)[0] == "float32" else f"metal::{base}({joined})")
    if fn == "fast_rcp":
        return MathCall(f"({float_literal(1.0, dtype)} / {args[0]})")
    if fn in _PACKED_OPERATORS:
        return MathCall(f"({args[0]} {_PACKED_OPERATORS[fn]} {args[1]})")
    if fn in _PACKED_FUNCTIONS:
        return MathCall(f"metal::{_PACKED_FUNCTIONS[fn]}({joined})")
    if fn in _IEEE_OPERATORS or fn in _IEEE_PRECISE:
        return _ieee(fn, args, dtype)
    if fn == "sigmoid":
        one = float_literal(1.0, dtype)
        return MathCall(f"({one} / ({one} + exp(-({args[0]}))))")
    if fn in _BUILTINS:
        return MathCall(f"metal::{_BUILTINS[fn]}({joined})")
    return None


def _ieee(fn: str, args: list[str], dtype: str) -> MathCall:
    if fn != "ieee_frsqrt":
        mode, args = args[-1], args[:-1]
        if mode != '"rn"':
            raise CodegenError(f"T.{fn} with rounding mode {mode}: Metal has no per-operation rounding modes; use rounding_mode='rn'")
    if fn in _IEEE_OPERATORS:
        return MathCall(f"({args[0]} {_IEEE_OPERATORS[fn]} {args[1]})")
    if fn == "ieee_frcp":
        args = [float_literal(1.0, dtype), *args]
    space = "precise" if split_dtype(dtype)[0] == "float32" and fn != "ieee_fmaf" else "metal"
    name = _IEEE_PRECISE[fn]
    if space == "metal" and name == "divide":
        return MathCall(f"({args[0]} / {args[1]})")
    return MathCall(f"{space}::{name}({', '.join(args)})")


def helper_definitions(names: set[str]) -> list[str]:
    """The helper functions' MSL, in a fixed order."""
    return [HELPERS[n] for n in sorted(names)]

