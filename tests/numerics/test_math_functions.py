"""Every math function TileLang exposes, compiled for Metal and run in the emulator against torch.

One kernel per dtype computes every function (row f of the output holds function f applied to
row f of the inputs, each row drawn from that function's domain), so the file compiles two float
kernels, one integer kernel per dtype and one packed-x2 kernel.

Tolerances allow for Metal's fast math on a real GPU (the runtime compiles with fast math on): the
emulator computes with the host's libm, but the checks must hold on both. fp32 transcendental
functions: rtol 1e-3 (fast-math `exp`/`log`/trig are accurate to a few 1e-6 relative over these
domains; 1e-3 leaves room and still catches a wrong function or a wrong formula); fp16: rtol 4e-3,
atol 2e-3 (a few half ulps: 2^-10 relative each). Exact functions (rounding, sign, min/max, clamp,
classification, ldexp, fmod, IEEE round-to-nearest arithmetic) compare exactly; nextafter bit for bit.
"""

from __future__ import annotations

import hashlib
import importlib.util
import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest
import tilelang
import tilelang.language as T
import torch

N = 128
TORCH = {"float32": torch.float32, "float16": torch.float16}
EXACT = "exact"
TRANSCENDENTAL = "transcendental"


def _lin(lo: float, hi: float) -> torch.Tensor:
    return torch.linspace(lo, hi, N, dtype=torch.float64)


