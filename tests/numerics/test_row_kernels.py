"""kernels.softmax and kernels.reduce_rows (row sum / max over the last axis) in the emulator
against torch: ragged and prime column counts, one column, one block of 4096, several blocks
(4099: a last block of 3 columns), fp16 / bf16 / fp32, non-finite rows, race checker.
Kernels are compiled once per shape (lru_cache); the wide rows (5-10 s each) are in
tests/slow/test_row_kernels_wide.py."""

from __future__ import annotations

import functools
import math

import pytest
import tilelang
import torch

from tilelang_metal import kernels
from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.kernels.reduce_rows import row_blocking

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOL = {"float32": (1e-5, 1e-6), "float16": (2e-3, 1e-4), "bfloat16": (1e-2, 1e-3)}


@functools.lru_cache(maxsize=None)
def row_kernel(name: str, rows: int, cols: int, dtype: str = "float32"):
    func = kernels.softmax(rows, cols, dtype=dtype) if name == "softmax" else kernels.reduce_rows(rows, cols, name, dtype=dtype)
    return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator")


def reference(name: str, x: torch.Tensor) -> torch.Tensor:
    wide = x.float()
    out = torch.softmax(wide, -1) if name == "softmax" else wide.sum(-1) if name == "sum" else wide.amax(-1)
    return out.to(x.dtype)


def with_non_finite_rows(x: torch.Tensor) -> torch.Tensor:
    """Row 0: a NaN; row 1: a +inf; row 2: a -inf among finite values; row 3: only -inf."""
    x = x.clone()
    cols = x.shape[1]
    x[0, cols // 2] = math.nan
    x[1, cols - 1] = math.inf
    x[2, 0] = -math.inf
    x[3, :] = -math.inf
    return x


SHAPES = [(5, 37), (6, 1), (67, 130)]  # the 4096 / 4099-column rows: tests/slow/test_row_kernels_wide.py


@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
@pytest.mark.parametrize("rows, cols", SHAPES)
def test_row_kernels_match_torch(name, rows, cols):
    torch.manual_seed(rows * cols)
    x = torch.randn(rows, cols) * 4
    out = racecheck(row_kernel(name, rows, cols), x, seeds=(0, 1)) if rows * cols <= 512 else row_kernel(name, rows, cols)(x)
    rtol, atol = TOL["float32"]
    if name == "sum":
        atol = 1e-5 * math.sqrt(cols) * 4
    torch.testing.assert_close(out, reference(name, x), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
@pytest.mark.parametrize("rows, cols", [(5, 37), (5, 300)])  # packed rows; one simdgroup per row
def test_non_finite_rows_match_torch(name, rows, cols):
    """NaN propagates through all three (max like torch.amax, not Metal's NaN-ignoring max); a
    row with +inf is NaN under softmax; -inf gets probability 0; a row of only -inf is NaN
    under softmax and -inf for max."""
    if rows < 4:
        rows = 4
    torch.manual_seed(1)
    x = with_non_finite_rows(torch.randn(rows, cols))
    out = row_kernel(name, rows, cols)(x)
    torch.testing.assert_close(out, reference(name, x), rtol=1e-5, atol=1e-5 * math.sqrt(cols), equal_nan=True)
    if name == "max":
        assert math.isnan(out[0]) and out[1] == math.inf and out[3] == -math.inf


def test_softmax_column_blocks_of_only_minus_infinity():
    """4097 columns (two column blocks): a first block of only -inf summed exp(-inf - -inf) = NaN
    into the running denominator, and the whole row came out NaN (torch: one-hot). Row 1: -inf
    then a NaN in the second block (NaN row); row 2: only -inf (NaN row)."""
    x = torch.full((3, 4097), -math.inf)
    x[0, 4096] = 2.0
    x[1, 4096] = math.nan
    out = row_kernel("softmax", 3, 4097)(x)
    torch.testing.assert_close(out, reference("softmax", x), rtol=0, atol=0, equal_nan=True)
    assert out[0, 4096] == 1.0 and torch.isnan(out[1:]).all()


@pytest.mark.parametrize("name", ["softmax", "sum", "max"])
@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])  # bf16 in the quick tier: the GEMM tests
def test_half_inputs_accumulate_in_float32(name, dtype):
    rows, cols = 7, 301
    torch.manual_seed(2)
    x = (torch.randn(rows, cols) + 2).to(TORCH[dtype])  # sums of ~600: fp16 accumulation would lose bits
    kernel = row_kernel(name, rows, cols, dtype)
    out = racecheck(kernel, x, seeds=(0, 1))
    assert out.dtype == TORCH[dtype]
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.float(), reference(name, x).float(), rtol=rtol, atol=atol)


