"""MLX's row and column reductions (reduction/reduce_row.h, reduce_col.h via reduce.h), unmodified,
launched as `mlx/backend/metal/reduce.cpp` does for a row-contiguous float input: the same choice
of kernel, the same buffers (RowReduceArgs / ColReduceArgs::encode) and grids. `row_reduce(x, axes)`
and `col_reduce(x)` return the kernel MLX picks and a `Launch` (mlx_launch.py): `.run()`, `.counters()`, `.racecheck()`.

Host-code provenance: the newest reduce.cpp available here (ml-explore/mlx main, version.h 0.32.2).
The 0.32.4 column kernels take a `column_offset` (buffer 11; col_reduce_2pass's out_size moves to
12) that this host code does not have: it is 0 here (the grid covers every column).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mlx_attention import MLX_TYPE, _compile
from mlx_launch import Launch

OPS = {"sum": "Sum", "max": "Max", "min": "Min", "prod": "Prod"}
REDUCE_N_READS = REDUCE_N_WRITES = 4  # kernels/defines.h

PREAMBLE = """
#include <metal_atomic>
#include <metal_simdgroup>
#include "mlx/backend/metal/kernels/defines.h"
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/atomic.h"
#include "mlx/backend/metal/kernels/reduction/ops.h"
#include "mlx/backend/metal/kernels/reduce.h"
"""


def _kernel(func: str, host: str, template_args: str, include: str):
    """One instantiation, named as reduce.metal's instantiate_* macros name it."""
    source = PREAMBLE + f'template [[host_name("{host}")]] [[kernel]] decltype({func}<{template_args}>) {func}<{template_args}>;\n'
    return _compile(source, host, include, ())


def _types(x: torch.Tensor, op: str) -> tuple[str, str, str]:
    tname, ttype = MLX_TYPE[x.dtype]
    return tname, ttype, f"{OPS[op]}<{ttype}>"  # remap_reduce_types: floats reduce in their own type


def _reduce_ndim(n: int) -> int:
    return 1 if n <= 1 else (2 if n == 2 else 5)  # get_kernel_reduce_ndim


def _ints(values: list[int]) -> torch.Tensor:
    return torch.tensor(values or [0], dtype=torch.int32)  # encode pushes a 0 for an empty vector


def _longs(values: list[int]) -> torch.Tensor:
    return torch.tensor(values or [0], dtype=torch.int64)