def _log1p_domain() -> torch.Tensor:
    # tiny values (the series branch), both sides of the 1/16 switch, and large values
    small = torch.logspace(-7, -1.3, N // 4, dtype=torch.float64)
    return torch.cat([small, -small, _lin(-0.9, 0.05)[: N // 4], _lin(0.05, 20.0)[: N // 4]])


def _tiny_and(lo: float, hi: float) -> torch.Tensor:
    """Values down to 1e-7 of both signs (where cancellation in a formula shows), then [lo, hi]."""
    tiny = torch.logspace(-7, -1, N // 4, dtype=torch.float64)
    return torch.cat([tiny, -tiny, torch.linspace(lo, hi, N // 2, dtype=torch.float64)])


def _rounding_domain() -> torch.Tensor:
    x = _lin(-5.3, 5.3)
    x[:8] = torch.tensor([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 3.5, -3.5], dtype=torch.float64)  # half-way cases
    return x


def _special_domain() -> torch.Tensor:
    x = _lin(-3.0, 3.0)
    x[:6] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, math.nan], dtype=torch.float64)
    return x


def _signed(lo: float, hi: float) -> torch.Tensor:
    x = _lin(lo, hi)
    return x * torch.where(torch.arange(N) % 2 == 0, 1.0, -1.0).double()


# name -> (TileLang call in the kernel, number of inputs, input domains, torch reference on float64, kind)
UNARY = {
    "exp": ("T.exp", (_lin(-5, 5),), torch.exp, TRANSCENDENTAL),
    "exp2": ("T.exp2", (_lin(-6, 6),), torch.exp2, TRANSCENDENTAL),
    "exp10": ("T.exp10", (_lin(-2, 2),), lambda x: torch.pow(10.0, x), TRANSCENDENTAL),
    "log": ("T.log", (_lin(0.01, 20),), torch.log, TRANSCENDENTAL),
    "log2": ("T.log2", (_lin(0.01, 20),), torch.log2, TRANSCENDENTAL),
    "log10": ("T.log10", (_lin(0.01, 20),), torch.log10, TRANSCENDENTAL),
    "log1p": ("T.log1p", (_log1p_domain(),), torch.log1p, TRANSCENDENTAL),
    "sqrt": ("T.sqrt", (_lin(0, 20),), torch.sqrt, TRANSCENDENTAL),
    "rsqrt": ("T.rsqrt", (_lin(0.05, 20),), torch.rsqrt, TRANSCENDENTAL),
    "sin": ("T.sin", (_tiny_and(-6, 6),), torch.sin, TRANSCENDENTAL),
    "cos": ("T.cos", (_lin(-6, 6),), torch.cos, TRANSCENDENTAL),
    "tan": ("T.tan", (_tiny_and(-1.4, 1.4),), torch.tan, TRANSCENDENTAL),
    "asin": ("T.asin", (_tiny_and(-1, 1),), torch.asin, TRANSCENDENTAL),
    "acos": ("T.acos", (_lin(-1, 1),), torch.acos, TRANSCENDENTAL),
    "atan": ("T.atan", (_tiny_and(-10, 10),), torch.atan, TRANSCENDENTAL),
    "sinh": ("T.sinh", (_tiny_and(-5, 5),), torch.sinh, TRANSCENDENTAL),
    "cosh": ("T.cosh", (_lin(-5, 5),), torch.cosh, TRANSCENDENTAL),
    "tanh": ("T.tanh", (_tiny_and(-6, 6),), torch.tanh, TRANSCENDENTAL),
    "asinh": ("T.asinh", (_tiny_and(-10, 10),), torch.asinh, TRANSCENDENTAL),
    "acosh": ("T.acosh", (_lin(1, 10),), torch.acosh, TRANSCENDENTAL),
    "atanh": ("T.atanh", (_tiny_and(-0.95, 0.95),), torch.atanh, TRANSCENDENTAL),
    "erf": ("T.erf", (_tiny_and(-3.5, 3.5),), torch.erf, TRANSCENDENTAL),
    "sigmoid": ("T.sigmoid", (_lin(-10, 10),), torch.sigmoid, TRANSCENDENTAL),
    "fast_exp": ("T.__exp", (_lin(-5, 5),), torch.exp, TRANSCENDENTAL),
    "fast_exp10": ("T.__exp10", (_lin(-2, 2),), lambda x: torch.pow(10.0, x), TRANSCENDENTAL),
    "fast_log": ("T.__log", (_lin(0.01, 20),), torch.log, TRANSCENDENTAL),
    "fast_log2": ("T.__log2", (_lin(0.01, 20),), torch.log2, TRANSCENDENTAL),
    "fast_log10": ("T.__log10", (_lin(0.01, 20),), torch.log10, TRANSCENDENTAL),
    "fast_sin": ("T.__sin", (_lin(-3, 3),), torch.sin, TRANSCENDENTAL),
    "fast_cos": ("T.__cos", (_lin(-3, 3),), torch.cos, TRANSCENDENTAL),
    "fast_tan": ("T.__tan", (_lin(-1.2, 1.2),), torch.tan, TRANSCENDENTAL),
    "fast_rcp": ("T.fast_rcp", (_signed(0.1, 10),), torch.reciprocal, TRANSCENDENTAL),
    "ieee_frcp": ("T.ieee_frcp", (_signed(0.1, 10),), torch.reciprocal, EXACT),
    "ieee_fsqrt": ("T.ieee_fsqrt", (_lin(0, 20),), torch.sqrt, EXACT),
    "ieee_frsqrt": ("T.ieee_frsqrt", (_lin(0.05, 20),), torch.rsqrt, TRANSCENDENTAL),
    "floor": ("T.floor", (_rounding_domain(),), torch.floor, EXACT),
    "ceil": ("T.ceil", (_rounding_domain(),), torch.ceil, EXACT),
    "trunc": ("T.trunc", (_rounding_domain(),), torch.trunc, EXACT),
    "round": ("T.round", (_rounding_domain(),), torch.round, EXACT),  # half to even, like torch
    "nearbyint": ("T.nearbyint", (_rounding_domain(),), torch.round, EXACT),
    "abs": ("T.abs", (_signed(0, 5),), torch.abs, EXACT),
    "fabs": ("T.fabs", (_signed(0, 5),), torch.abs, EXACT),
    "isnan": ("T.isnan", (_special_domain(),), lambda x: torch.isnan(x).double(), EXACT),
    "isinf": ("T.isinf", (_special_domain(),), lambda x: torch.isinf(x).double(), EXACT),
    "isfinite": ("T.isfinite", (_special_domain(),), lambda x: torch.isfinite(x).double(), EXACT),
}
BINARY = {
    "pow": ("T.pow", (_lin(0.1, 4), _signed(0, 2)), torch.pow, TRANSCENDENTAL),
    "atan2": ("T.atan2", (_signed(0.1, 5), _lin(-5, 5)), torch.atan2, TRANSCENDENTAL),
    "hypot": ("T.hypot", (_signed(0, 30), _lin(-7, 3)), torch.hypot, TRANSCENDENTAL),
    "fmod": ("T.fmod", (_lin(-10, 10), _signed(0.7, 3)), torch.fmod, TRANSCENDENTAL),
    "copysign": ("T.copysign", (_lin(0, 5), _signed(0.1, 1)), torch.copysign, EXACT),
    "ldexp": ("T.ldexp", (_lin(-3, 3), torch.arange(N, dtype=torch.float64) % 9 - 4), lambda x, k: torch.ldexp(x, k), EXACT),
    "max": ("T.max", (_lin(-3, 3), _signed(0, 3)), torch.maximum, EXACT),
    # IEEE round-to-nearest arithmetic: correctly rounded, so exact against the rounded float64 result
    "ieee_add": ("T.ieee_add", (_lin(-3, 3), _signed(0.001, 3)), torch.add, EXACT),
    "ieee_sub": ("T.ieee_sub", (_lin(-3, 3), _signed(0.001, 3)), torch.sub, EXACT),
    "ieee_mul": ("T.ieee_mul", (_lin(-3, 3), _signed(0.001, 3)), torch.mul, EXACT),
    "ieee_fdiv": ("T.ieee_fdiv", (_lin(-3, 3), _signed(0.1, 3)), torch.div, EXACT),
    "min": ("T.min", (_lin(-3, 3), _signed(0, 3)), torch.minimum, EXACT),
}
TERNARY = {
    "fma": ("T.fma", (_lin(-3, 3), _signed(0.5, 2), _lin(-1, 1)), lambda a, b, c: a * b + c, TRANSCENDENTAL),
    "ieee_fmaf": ("T.ieee_fmaf", (_lin(-3, 3), _signed(0.5, 2), _lin(-1, 1)), lambda a, b, c: a * b + c, TRANSCENDENTAL),
    "clamp": ("T.clamp", (_lin(-3, 3), _lin(-2, -0.5), _lin(0.25, 1.5)), lambda x, lo, hi: torch.minimum(torch.maximum(x, lo), hi), EXACT),
}
FUNCTIONS = {**UNARY, **BINARY, **TERNARY}
NAMES = list(FUNCTIONS)
# nextafter is exact in its own dtype, so it is checked against numpy on the rounded inputs
NEXTAFTER_ROW = len(NAMES)


def _kernel_source(dtype: str) -> str:
    rows = len(NAMES) + 1
    lines = []
    for f, name in enumerate(NAMES):
        call, domains, _, _ = FUNCTIONS[name]
        args = ", ".join(f"{x}[{f}, i]" for x in ("X", "Y", "Z")[: len(domains)])
        value = f"{call}({args})"
        if name in ("isnan", "isinf", "isfinite"):
            value = f"T.cast({value}, '{dtype}')"
        lines.append(f"                Out[{f}, i] = {value}")
    lines.append(f"                Out[{NEXTAFTER_ROW}, i] = T.nextafter(X[{NEXTAFTER_ROW}, i], Y[{NEXTAFTER_ROW}, i])")
    body = "\n".join(lines)
    return f"""
import tilelang.language as T


@T.prim_func
def all_math(X: T.Tensor(({rows}, {N}), "{dtype}"), Y: T.Tensor(({rows}, {N}), "{dtype}"),
             Z: T.Tensor(({rows}, {N}), "{dtype}"), Out: T.Tensor(({rows}, {N}), "{dtype}")):
    with T.Kernel(1, threads={N}) as bx:
        for i in T.Parallel({N}):
{body}
"""


def _import_source(source: str, name: str):
    """`source` imported as a module from a file named by its content: the file's path is in the
    kernel's spans, hence in its lowering-cache key, so a fresh temporary directory per run made
    every run lower these kernels again."""
    folder = Path(tempfile.gettempdir()) / "tilelang_metal_test_sources"
    folder.mkdir(exist_ok=True)
    path = folder / f"{name}_{hashlib.sha256(source.encode()).hexdigest()[:16]}.py"
    if not path.exists():
        part = path.with_suffix(f".{os.getpid()}.part")
        part.write_text(source)
        os.replace(part, path)  # whole files only: another worker may be importing it
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_kernel(dtype: str):
    module = _import_source(_kernel_source(dtype), f"math_kernel_{dtype}")
    return tilelang.compile(module.all_math, target="metal", execution_backend="emulator")


def _inputs(dtype: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    rows = len(NAMES) + 1
    planes = [torch.zeros(rows, N, dtype=torch.float64) for _ in range(3)]
    for f, name in enumerate(NAMES):
        for plane, domain in zip(planes, FUNCTIONS[name][1]):
            plane[f] = domain
    g = torch.Generator().manual_seed(3)
    planes[0][NEXTAFTER_ROW] = torch.randn(N, generator=g, dtype=torch.float64) * 3
    planes[0][NEXTAFTER_ROW, :4] = torch.tensor([0.0, -0.0, 1.0, 2.0], dtype=torch.float64)
    planes[1][NEXTAFTER_ROW] = torch.where(torch.arange(N) % 3 == 0, math.inf, -math.inf).double()
    planes[1][NEXTAFTER_ROW, 2] = 1.0  # x == y returns y
    return tuple(p.to(TORCH[dtype]) for p in planes)


@pytest.fixture(scope="module", params=["float32", "float16"])
def math_run(request):
    dtype = request.param
    kernel = _load_kernel(dtype)
    x, y, z = _inputs(dtype)
    out = torch.zeros_like(x)
    kernel(x, y, z, out)
    return dtype, kernel.get_kernel_source(), (x, y, z), out


def _tolerance(kind: str, dtype: str) -> tuple[float, float]:
    if kind == EXACT:
        return 0.0, 0.0
    return (1e-3, 1e-5) if dtype == "float32" else (4e-3, 2e-3)


@pytest.mark.parametrize("name", NAMES)
def test_math_function_matches_torch(math_run, name):
    dtype, _, inputs, out = math_run
    f = NAMES.index(name)
    _, domains, reference, kind = FUNCTIONS[name]
    args = [p[f].double() for p in inputs[: len(domains)]]  # the inputs as rounded to dtype
    expected = reference(*args).to(TORCH[dtype]).double()  # what a correctly rounded result would be
    rtol, atol = _tolerance(kind, dtype)
    torch.testing.assert_close(out[f].double(), expected, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{name} ({dtype}): {m}")


def test_nextafter_steps_one_ulp(math_run):
    dtype, _, (x, y, _), out = math_run
    np_dtype = np.float32 if dtype == "float32" else np.float16
    expected = np.nextafter(x[NEXTAFTER_ROW].numpy().astype(np_dtype), y[NEXTAFTER_ROW].numpy().astype(np_dtype))
    got = out[NEXTAFTER_ROW].numpy()
    assert np.array_equal(got.view(np.uint32 if dtype == "float32" else np.uint16), expected.view(got.dtype).view(np.uint32 if dtype == "float32" else np.uint16))


def test_no_c_library_names_in_source(math_run):
    """The MSL calls Metal's names (or the plugin's helpers), never libm's float spellings."""
    _, source, _, _ = math_run
    for c_name in ("expf", "logf", "log1pf", "erff", "atan2f", "hypotf", "nextafterf", "ldexpf", "nearbyint(", "tanf", "acoshf", "copysignf"):
        assert c_name not in source, c_name
    for helper in ("__tlm_log1p", "__tlm_hypot", "__tlm_nextafter"):
        assert source.count(f" {helper}(") >= 1 and source.count(f"inline float {helper}(") + source.count(f"inline T {helper}(") == 1, helper


@T.prim_func
def packed_x2(A: T.Tensor((2 * N,), "float32"), B: T.Tensor((2 * N,), "float32"), C: T.Tensor((2 * N,), "float32"), D: T.Tensor((2 * N,), "float32")):
    with T.Kernel(1, threads=N) as bx:
        for i in T.Parallel(N):
            C[T.Ramp(2 * i, 1, 2)] = T.add2(T.max2(A[T.Ramp(2 * i, 1, 2)], B[T.Ramp(2 * i, 1, 2)]), T.abs2(T.sub2(A[T.Ramp(2 * i, 1, 2)], B[T.Ramp(2 * i, 1, 2)])))
            D[T.Ramp(2 * i, 1, 2)] = T.fma2(T.min2(A[T.Ramp(2 * i, 1, 2)], B[T.Ramp(2 * i, 1, 2)]), T.mul2(A[T.Ramp(2 * i, 1, 2)], B[T.Ramp(2 * i, 1, 2)]), A[T.Ramp(2 * i, 1, 2)])


def test_packed_x2_arithmetic():
    kernel = tilelang.compile(packed_x2, target="metal", execution_backend="emulator")
    assert "float2" in kernel.get_kernel_source()
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(2 * N, generator=g), torch.randn(2 * N, generator=g)
    c, d = torch.zeros(2 * N), torch.zeros(2 * N)
    kernel(a, b, c, d)
    torch.testing.assert_close(c, torch.maximum(a, b) + (a - b).abs(), rtol=0, atol=0)
    torch.testing.assert_close(d, torch.minimum(a, b) * (a * b) + a, rtol=1e-6, atol=1e-6)


def test_ieee_rounding_modes_other_than_nearest_are_refused():
    from tilelang_metal.errors import CodegenError

    @T.prim_func
    def toward_zero(A: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
        with T.Kernel(1, threads=N) as bx:
            for i in T.Parallel(N):
                C[i] = T.ieee_add(A[i], A[i], "rz")

    with pytest.raises(CodegenError, match="rounding_mode='rn'"):
        tilelang.compile(toward_zero, target="metal", execution_backend="emulator")


INT_SOURCE = """
import tilelang.language as T


@T.prim_func
def bit_counts(X: T.Tensor(({n},), "{dtype}"), Pop: T.Tensor(({n},), "{dtype}"), Clz: T.Tensor(({n},), "{dtype}"),
               Ctz: T.Tensor(({n},), "{dtype}")):
    with T.Kernel(1, threads={n}) as bx:
        for i in T.Parallel({n}):
            Pop[i] = T.popcount(X[i])
            Clz[i] = T.clz(X[i])
            Ctz[i] = T.call_pure_extern("{dtype}", "ctz", X[i])  # TileLang has no T.ctz; MSL's name
"""
INT_BITS = {"int32": 32, "uint32": 32, "int64": 64}


def _bit_reference(values: list[int], bits: int) -> tuple[list[int], list[int], list[int]]:
    pops, clzs, ctzs = [], [], []
    for v in values:
        u = v & ((1 << bits) - 1)
        pops.append(bin(u).count("1"))
        clzs.append(bits - u.bit_length())
        ctzs.append(bits if u == 0 else (u & -u).bit_length() - 1)
    return pops, clzs, ctzs


@pytest.mark.parametrize("dtype", list(INT_BITS))
def test_integer_bit_counts_match_python(dtype):
    n, bits = 64, INT_BITS[dtype]
    module = _import_source(INT_SOURCE.format(n=n, dtype=dtype), f"bits_{dtype}")
    kernel = tilelang.compile(module.bit_counts, target="metal", execution_backend="emulator")
    source = kernel.get_kernel_source()
    assert "popcount(" in source and "clz(" in source and "ctz(" in source
    g = torch.Generator().manual_seed(4)
    signed = dtype.startswith("int")
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    values = [0, 1, -1 if signed else hi, lo, hi, 1 << (bits - 2), 12345, 6 << 20]
    values += [int(v) for v in torch.randint(-(2**31), 2**31 - 1, (n - len(values),), generator=g, dtype=torch.int64)]
    values = [max(lo, min(hi, v)) if signed else v & hi for v in values]
    torch_dtype = {"int32": torch.int32, "uint32": torch.uint32, "int64": torch.int64}[dtype]
    x = torch.tensor(values, dtype=torch.int64).to(torch_dtype)
    outs = [torch.zeros(n, dtype=torch_dtype) for _ in range(3)]
    kernel(x, *outs)
    for got, want, what in zip(outs, _bit_reference(values, bits), ("popcount", "clz", "ctz")):
        assert got.to(torch.int64).tolist() == want, what


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_clamp_in_a_vectorized_loop_matches_torch(dtype):
    """A T.Parallel loop vectorizes; TVM scalarizes the lane-wise `tl.clamp` there as per-lane vector
    shuffles (`Shuffle([v], [k])` joined by `Shuffle([s0..s3], [0..3])`), which the printer prints
    as components `.x`-`.w` and a vector constructor. NaN propagates, inf is clamped (torch.clamp)."""
    n, rows = 128, 4

    @T.prim_func
    def main(X: T.Tensor((rows, n), dtype), Lo: T.Tensor((rows,), dtype), Y: T.Tensor((rows, n), dtype)):
        with T.Kernel(1, threads=32):
            for i, j in T.Parallel(rows, n):
                Y[i, j] = T.cast(T.round(T.clamp(X[i, j], Lo[i], 1.5)), dtype)  # uses dtype: the annotations see it

    kernel = tilelang.compile(main, target="metal", execution_backend="emulator")
    assert "4(" in kernel.get_kernel_source()  # the loop stayed vectorized
    x = torch.linspace(-3, 3, rows * n).reshape(rows, n).to(TORCH[dtype])
    x[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), 1.49])
    lo = torch.tensor([-1.0, -2.5, float("nan"), 0.25], dtype=TORCH[dtype])
    y = torch.empty_like(x)
    kernel(x, lo, y)
    want = torch.round(torch.maximum(x, lo[:, None]).clamp(max=1.5))  # torch.clamp has no tensor min with NaN
    want[2] = float("nan")  # a NaN bound gives NaN
    torch.testing.assert_close(y, want, rtol=0, atol=0, equal_nan=True)
