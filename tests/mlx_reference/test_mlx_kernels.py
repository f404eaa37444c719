"""MLX's Metal kernels, unmodified, in the emulator, against torch.

Each wrapper is our own `.metal`-like source: it includes MLX's headers the way MLX's own `.metal`
files do and instantiates the templates with `template [[host_name(...)]] [[kernel]]`. Launch
parameters follow MLX's host code for the version of the headers (mlx-metal 0.32.4); each test says
where they come from. Threadgroup counts are MLX's `dispatchThreads` grid divided by its group size.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tilelang_metal.emulator import compile_msl
from tilelang_metal.emulator.toolchain import compiler, compiler_identity

SOFTMAX = """
#include <metal_stdlib>
using namespace metal;
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/softmax.h"
template [[host_name("block_softmax_float32")]] [[kernel]] decltype(softmax_single_row<float>) softmax_single_row<float>;
template [[host_name("block_softmax_precise_float16")]] [[kernel]] decltype(softmax_single_row<half, float>) softmax_single_row<half, float>;
template [[host_name("looped_softmax_float32")]] [[kernel]] decltype(softmax_looped<float>) softmax_looped<float>;
"""

REDUCE_SCAN = """
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/atomic.h"
#include "mlx/backend/metal/kernels/reduction/ops.h"
#include "mlx/backend/metal/kernels/reduce.h"
#include "mlx/backend/metal/kernels/scan.h"
template [[host_name("all_reduce_sum_float32")]] [[kernel]] decltype(all_reduce<float, float, Sum<float>>) all_reduce<float, float, Sum<float>>;
template [[host_name("all_reduce_max_float32")]] [[kernel]] decltype(all_reduce<float, float, Max<float>>) all_reduce<float, float, Max<float>>;
template [[host_name("contig_scan_inclusive_sum_float32_float32")]] [[kernel]]
    decltype(contiguous_scan<float, float, CumSum<float>, 4, true, false>) contiguous_scan<float, float, CumSum<float>, 4, true, false>;
template [[host_name("contig_scan_reverse_exclusive_sum_float32_float32")]] [[kernel]]
    decltype(contiguous_scan<float, float, CumSum<float>, 4, false, true>) contiguous_scan<float, float, CumSum<float>, 4, false, true>;
