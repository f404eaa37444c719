"""Rotary position embedding for Metal, written in TileLang, with MLX's `mx.fast.rope` semantics on
x (batch, seq_len, heads, head_dim), every dimension rotated:

    pair i (0 <= i < head_dim / 2): (x[i], x[i + head_dim / 2]), or (x[2i], x[2i + 1]) when traditional
    angle = (offset + s) * scale * base^(-2i / head_dim)        (s: the position in the sequence)
    (a, b) -> (a cos(angle) - b sin(angle), a sin(angle) + b cos(angle))

float32 arithmetic for every dtype, one rounding at the store. Each thread rotates a run of up to 4
consecutive pairs of one row (one vector load / store per half, or of the run's 2 x 4 interleaved
elements when traditional); no threadgroup memory, no barrier. The frequency is exp2(-(i / (head_dim / 2))
* log2(base)), the form MLX's Metal kernel evaluates.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

import math
from typing import Any

import tilelang.language as T

from .matmul import INT32_MAX
from .reduce_rows import ACCUM, DTYPES
from .sizes import integer_sizes

PAIRS_PER_THREAD = 4


def _check_rope(batch: Any, seq_len: Any, heads: Any, head_dim: Any, base: Any, scale: Any, offset: Any, dtype: str,
                threads: Any) -> tuple[int, ...]:
    batch, seq_len, heads, head_dim, threads = integer_sizes(
        "rope", batch=batch, seq_len=seq_len, heads=heads, head_dim=head_dim, threads=threads
    )
    if offset is not None:
        (offset,) = integer_sizes("rope", offset=offset)
    for name, value in (("batch", batch), ("seq_len", seq_len), ("heads", heads)):
        if value <= 0:
            raise ValueError(f"rope needs {name} >= 1 (got {value})")
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"rope head_dim={head_dim} must be a positive even number (dimensions rotate in pairs)")
    if offset is not None and offset < 0:
        raise ValueError(f"rope offset={offset} must be >= 0 (the position of the first row of the sequence)")
    if dtype not in DTYPES:
        raise ValueError(f"rope dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    for name, value in (("base", base), ("scale", scale)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ValueError(f"rope {name}={value!r} must be a finite number > 0")
    if threads < 32 or threads > 1024 or threads % 32:
        raise ValueError(f"rope threads={threads} must be a multiple of 32 from 32 to 1024; use 128")
    if batch * seq_len * heads * head_dim > INT32_MAX:  # each thread's flat index is a 32-bit int
        raise ValueError(f"rope x has {batch * seq_len * heads * head_dim} elements, over {INT32_MAX}; rotate it in batches")
    return batch, seq_len, heads, head_dim, offset, threads


def rope_program(batch: int, seq_len: int, heads: int, head_dim: int, *, traditional: bool = False, base: float = 10000.0,
                 scale: float = 1.0, offset: int | None = 0, dtype: str, threads: int = 128) -> Any:
    """The `T.prim_func` (X, Y) of the rotation (compile with `out_idx=[-1]`); with `offset=None`,
    (X, offset, Y): the position of the first row is an int32 argument of every call (a decoding
    step's cache length), one kernel for all of them."""
    batch, seq_len, heads, head_dim, offset, threads = _check_rope(batch, seq_len, heads, head_dim, base, scale, offset, dtype, threads)
    if not isinstance(traditional, bool):
        raise ValueError(f"rope traditional={traditional!r} must be True or False")
    half = head_dim // 2
    run = next(r for r in (PAIRS_PER_THREAD, 2, 1) if half % r == 0)  # pairs per thread: runs never straddle a row
    runs_per_row = half // run
    rows = batch * seq_len * heads
    work = rows * runs_per_row
    log2_base = math.log2(base)
    shape = (batch, seq_len, heads, head_dim)

    @T.macro
    def rotate(X, Y, start):
        with T.Kernel(T.ceildiv(work, threads), threads=threads) as bx:
            thread = T.get_thread_binding()
            first = T.alloc_local((run,), dtype)  # a: x[i] (x[2i] when traditional)
            second = T.alloc_local((run,), dtype)  # b: x[i + half] (x[2i + 1])
            pairs = T.alloc_local((2 * run,), dtype)
            if bx * threads + thread < work:
                item = bx * threads + thread
                row = item // runs_per_row
                i0 = item % runs_per_row * run
                b = row // (seq_len * heads)
                s = row // heads % seq_len
                h = row % heads
                if traditional:
                    for v in T.vectorized(2 * run):
                        pairs[v] = X[b, s, h, 2 * i0 + v]
                    for v in T.unroll(run):
                        first[v] = pairs[2 * v]
                        second[v] = pairs[2 * v + 1]
                else:
                    for v in T.vectorized(run):
                        first[v] = X[b, s, h, i0 + v]
                    for v in T.vectorized(run):
                        second[v] = X[b, s, h, half + i0 + v]
                for v in T.unroll(run):
                    angle = T.cast(start + s, ACCUM) * T.float32(scale) * T.exp2(-(T.cast(i0 + v, ACCUM) / T.float32(half)) * T.float32(log2_base))
                    cos = T.cos(angle)
                    sin = T.sin(angle)
                    a = T.cast(first[v], ACCUM)
                    c = T.cast(second[v], ACCUM)
                    first[v] = T.cast(a * cos - c * sin, dtype)
                    second[v] = T.cast(a * sin + c * cos, dtype)
                if traditional:
                    for v in T.unroll(run):
                        pairs[2 * v] = first[v]
                        pairs[2 * v + 1] = second[v]
                    for v in T.vectorized(2 * run):
                        Y[b, s, h, 2 * i0 + v] = pairs[v]
                else:
                    for v in T.vectorized(run):
                        Y[b, s, h, i0 + v] = first[v]
                    for v in T.vectorized(run):
                        Y[b, s, h, half + i0 + v] = second[v]

    if offset is None:

        @T.prim_func
        def rope_at_offset(X: T.Tensor(shape, dtype), offset: T.int32, Y: T.Tensor(shape, dtype)):
            rotate(X, Y, offset)

        return rope_at_offset

    @T.prim_func
    def rope_main(X: T.Tensor(shape, dtype), Y: T.Tensor(shape, dtype)):
        rotate(X, Y, offset)

    return rope_main


def rope(batch: int, seq_len: int, heads: int, head_dim: int, *, traditional: bool = False, base: float = 10000.0,
         scale: float = 1.0, offset: int | None = 0, dtype: str, threads: int = 128, target: Any = None,
         execution_backend: str | None = None) -> Any:
    """The compiled rotation, called as `kernel(x (batch, seq_len, heads, head_dim)) -> y` (module doc), or
    `kernel(x, offset)` when built with `offset=None`."""
    import tilelang

    program = rope_program(batch, seq_len, heads, head_dim, traditional=traditional, base=base, scale=scale, offset=offset,
                           dtype=dtype, threads=threads)
    kwargs = {"execution_backend": execution_backend} if execution_backend else {}
    return tilelang.compile(program, out_idx=[-1], target=target or "metal", **kwargs)