def _threadgroup_size_from_row_size(row_size: int) -> int:
    if row_size <= 512:
        return 32
    if row_size <= 1024:
        return 128
    threads = (row_size + REDUCE_N_READS - 1) // REDUCE_N_READS
    return min(1024, (threads + 31) // 32 * 32)


def row_reduce(x: torch.Tensor, axes: tuple[int, ...], op: str, *, include: str) -> tuple[str, Launch]:
    """Reduce a row-contiguous `x` over `axes`, which include the last one (a "row" reduction:
    ReductionPlan ContiguousReduce). Returns the kernel MLX picks and its launch."""
    assert x.is_contiguous() and axes[-1] == x.dim() - 1 and list(axes) == sorted(axes)
    # get_reduction_plan: merge consecutive reduced axes; the last merged run is the row
    runs: list[list[int]] = []
    for a in axes:
        if runs and runs[-1][-1] == a - 1:
            runs[-1].append(a)
        else:
            runs.append([a])
    plan = [(math.prod(x.shape[a] for a in run), x.stride(run[-1])) for run in runs if math.prod(x.shape[a] for a in run) > 1]
    row_size = plan[-1][0]
    reduce_shape, reduce_strides = [s for s, _ in plan[:-1]], [t for _, t in plan[:-1]]
    non_row_reductions = math.prod(reduce_shape)
    # shapes_without_reduction_axes, then collapse_contiguous_dims
    kept = [d for d in range(x.dim()) if d not in axes]
    shape, strides = _collapse([x.shape[d] for d in kept], [x.stride(d) for d in kept])
    out_shape = [x.shape[d] for d in kept]
    out = torch.full(out_shape or [1], float("nan"), dtype=x.dtype)
    out_size = out.numel()
    tname, ttype, opt = _types(x, op)
    n = _reduce_ndim(len(reduce_shape))
    general = [x, out, row_size, non_row_reductions, _ints(shape), _longs(strides), len(shape),
               _ints(reduce_shape), _longs(reduce_strides), len(reduce_shape)]  # RowReduceArgs::encode, buffers 0-9
    if row_size <= 64:  # row_reduce_small
        k = _kernel("row_reduce_small", f"row_reduce_small_{n}_reduce_{op}{tname}", f"{ttype}, {ttype}, {opt}, int, {n}", include)
        if (non_row_reductions < 32 and row_size <= 8) or non_row_reductions <= 8:
            # one thread per output: grid = the output (get_2d_grid_dims), group min(width, 1024)
            assert out_size <= 1024, "a grid that is not a whole number of threadgroups"
            steps = [(k, general, (1, 1, 1), (out_size, 1, 1))]
        else:  # one simdgroup per output: grid (32, out width, out height) threads, group 32
            steps = [(k, general, (1, out_size, 1), (32, 1, 1))]
        return "row_reduce_small", Launch.of(out.reshape(out_shape), *steps)
    if not reduce_shape and x.numel() // row_size >= 32:  # row_reduce_simple (contiguous rows only)
        k = _kernel("row_reduce_simple", f"row_reduce_simple_{op}{tname}", f"{ttype}, {ttype}, {opt}", include)
        tg = _threadgroup_size_from_row_size(row_size)
        groups_y = (out_size + REDUCE_N_WRITES - 1) // REDUCE_N_WRITES  # each threadgroup writes N_WRITES outputs
        steps = [(k, [x, out, row_size, out_size], (1, groups_y, 1), (tg, 1, 1))]
        return "row_reduce_simple", Launch.of(out.reshape(out_shape), *steps)
    k = _kernel("row_reduce_looped", f"row_reduce_looped_{n}_reduce_{op}{tname}", f"{ttype}, {ttype}, {opt}, int, {n}", include)
    tg = _threadgroup_size_from_row_size(row_size)
    steps = [(k, general, (1, out_size, 1), (tg, 1, 1))]  # grid (tg, out width, out height) threads
    return "row_reduce_looped", Launch.of(out.reshape(out_shape), *steps)


def _collapse(shape: list[int], strides: list[int]) -> tuple[list[int], list[int]]:
    """collapse_contiguous_dims for a row-contiguous layout: merge i into i+1 when stride_i = shape_{i+1} * stride_{i+1}."""
    out_s: list[int] = []
    out_t: list[int] = []
    for s, t in zip(shape, strides):
        if s == 1:
            continue
        if out_s and out_t[-1] == s * t:
            out_s[-1] *= s
            out_t[-1] = t
        else:
            out_s.append(s)
            out_t.append(t)
    return out_s, out_t


def col_reduce(x: torch.Tensor, op: str, *, include: str) -> tuple[str, Launch]:
    """Reduce a row-contiguous 2-D `x` (R, C) over axis 0 (ReductionPlan ContiguousStridedReduce,
    reduction_size R, reduction_stride C). Returns the kernel MLX picks and its launch."""
    assert x.is_contiguous() and x.dim() == 2
    R, C = x.shape
    tname, ttype, opt = _types(x, op)
    out = torch.full((C,), float("nan"), dtype=x.dtype)
    # ColReduceArgs: no non-column reductions, no kept axes left of the stride (ndim 0); each
    # dispatcher appends (reduction_size, reduction_stride) to reduce_shape / reduce_strides.
    def encode(inp: torch.Tensor, dst: torch.Tensor, size: int, stride: int, reduce_shape: list[int], reduce_strides: list[int]) -> list[Any]:
        return [inp, dst, size, stride, _ints([]), _longs([]), 0, _ints(reduce_shape), _longs(reduce_strides), len(reduce_shape), 1]
    total = R
    n = _reduce_ndim(1)
    if total < 32:  # strided_reduce_small
        k = _kernel("col_reduce_small", f"col_reduce_small_{n}_reduce_{op}{tname}", f"{ttype}, {ttype}, {opt}, int, {n}", include)
        blocks = (C + 3) // 4  # n_reads 4
        tx = min(blocks, 32)
        ty = min(8, min(1024 // tx, total))
        steps = [(k, encode(x, out, R, C, [R], [C]), ((blocks + tx - 1) // tx, 1, 1), (tx, ty, 1))]
        return "col_reduce_small", Launch.of(out, *steps)
    if C < 32 and total >= 1024:
        raise NotImplementedError("col_reduce_longcolumn is not wrapped here")
    looped = _kernel("col_reduce_looped", f"col_reduce_looped_1_32_32_reduce_{op}{tname}", f"{ttype}, {ttype}, {opt}, int, 1, 32, 32", include)
    bn, column_offset = 32, 0
    groups_x = (C + bn - 1) // bn  # grid (256 * ceil(C / BN), ...) threads in groups of 8 simdgroups
    if total > 256 and C // 32 < 1024:  # strided_reduce_2pass: 32 partial rows, then col_reduce_looped over them
        k = _kernel("col_reduce_2pass", f"col_reduce_2pass_1_32_32_reduce_{op}{tname}", f"{ttype}, {ttype}, {opt}, int, 1, 32, 32", include)
        intermediate = torch.full((32, C), float("nan"), dtype=x.dtype)
        out_size = 1  # out.size() / reduction_stride
        first = encode(x, intermediate, R, C, [R], [C]) + [column_offset, out_size]
        second = encode(intermediate, out, 32, C, [32], [C]) + [column_offset]
        steps = [(k, first, (groups_x, 32, 1), (256, 1, 1)), (looped, second, (groups_x, 1, 1), (256, 1, 1))]
        return "col_reduce_2pass", Launch.of(out, *steps)
    steps = [(looped, encode(x, out, R, C, [R], [C]) + [column_offset], (groups_x, 1, 1), (256, 1, 1))]
    return "col_reduce_looped", Launch.of(out, *steps)
