"""Kernels in the style of TileLang's `examples/` (elementwise, cast, dynamic_shape, grouped_gemm,
attention_sink, blocksparse_attention, deepseek_mla, linear_attention/retention, flash_attention
backward), written for `test_example_ports.py`: the same algorithms and TileLang features at
Metal-sized tiles (threadgroup memory <= 32 KiB), our own code. Each builder returns a compiled
emulator kernel, cached per configuration so the test module compiles each kernel once."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools
import math

import tilelang
import tilelang.language as T

from tilelang_metal.examples import metal4_target

TARGETS = {"metal": lambda: "metal", "metal4": metal4_target}
LOG2_E = 1.4426950408889634
ACCUM = "float32"


def compile_emulated(func, target: str = "metal", pass_configs: dict | None = None):
    return tilelang.compile(func, target=TARGETS[target](), execution_backend="emulator", pass_configs=pass_configs)


# ----------------------------------------------------------------------------- elementwise


@functools.lru_cache(maxsize=None)
def elementwise_add(M: int, N: int, bm: int, bn: int, threads: int, in_dtype: str = "float16", out_dtype: str = "float32"):
    """C = A + B over (bm, bn) tiles with no explicit bounds check: tilelang's guards cover the
    partial tiles (examples/elementwise/example_elementwise_add.py)."""

    @T.prim_func
    def main(A: T.Tensor((M, N), in_dtype), B: T.Tensor((M, N), in_dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            for i, j in T.Parallel(bm, bn):
                row, col = by * bm + i, bx * bn + j
                C[row, col] = T.cast(A[row, col], out_dtype) + T.cast(B[row, col], out_dtype)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def grid_stride_fill(numel: int, blocks: int, threads: int):
    """Out[i] = value for every i, each thread walking `T.serial(start, numel, step=...)` with a
    runtime scalar argument (examples/elementwise/example_strided_serial.py, written as a
    grid-stride loop so every element has one writer)."""

    @T.prim_func
    def main(Out: T.Tensor((numel,), "float32"), value: T.float32):
        with T.Kernel(blocks, threads=threads) as bx:
            tx = T.get_thread_binding()
            for idx in T.serial(bx * threads + tx, numel, step=blocks * threads):
                Out[idx] = value

    return compile_emulated(main)


# ----------------------------------------------------------------------------- cast


@functools.lru_cache(maxsize=None)
def per_token_group_quant(M: int, N: int, group: int, rows: int, out_dtype: str = "int8", qmax: float = 127.0):
    """Per row and group of `group` columns: scale = max(|x|, 1e-4) / qmax, Q = x / scale clamped to
    [-qmax, qmax] and rounded (examples/cast/example_per_token_cast_to_fp8.py: fp8 there, which
    Metal lacks; int8 here). The tile's fragment layout is given by `T.annotate_layout` with a
    `T.Fragment` thread function, as in the example; 128 threads."""
    if rows % 4:
        raise ValueError(f"per_token_group_quant: rows ({rows}) must be a multiple of 4 (the layout puts rows/4 rows on each simdgroup)")
    groups = T.ceildiv(N, group)

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Q: T.Tensor((M, N), out_dtype), Scale: T.Tensor((M, groups), "float32")):
        with T.Kernel(T.ceildiv(M, rows), groups, threads=128) as (bm, bg):
            tile = T.alloc_fragment((rows, group), "float32")
            amax = T.alloc_fragment((rows,), "float32")
            scale = T.alloc_fragment((rows,), "float32")
            quant = T.alloc_fragment((rows, group), out_dtype)
            # simdgroup i // (rows / 4) holds row i, lane j % 32 its column j (the example's layout)
            T.annotate_layout({tile: T.Fragment(tile.shape, forward_thread_fn=lambda i, j: (i // (rows // 4)) * 32 + j % 32)})
            T.copy(X[bm * rows, bg * group], tile)
            T.reduce_absmax(tile, amax, dim=1)
            for i in T.Parallel(rows):
                scale[i] = T.max(amax[i], 1e-4) / qmax
            for i, j in T.Parallel(rows, group):
                quant[i, j] = T.cast(T.round(T.clamp(tile[i, j] / scale[i], -qmax, qmax)), out_dtype)
            for i in T.Parallel(rows):
                if bm * rows + i < M:
                    Scale[bm * rows + i, bg] = scale[i]
            T.copy(quant, Q[bm * rows, bg * group])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- dynamic shapes


@functools.lru_cache(maxsize=None)
def dynamic_gemm(target: str, trans_a: bool, trans_b: bool, bm: int = 32, bn: int = 32, bk: int = 16, tail_split: bool = True):
    """C = op(A) @ op(B) with M, N, K symbolic (`T.dynamic`): one compiled kernel serves every
    shape (examples/dynamic_shape/example_dynamic.py). `tail_split=False` sets the example's
    `tl.disable_dynamic_tail_split`."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")
    a_shape = (K, M) if trans_a else (M, K)
    b_shape = (N, K) if trans_b else (K, N)

    @T.prim_func
    def main(A: T.Tensor(a_shape, "float16"), B: T.Tensor(b_shape, "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            a_s = T.alloc_shared((bk, bm) if trans_a else (bm, bk), "float16")
            b_s = T.alloc_shared((bn, bk) if trans_b else (bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), ACCUM)
            T.clear(acc)
            for kt in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                if trans_a:
                    T.copy(A[kt * bk, by * bm], a_s)
                else:
                    T.copy(A[by * bm, kt * bk], a_s)
                if trans_b:
                    T.copy(B[bx * bn, kt * bk], b_s)
                else:
                    T.copy(B[kt * bk, bx * bn], b_s)
                T.gemm(a_s, b_s, acc, trans_a, trans_b)
            T.copy(acc, C[by * bm, bx * bn])

    configs = None if tail_split else {"tl.disable_dynamic_tail_split": True, "tl.dynamic_alignment": 8}
    return compile_emulated(main, target, configs)


# ----------------------------------------------------------------------------- grouped GEMM


def padded_group_offsets(sizes: tuple[int, ...], bm: int) -> list[int]:
    """Start row of each group in the padded row space the grid walks: every group starts on a tile
    boundary (the example pads by ceil((size + 1) / bm) tiles, so even an empty group owns one tile)."""
    offsets = [0]
    for size in sizes[:-1]:
        offsets.append(offsets[-1] + (size + bm) // bm * bm)
    return offsets


@functools.lru_cache(maxsize=None)
def grouped_gemm(target: str, sizes: tuple[int, ...], K: int, N: int, bm: int = 32, bn: int = 32, bk: int = 16):
    """C[rows of group g] = A[rows of group g] @ B[g]; each threadgroup finds its group by scanning
    the padded offsets into a local variable and stores only the rows of its group
    (examples/grouped_gemm/example_grouped_gemm_fwd.py). Group sizes, offsets and padded offsets
    are runtime tensors."""
    total, count = sum(sizes), len(sizes)
    tiles = sum((s + bm) // bm for s in sizes)

    @T.prim_func
    def main(A: T.Tensor((total, K), "float16"), B: T.Tensor((count, K, N), "float16"), C: T.Tensor((total, N), "float16"),
             Sizes: T.Tensor((count,), "int32"), Offsets: T.Tensor((count,), "int32"), Padded: T.Tensor((count,), "int32")):
        with T.Kernel(tiles, T.ceildiv(N, bn), threads=128) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), ACCUM)
            group = T.alloc_var("int32")
            group = 0
            padded_start = bx * bm
            for g in T.serial(count):
                if padded_start >= Padded[g]:
                    group = g
            row0 = padded_start - Padded[group] + Offsets[group]
            valid = T.max(0, T.min(bm, Sizes[group] + Padded[group] - padded_start))
            T.clear(acc)
            for kt in T.Pipelined(T.ceildiv(K, bk), num_stages=2):
                T.copy(A[row0 : row0 + bm, kt * bk : (kt + 1) * bk], a_s)
                T.copy(B[group, kt * bk : (kt + 1) * bk, by * bn : (by + 1) * bn], b_s)
                T.gemm(a_s, b_s, acc)
            for i, j in T.Parallel(bm, bn):
                if i < valid:
                    C[row0 + i, by * bn + j] = acc[i, j]

    return compile_emulated(main, target)