@pytest.mark.parametrize("name", ["sum", "max"])
def test_long_rows_reduce_one_per_simdgroup_without_threadgroup_memory(name):
    """Rows of 512 floats (at least one simdgroup's worth of 16-byte runs): one simdgroup per row,
    each lane one float4 load per 128 columns, one simd collective; nothing goes through
    threadgroup memory or waits at a barrier (the packed layout's T.reduce_* did both)."""
    rows, cols = 9, 512
    kernel = row_kernel(name, rows, cols)
    x = torch.randn(rows, cols)
    torch.testing.assert_close(racecheck(kernel, x, seeds=(0, 1)), reference(name, x), rtol=1e-5, atol=1e-4)
    total = counters(kernel, x).total
    assert total["device_load_instructions"] == rows * cols // 4 and total["narrow_device_loads"] == 0, total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0
    assert ("simd_sum(" if name == "sum" else "simd_max(") in kernel.get_kernel_source()


def test_row_blocking_covers_wide_and_narrow_rows():
    assert row_blocking(3, 4096, 128) == (1, 4096)
    assert row_blocking(3, 4099, 128) == (1, 4096)  # two column blocks
    assert row_blocking(100, 37, 128) == (64, 64)
    assert row_blocking(1, 1, 128) == (1, 32)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.softmax(0, 8), r"softmax needs rows >= 1 and cols >= 1 \(got 0x8\)"),
        (lambda: kernels.reduce_rows(4, 0), r"row sum needs rows >= 1 and cols >= 1"),
        (lambda: kernels.reduce_rows(4, 4, "mean"), r"reduce_rows kind='mean' is not supported; use one of sum, max"),
        (lambda: kernels.softmax(4, 4, dtype="int8"), r"softmax dtype='int8' is not supported"),
        (lambda: kernels.softmax(4, 4, threads=100), r"threads=100 must be a power of two from 32 to 1024"),
        # 96 and 160 are whole simdgroups but do not split the power-of-two blocks: row sum / max of 3x33
        # failed in layout inference with advice to pad a tile the caller does not own
        (lambda: kernels.reduce_rows(3, 33, "sum", threads=96), r"threads=96 must be a power of two.*use 128 or 256"),
        (lambda: kernels.softmax(5, 7, threads=160), r"threads=160 must be a power of two"),
        # sizes that are not integers: were an AttributeError on bit_length, or for a bool a TVM dump
        (lambda: kernels.softmax(3.0, 7), r"softmax rows=3.0 must be an integer \(a float was given\); pass int\(rows\)"),
        (lambda: kernels.reduce_rows(3, True, "sum"), r"row sum cols=True must be an integer"),
    ],
)
def test_bad_requests_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_numpy_integer_sizes_build_the_same_kernel():
    """numpy integers (shapes read from arrays) were refused with "'numpy.int64' object has no
    attribute 'bit_length'"; they now build what the ints build."""
    import numpy as np

    assert kernels.softmax(np.int64(5), np.int32(37)).script() == kernels.softmax(5, 37).script()
    assert kernels.reduce_rows(np.int64(6), np.int64(1), "max", threads=np.int64(64)).script() == kernels.reduce_rows(6, 1, "max", threads=64).script()
