"""RMS norm and layer norm over the last axis for Metal, written in TileLang, with torch's and MLX's
semantics (`F.rms_norm` / `mx.fast.rms_norm`, `F.layer_norm` / `mx.fast.layer_norm`): eps inside the
square root, the population variance, float32 arithmetic for every dtype, one rounding at the store.

    rms_norm:   Y[r, :] = X[r, :] / sqrt(mean(X[r, :]^2) + eps) * weight
    layer_norm: Y[r, :] = (X[r, :] - mean) / sqrt(mean((X[r, :] - mean)^2) + eps) * weight + bias

A team of threads per row: one simdgroup (`threads / 32` rows per threadgroup) for rows of up to 4 runs
of 16 bytes per lane (512 float32 or 1024 half columns); a threadgroup of up to 1024 threads, one
per run, for longer rows (a decoding step's single row keeps more than one simdgroup busy). Each
thread reads runs of 16 bytes of the row at a stride of the team's size in runs (one vector load
each where the row pitch keeps them 16-byte aligned, elements otherwise; the run the row's end cuts
reads its elements, the last one again past the end, and adds only those in the row; threads whose
run starts past the end skip the round), folds them into a float32 scalar, and one simd collective
(`T.warp_reduce_sum`) finishes each statistic; a threadgroup adds its simdgroups' sums through
threadgroup memory (one float per simdgroup, one barrier per statistic). A last pass reads the row
again with the weight (and bias) and stores it the same way. Rows of any length (one column,
ragged, over 4096). The layer norm's variance is a second pass over (x - mean)^2, not
E[x^2] - mean^2, which cancels catastrophically for rows far from 0.

Non-finite inputs give torch's results in the emulator: a NaN makes its row NaN; an infinity makes
the rms norm's row 0 for the finite elements and NaN for the infinite ones (x * 1/sqrt(inf)), and the
layer norm's row NaN. On a GPU with fast math (Metal's default) they are undefined.

`rows=None` compiles one kernel for every row count (a dynamic first dimension).

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

import math
from typing import Any

import tilelang.language as T

from ..target.isa import SIMD_WIDTH
from ..target.limits import MAX_THREADS_PER_THREADGROUP as MAX_THREADS
from .reduce_rows import ACCUM, DTYPES, RUN_BYTES, _ELEMENT_BYTES, run_loader
from .sizes import integer_sizes

KINDS = ("rms_norm", "layer_norm")
WIDE_ROUNDS = 4  # rows of more than 4 runs per lane of a simdgroup take a threadgroup


def _check_norm(what: str, rows: Any, cols: Any, dtype: str, eps: Any, threads: Any) -> tuple[Any, int, float, int]:
    """(rows or None, cols, eps, threads) checked, or a one-line ValueError naming the bad argument."""
    if rows is None:
        (cols, threads) = integer_sizes(what, cols=cols, threads=threads)
    else:
        rows, cols, threads = integer_sizes(what, rows=rows, cols=cols, threads=threads)
        if rows <= 0:
            raise ValueError(f"{what} needs rows >= 1 (got {rows}); pass rows=None for a kernel that takes any row count")
    if cols <= 0:
        raise ValueError(f"{what} needs cols >= 1 (got {cols}); an empty row has no {what}")
    if dtype not in DTYPES:
        raise ValueError(f"{what} dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps < 0:
        raise ValueError(f"{what} eps={eps!r} must be a finite float >= 0 (e.g. 1e-5)")
    if threads < SIMD_WIDTH or threads > MAX_THREADS or threads % SIMD_WIDTH:
        raise ValueError(f"{what} threads={threads} must be a multiple of 32 from 32 to 1024 (one simdgroup per row); use 128")
    return rows, cols, float(eps), threads


def norm_program(kind: str, rows: Any, cols: int, *, dtype: str, eps: float, threads: int = 128) -> Any:
    """The `T.prim_func` of `kind` ("rms_norm": (X, W, Y); "layer_norm": (X, W, B, Y); compile with
    `out_idx=[-1]`); `rows=None`: any row count. `threads` is the threadgroup size of short rows (a
    simdgroup each); a long row takes a threadgroup of its own, sized by the row."""
    if kind not in KINDS:
        raise ValueError(f"norm kind={kind!r} is not supported; use one of {', '.join(KINDS)}")
    rows, cols, eps, threads = _check_norm(kind, rows, cols, dtype, eps, threads)
    run = RUN_BYTES // _ELEMENT_BYTES[dtype]
    runs = -(-cols // run)
    wide = runs > WIDE_ROUNDS * SIMD_WIDTH  # a threadgroup per row: up to 1024 lanes share a long row
    team = min(MAX_THREADS, -(-runs // SIMD_WIDTH) * SIMD_WIDTH) if wide else SIMD_WIDTH  # threads of one row
    simdgroups = team // SIMD_WIDTH
    threads = team if wide else threads
    rows_per_group = threads // team
    rounds = -(-runs // team)
    vector_runs = cols * _ELEMENT_BYTES[dtype] % RUN_BYTES == 0  # else a run's address is not provably 16-byte aligned
    is_layer = kind == "layer_norm"
    n_rows = T.dynamic("rows") if rows is None else rows

    load_run = run_loader(run, cols, vector_runs)  # past the row's end a copy of the last element, never summed

    @T.macro
    def load_params(src, c, dst):
        if c + run <= cols:
            if vector_runs:
                for v in T.vectorized(run):
                    dst[v] = src[c + v]
            else:
                for v in T.unroll(run):
                    dst[v] = src[c + v]
        else:
            for v in T.unroll(run):
                dst[v] = src[T.min(c + v, cols - 1)]

    @T.macro
    def normalize(X, W, B, Y):
        with T.Kernel(T.ceildiv(n_rows, rows_per_group), threads=threads) as bx:
            thread = T.get_thread_binding()
            lane = thread % SIMD_WIDTH
            member = thread % team  # the thread's place among those of its row
            row = bx * rows_per_group + thread // team  # bx when wide
            if wide:
                # one partial sum per simdgroup and statistic: the layer norm's second one goes to its own half, so
                # it needs no barrier behind the first one's reads
                partial = T.alloc_shared(((2 if is_layer else 1) * simdgroups,), ACCUM)
            values = T.alloc_local((run,), dtype)
            weights = T.alloc_local((run,), dtype)
            biases = T.alloc_local((run,), dtype)
            out = T.alloc_local((run,), dtype)
            total = T.alloc_var(ACCUM)
            mean = T.alloc_var(ACCUM)
            rstd = T.alloc_var(ACCUM)
            if row < n_rows:  # the same for a whole simdgroup (threadgroup when wide): collectives and barriers see every lane
                total = 0
                for i in T.serial(rounds):
                    if (i * team + member) * run < cols:  # lanes past the row's end have nothing to add
                        c = (i * team + member) * run
                        load_run(X, row, c, values)
                        for v in T.unroll(run):
                            x = T.cast(values[v], ACCUM)
                            if is_layer:
                                total += T.if_then_else(c + v < cols, x, 0)
                            else:
                                total += T.if_then_else(c + v < cols, x * x, 0)
                total = T.warp_reduce_sum(total)
                if wide:  # the simdgroups' sums through threadgroup memory, added up by every simdgroup alike
                    if lane == 0:
                        partial[thread // SIMD_WIDTH] = total
                    total = T.warp_reduce_sum(T.if_then_else(lane < simdgroups, partial[T.min(lane, simdgroups - 1)], 0))
                mean = 0
                if is_layer:
                    mean = total / T.float32(cols)
                    total = 0
                    for i in T.serial(rounds):
                        if (i * team + member) * run < cols:
                            c = (i * team + member) * run
                            load_run(X, row, c, values)
                            for v in T.unroll(run):
                                deviation = T.cast(values[v], ACCUM) - mean
                                total += T.if_then_else(c + v < cols, deviation * deviation, 0)
                    total = T.warp_reduce_sum(total)
                    if wide:
                        if lane == 0:
                            partial[simdgroups + thread // SIMD_WIDTH] = total
                        total = T.warp_reduce_sum(T.if_then_else(lane < simdgroups, partial[simdgroups + T.min(lane, simdgroups - 1)], 0))
                rstd = 1.0 / T.sqrt(total / T.float32(cols) + eps)
                for i in T.serial(rounds):
                    # the round's body is this one statement (c bound inside): each lane stores only its own runs, so no
                    # device barrier is wanted between rounds (SyncDeviceMemory orders a body's tail against its head)
                    if (i * team + member) * run < cols:
                        c = (i * team + member) * run
                        load_run(X, row, c, values)
                        load_params(W, c, weights)
                        if is_layer:
                            load_params(B, c, biases)
                        for v in T.unroll(run):
                            scaled = (T.cast(values[v], ACCUM) - mean) * rstd * T.cast(weights[v], ACCUM)
                            if is_layer:
                                out[v] = T.cast(scaled + T.cast(biases[v], ACCUM), dtype)
                            else:
                                out[v] = T.cast(scaled, dtype)
                        if c + run <= cols:
                            if vector_runs:
                                for v in T.vectorized(run):
                                    Y[row, c + v] = out[v]
                            else:
                                for v in T.unroll(run):
                                    Y[row, c + v] = out[v]
                        else:
                            for v in T.unroll(run):
                                if c + v < cols:
                                    Y[row, c + v] = out[v]

    if is_layer:

        @T.prim_func
        def layer_norm_main(
            X: T.Tensor((n_rows, cols), dtype), W: T.Tensor((cols,), dtype), B: T.Tensor((cols,), dtype), Y: T.Tensor((n_rows, cols), dtype)
        ):
            normalize(X, W, B, Y)

        return layer_norm_main

    @T.prim_func
    def rms_norm_main(X: T.Tensor((n_rows, cols), dtype), W: T.Tensor((cols,), dtype), Y: T.Tensor((n_rows, cols), dtype)):
        normalize(X, W, W, Y)  # no bias: W stands in for it, never read

    return rms_norm_main


def _compile(program: Any, target: Any, execution_backend: str | None) -> Any:
    import tilelang

    kwargs = {"execution_backend": execution_backend} if execution_backend else {}
    return tilelang.compile(program, out_idx=[-1], target=target or "metal", **kwargs)


def rms_norm(rows: Any, cols: int, *, dtype: str, eps: float, threads: int = 128, target: Any = None,
             execution_backend: str | None = None) -> Any:
    """The compiled RMS norm, called as `kernel(x (rows, cols), weight (cols,)) -> y (rows, cols)`."""
    return _compile(norm_program("rms_norm", rows, cols, dtype=dtype, eps=eps, threads=threads), target, execution_backend)


def layer_norm(rows: Any, cols: int, *, dtype: str, eps: float, threads: int = 128, target: Any = None,
               execution_backend: str | None = None) -> Any:
    """The compiled layer norm, called as `kernel(x (rows, cols), weight (cols,), bias (cols,)) -> y (rows, cols)`."""
    return _compile(norm_program("layer_norm", rows, cols, dtype=dtype, eps=eps, threads=threads), target, execution_backend)
