"""MLX's row and column reductions, unmodified, in the emulator, against torch in float64.

mlx_reduce.py picks the kernel as reduce.cpp does; each case asserts which one ran, so a shape
change that silently moves a case onto another kernel shows up.
"""

from __future__ import annotations

import pytest
import torch

from tilelang_metal.emulator.foreign import memory_counts_unavailable

from mlx_reduce import col_reduce, row_reduce

# Sums only in float32: MLX reduces float16 / bfloat16 in their own type (reduce.cpp,
# remap_reduce_types), so its half sums differ from a float-accumulated reference by a few half ulps
# (docs/emulator.md); maxima are exact in every type.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _reference(x: torch.Tensor, axes: tuple[int, ...], op: str) -> torch.Tensor:
    return x.double().sum(axes) if op == "sum" else x.double().amax(axes)


def _check(out, x, axes, op):
    rtol, atol = TOL[x.dtype]
    torch.testing.assert_close(out.double(), _reference(x, axes, op), rtol=rtol, atol=atol, equal_nan=True)


# (shape, axes, op, dtype, kernel reduce.cpp picks)
ROW_CASES = [
    ((5, 37), (1,), "sum", torch.float32, "row_reduce_small"),  # a thread per output, 37 = 9 reads of 4 + 1
    ((12, 5, 13), (0, 2), "max", torch.float32, "row_reduce_small"),  # 12 non-row reductions: a simdgroup per output
    ((41, 301), (1,), "sum", torch.float32, "row_reduce_simple"),  # 41 rows: the last threadgroup's 4 outputs overlap
    ((33, 130), (1,), "max", torch.float16, "row_reduce_simple"),
    ((3, 5, 100), (0, 2), "sum", torch.float32, "row_reduce_looped"),  # 3 rows reduced into each output
    ((7, 2000), (1,), "max", torch.bfloat16, "row_reduce_looped"),  # 500 threads (16 simdgroups) per row
]


@pytest.mark.parametrize("shape,axes,op,dtype,expected", ROW_CASES)
def test_row_reduce(mlx_include, shape, axes, op, dtype, expected):
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)
    kernel, launch = row_reduce(x, axes, op, include=mlx_include)
    assert kernel == expected
    _check(launch.run(), x, axes, op)


# (R, C, op, kernel reduce.cpp picks); reduced over R
COL_CASES = [
    (17, 45, "sum", "col_reduce_small"),  # 17 rows < 32; 45 columns: a partial read of 4 at the end
    (100, 67, "max", "col_reduce_looped"),  # BM = BN = 32 tile, 67 columns: a partial last tile
    (513, 70, "sum", "col_reduce_2pass"),  # > 256 rows: 32 partial rows, then col_reduce_looped over them
]


@pytest.mark.parametrize("R,C,op,expected", COL_CASES)
def test_col_reduce(mlx_include, R, C, op, expected):
    x = torch.randn(R, C, generator=torch.Generator().manual_seed(1))
    kernel, launch = col_reduce(x, op, include=mlx_include)
    assert kernel == expected
    _check(launch.run(), x, (0,), op)


def test_reductions_propagate_nan(mlx_include):
    x = torch.randn(100, 67, generator=torch.Generator().manual_seed(2))
    x[55, 66] = float("nan")  # in the partial last column tile
    x[3, 0] = float("inf")
    out = col_reduce(x, "max", include=mlx_include)[1].run()
    assert torch.isnan(out[66]) and out[0] == float("inf") and not torch.isnan(out[:66]).any()
    _check(out, x, (0,), "max")  # MLX's Max checks isnan; torch's amax propagates NaN too
    y = torch.randn(5, 37, generator=torch.Generator().manual_seed(3))
    y[2, 36] = float("nan")  # the one leftover element of the row
    out = row_reduce(y, (1,), "sum", include=mlx_include)[1].run()
    assert torch.isnan(out[2]) and not torch.isnan(out[[0, 1, 3, 4]]).any()


def test_reductions_pass_the_race_check(mlx_include):
    x = torch.randn(100, 67, generator=torch.Generator().manual_seed(4))
    launch = col_reduce(x, "max", include=mlx_include)[1]
    _check(launch.racecheck(seeds=(0, 1)), x, (0,), "max")
    counts = launch.counters()
    # 3 column tiles of 8 simdgroups; BM == 32: one barrier, then 4 simd reductions per thread, each
    # a simd_any (MLX's NaN check for floats) and a simd_max
    assert counts["threadgroup_barriers"] == 3
    assert counts["simd_collectives"] == 3 * 8 * 4 * 2
    if memory_counts_unavailable() is None:  # traced memory (clang): every input read once, one result per column
        assert (counts["device_load_instructions"], counts["device_load_bytes"]) == (100 * 67, 4 * 100 * 67)
        assert (counts["device_store_instructions"], counts["device_store_bytes"]) == (67, 4 * 67)
    x = torch.randn(41, 301, generator=torch.Generator().manual_seed(5))
    launch = row_reduce(x, (1,), "sum", include=mlx_include)[1]
    _check(launch.racecheck(seeds=(0, 1)), x, (1,), "sum")
