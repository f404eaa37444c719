"""Metal's NaN rule for max / min: when exactly one operand is NaN the other one is the result (IEEE
754 maxNum / minNum), whichever side the NaN is on; two NaNs give NaN. Checked for every spelling the
printer emits (`max` / `min` from TIR Max / Min, `fmax` / `fmin` from math calls, the packed x2 forms
on vectors, `simd_max` / `simd_min` from reductions) on float, half, bfloat and vectors."""

from __future__ import annotations

import functools
import math

import emu_msl_kernels as K
import torch

from tilelang_metal.emulator import compile_kernel

NAN, INF = math.nan, math.inf
# (x, y) operand pairs: NaN on either side, both NaN, NaN against infinities, signed zeros, numbers.
PAIRS = [(NAN, 1.0), (1.0, NAN), (NAN, NAN), (-INF, NAN), (NAN, INF), (NAN, -3.5), (0.0, -0.0), (-0.0, 0.0),
         (2.0, 3.0), (-1.0, -5.0), (INF, -INF), (0.25, 0.25)]
SCALAR_TYPES = ("float", "half", "bfloat")
FUNCTIONS = ("max", "min", "fmax", "fmin", "precise::max", "precise::min")


@functools.lru_cache(maxsize=None)
def pairwise_kernel():
    """Y[s, t] = F(X[t], X2[t]) for every (function, type) spelling s; vectors of 4 and 2 lanes put
    the pair in both orders (lanes 0 / 1)."""
    lines = ["  float x = X[((int)threadIdx.x)];", "  float y = X2[((int)threadIdx.x)];", "  int t = ((int)threadIdx.x);"]
    slot = 0
    for ty in SCALAR_TYPES:
        for fn in FUNCTIONS:
            lines.append(f"  Y[(({slot} * 64) + t)] = ((float){fn}(({ty})x, ({ty})y));")
            slot += 1
    for vec in ("float4", "half2", "bfloat2"):
        lanes = int(vec[-1])
        args = ", ".join(["x", "y"] * (lanes // 2))
        swapped = ", ".join(["y", "x"] * (lanes // 2))
        for fn in ("max", "min"):
            lines.append(f"  {vec} {fn}_{vec} = {fn}({vec}({args}), {vec}({swapped}));")
            for lane in (0, 1):  # lane 0 is F(x, y), lane 1 is F(y, x)
                lines.append(f"  Y[(({slot} * 64) + t)] = ((float){fn}_{vec}[{lane}]);")
                slot += 1
    src = K.header("nan_max_min") + (
        "[[kernel, max_total_threads_per_threadgroup(64)]] void nan_max_min(\n"
        "  const device float* __restrict X [[ buffer(0) ]],\n"
        "  const device float* __restrict X2 [[ buffer(1) ]],\n"
        "  device float* __restrict Y [[ buffer(2) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n" + "\n".join(lines) + "\n}\n"
    )
    return compile_kernel(src), slot


def maxnum_reference(kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """torch.fmax / fmin, with +0 the larger of two zeros (torch leaves the zero's sign open)."""
    r = torch.fmax(x, y) if kind == "max" else torch.fmin(x, y)
    both_zero = (x == 0) & (y == 0)
    zero_sign = (torch.signbit(x) & torch.signbit(y)) if kind == "max" else (torch.signbit(x) | torch.signbit(y))
    return torch.where(both_zero, torch.where(zero_sign, -0.0, 0.0), r)


def assert_bitwise_equal_or_both_nan(got: torch.Tensor, want: torch.Tensor, msg: str) -> None:
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=msg)
    same = torch.signbit(got) == torch.signbit(want)
    assert bool((same | want.isnan()).all()), f"{msg}: sign of zero differs: got {got.tolist()}, want {want.tolist()}"


def test_every_max_min_spelling_returns_the_number_when_one_operand_is_nan():
    kernel, slots = pairwise_kernel()
    x = torch.randn(64)
    y = torch.randn(64)
    for i, (a, b) in enumerate(PAIRS):
        x[i], y[i] = a, b
    out = torch.zeros(slots * 64)
    kernel.launch([x, y, out], (1, 1, 1), (64, 1, 1))
    out = out.view(slots, 64)
    slot = 0
    for ty in SCALAR_TYPES:
        to = {"float": torch.float32, "half": torch.float16, "bfloat": torch.bfloat16}[ty]
        xt, yt = x.to(to).float(), y.to(to).float()
        for fn in FUNCTIONS:
            kind = "max" if fn.endswith("max") else "min"
            assert_bitwise_equal_or_both_nan(out[slot], maxnum_reference(kind, xt, yt), f"{fn}({ty}, {ty})")
            slot += 1
    for vec in ("float4", "half2", "bfloat2"):
        to = {"f": torch.float32, "h": torch.float16, "b": torch.bfloat16}[vec[0]]
        xt, yt = x.to(to).float(), y.to(to).float()
        for fn in ("max", "min"):
            for lane in (0, 1):
                want = maxnum_reference(fn, xt, yt) if lane == 0 else maxnum_reference(fn, yt, xt)
                assert_bitwise_equal_or_both_nan(out[slot], want, f"{fn}({vec}) lane {lane}")
                slot += 1
    assert slot == slots


@functools.lru_cache(maxsize=None)
def simd_reduction_kernel():
    """R[kind, simdgroup] = simd_max / simd_min of X over each simdgroup, in float and in half."""
    src = K.header("nan_simd_max_min") + (
        "[[kernel, max_total_threads_per_threadgroup(128)]] void nan_simd_max_min(\n"
        "  const device float* __restrict X [[ buffer(0) ]],\n"
        "  device float* __restrict R [[ buffer(1) ]],\n"
        "  uint3 threadIdx [[thread_position_in_threadgroup]]) {\n"
        "  int t = ((int)threadIdx.x);\n"
        "  float v = X[t];\n"
        "  float mx = simd_max(v);\n"
        "  float mn = simd_min(v);\n"
        "  half hmx = simd_max((half)v);\n"
        "  half hmn = simd_min((half)v);\n"
        "  if (((t % 32) == 0)) {\n"
        "    R[(t >> 5)] = mx;\n"
        "    R[((t >> 5) + 4)] = mn;\n"
        "    R[((t >> 5) + 8)] = ((float)hmx);\n"
        "    R[((t >> 5) + 12)] = ((float)hmn);\n"
        "  }\n"
        "}\n"
    )
    return compile_kernel(src)


def test_simd_max_min_ignore_a_nan_on_any_lane():
    """Four simdgroups: NaN on the first lane, a middle lane, the last lane, and on every lane."""
    x = torch.randn(4, 32)
    x[0, 0] = x[1, 13] = x[2, 31] = NAN
    x[3, :] = NAN
    r = torch.zeros(16)
    simd_reduction_kernel().launch([x.reshape(-1), r], (1, 1, 1), (128, 1, 1))
    finite = torch.where(x.isnan(), -INF, x).amax(1), torch.where(x.isnan(), INF, x).amin(1)
    for k, (name, want) in enumerate((("simd_max", finite[0]), ("simd_min", finite[1]))):
        want = want.clone()
        want[3] = NAN  # all lanes NaN
        torch.testing.assert_close(r[4 * k : 4 * k + 4], want, rtol=0, atol=0, equal_nan=True, msg=name)
        torch.testing.assert_close(r[8 + 4 * k : 12 + 4 * k], want.half().float(), rtol=0, atol=0, equal_nan=True, msg=f"{name} half")
