"""Precise math (TILELANG_METAL_PRECISE_MATH / pass config tilelang_metal.precise_math): float32
math functions as `metal::precise::` calls, division as `precise::divide`, NaN / infinity tests as
bit tests; run in the emulator against torch, NaN and infinities included."""

from __future__ import annotations

import functools
import math
import re

import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.config import PRECISE_MATH

N = 67  # odd: one threadgroup of 64 threads and a guarded tail
THREADS = 64
# what column c of the output holds (the kernel and _reference list them in this order)
COLUMNS = ("exp", "log", "sin", "cos", "tanh", "sqrt", "div", "sigmoid", "isnan", "isinf", "isfinite", "floordiv", "asin", "atan2")


def _kernel_func():
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32"), Out: T.Tensor((N, len(COLUMNS)), "float32")):
        with T.Kernel(T.ceildiv(N, THREADS), threads=THREADS) as bx:
            for t in T.Parallel(THREADS):
                i = bx * THREADS + t
                if i < N:
                    x, y = X[i], Y[i]
                    Out[i, 0] = T.exp(x)
                    Out[i, 1] = T.log(x)
                    Out[i, 2] = T.sin(x)
                    Out[i, 3] = T.cos(x)
                    Out[i, 4] = T.tanh(x)
                    Out[i, 5] = T.sqrt(x)
                    Out[i, 6] = x / y
                    Out[i, 7] = T.sigmoid(x)
                    Out[i, 8] = T.Cast("float32", T.isnan(x))
                    Out[i, 9] = T.Cast("float32", T.isinf(x))
                    Out[i, 10] = T.Cast("float32", T.isfinite(x))
                    Out[i, 11] = T.floor(x / y)
                    Out[i, 12] = T.asin(y / 4)
                    Out[i, 13] = T.atan2(y, x)

    return main


@functools.lru_cache(maxsize=None)
def kernel(precise: bool):
    return tilelang.compile(_kernel_func(), out_idx=[-1], target="metal", execution_backend="emulator", pass_configs={PRECISE_MATH: precise})


def _inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(N, generator=g) * 6 + 0.01
    y = torch.randn(N, generator=g)
    x[:6] = torch.tensor([math.inf, -math.inf, math.nan, 0.0, -0.0, 1e-30])
    y[:6] = torch.tensor([2.0, 3.0, 1.0, 0.0, 1.0, 3.0])
    y[10] = 0.0
    return x, y


def _reference(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x64, y64 = x.double(), y.double()
    cols = [x64.exp(), x64.log(), x64.sin(), x64.cos(), x64.tanh(), x64.sqrt(), x64 / y64, torch.sigmoid(x64),
            x64.isnan().double(), x64.isinf().double(), x64.isfinite().double(), torch.floor(x64 / y64),
            torch.asin(y64 / 4), torch.atan2(y64, x64)]
    return torch.stack(cols, dim=1).float()


def test_precise_math_prints_precise_calls_and_bit_tests():
    source = kernel(True).get_kernel_source()
    for fn in ("exp", "log", "sin", "cos", "tanh", "sqrt", "divide", "asin", "atan2"):
        assert f"metal::precise::{fn}(" in source, fn
    assert not re.search(r"metal::(exp|log|sin|cos|tanh|sqrt)\(", source)
    assert re.search(r"\(float\)\(\(\(as_type<uint>\(.*\) & 0x7fffffffu\) > 0x7f800000u\)\)", source)  # isnan
    assert "0x7f800000u" in source and "isnan(" not in source and " / " not in source.split("[[kernel")[1]
    default = kernel(False).get_kernel_source()
    assert "precise::" not in default and "metal::exp(" in default


def test_precise_math_matches_torch_with_nan_and_infinities():
    x, y = _inputs()
    want = _reference(x, y)
    for precise in (True, False):
        got = kernel(precise)(x, y)
        for c, name in enumerate(COLUMNS):
            torch.testing.assert_close(got[:, c], want[:, c], rtol=2e-6, atol=1e-6, equal_nan=True, msg=lambda m: f"{name} precise={precise}: {m}")
    racecheck(kernel(True), x, y)