"""


@functools.lru_cache(maxsize=None)
def _kernel(source: str, name: str, include: str):
    if source is REDUCE_SCAN and "clang" not in compiler_identity(compiler()):
        # MLX's reduction/binary ops specialise member templates inside their class (valid since
        # C++17, CWG 727), which g++ does not implement: only clang compiles these headers.
        pytest.skip("MLX's reduction and scan headers need clang++ (g++ lacks in-class explicit specialization, CWG 727)")
    return compile_msl(source, name, include_dirs=[include])


# mlx/backend/metal/softmax.cpp: axis_size <= 4096 -> "block_softmax_", threadgroup of
# 32 * ceil(ceil(axis_size / SOFTMAX_N_READS(4)) / 32) threads, one threadgroup per row; above it the
# looped kernel with maxTotalThreadsPerThreadgroup (1024) threads. axis_size is set with setBytes(2).
def _softmax_block(axis_size: int) -> int:
    return 32 * math.ceil(math.ceil(axis_size / 4) / 32)


@pytest.mark.parametrize("rows,axis", [(3, 37), (2, 129), (1, 4096)])
def test_block_softmax_float32(mlx_include, rows, axis):
    k = _kernel(SOFTMAX, "block_softmax_float32", mlx_include)
    x = torch.randn(rows, axis) * 4
    out = torch.zeros_like(x)
    k.launch([x, out, axis], grid=(rows,), block=(_softmax_block(axis),))
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_block_softmax_precise_float16_with_infinities(mlx_include):
    k = _kernel(SOFTMAX, "block_softmax_precise_float16", mlx_include)
    x = (torch.randn(4, 53) * 3).half()
    x[1, 7] = float("-inf")  # a masked position: exp gives 0
    x[2, :] = float("-inf")  # a fully masked row: MLX's max starts at -inf, exp(-inf - -inf) is NaN
    out = torch.zeros_like(x)
    k.launch([x, out, 53], grid=(4,), block=(_softmax_block(53),))
    ref = torch.softmax(x.float(), -1).half()
    torch.testing.assert_close(out, ref, rtol=2e-3, atol=1e-4, equal_nan=True)
    assert out[1, 7] == 0 and torch.isnan(out[2]).all()


def test_looped_softmax_float32(mlx_include):
    k = _kernel(SOFTMAX, "looped_softmax_float32", mlx_include)
    axis = 4099  # above SOFTMAX_LOOPED_LIMIT (4096): the looped kernel, a partial last block
    x = torch.randn(2, axis) * 4
    out = torch.zeros_like(x)
    k.launch([x, out, axis], grid=(2,), block=(1024,))
    torch.testing.assert_close(out, torch.softmax(x, -1), rtol=1e-5, atol=1e-7)


# mlx/backend/metal/reduce.cpp, all_reduce_dispatch: in_size <= REDUCE_N_READS(4) * 1024 -> one
# threadgroup of 32 * ceil(ceil(in_size / 4) / 32) threads; in_size set at buffers 2 and 3 (row_size).
@pytest.mark.parametrize("op,n", [("sum", 1), ("sum", 1003), ("max", 4096)])
def test_all_reduce_float32(mlx_include, op, n):
    k = _kernel(REDUCE_SCAN, f"all_reduce_{op}_float32", mlx_include)
    x = torch.randn(n)
    out = torch.full((1,), float("nan"))
    tg = 32 * math.ceil(math.ceil(n / 4) / 32)
    k.launch([x, out, n, n], grid=(1,), block=(tg,))
    ref = x.sum() if op == "sum" else x.max()
    torch.testing.assert_close(out[0], ref, rtol=1e-5, atol=1e-5)


def test_all_reduce_max_propagates_nan(mlx_include):
    k = _kernel(REDUCE_SCAN, "all_reduce_max_float32", mlx_include)
    x = torch.randn(300)
    x[123] = float("nan")
    out = torch.zeros(1)
    k.launch([x, out, 300, 300], grid=(1,), block=(96,))
    assert torch.isnan(out[0])  # MLX's Max checks isnan explicitly; torch.max propagates NaN too


# mlx/backend/metal/scan.cpp: contiguous axis -> "contig_scan_...", n_reads 4 (itemsize <= 4), for
# size <= 4 * 1024 a threadgroup of 32 * ceil(size / 128) threads, one threadgroup per row (grid y);
# the axis size is set with setBytes(2).
@pytest.mark.parametrize("rows,axis", [(3, 5), (2, 300)])
def test_contiguous_scan_inclusive_sum(mlx_include, rows, axis):
    k = _kernel(REDUCE_SCAN, "contig_scan_inclusive_sum_float32_float32", mlx_include)
    x = torch.randn(rows, axis)
    out = torch.zeros_like(x)
    k.launch([x, out, axis], grid=(1, rows, 1), block=(32 * math.ceil(axis / 128),))
    torch.testing.assert_close(out, torch.cumsum(x, -1), rtol=1e-5, atol=1e-5)


def test_contiguous_scan_reverse_exclusive_sum(mlx_include):
    k = _kernel(REDUCE_SCAN, "contig_scan_reverse_exclusive_sum_float32_float32", mlx_include)
    axis = 257
    x = torch.randn(2, axis)
    out = torch.zeros_like(x)
    k.launch([x, out, axis], grid=(1, 2, 1), block=(32 * math.ceil(axis / 128),))
    rev = torch.flip(torch.cumsum(torch.flip(x, [-1]), -1), [-1]) - x
    torch.testing.assert_close(out, rev, rtol=1e-5, atol=1e-5)


def test_mlx_kernels_pass_the_race_check(mlx_include):
    softmax = _kernel(SOFTMAX, "block_softmax_float32", mlx_include)
    x = torch.randn(2, 200)
    softmax.racecheck([x, torch.zeros_like(x), 200], grid=(2,), block=(_softmax_block(200),), seeds=(0, 1))
    scan = _kernel(REDUCE_SCAN, "contig_scan_inclusive_sum_float32_float32", mlx_include)
    scan.racecheck([x, torch.zeros_like(x), 200], grid=(1, 2, 1), block=(64,), seeds=(0, 1))
