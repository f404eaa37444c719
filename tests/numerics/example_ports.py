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

from tilelang_metal.kernels import metal4_target

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
def dynamic_gemm(target: str, trans_a: bool, trans_b: bool, bm: int = 32, bn: int = 32, bk: int = 16):
    """C = op(A) @ op(B) with M, N, K symbolic (`T.dynamic`): one compiled kernel serves every
    shape (examples/dynamic_shape/example_dynamic.py; its pass configs `tl.disable_dynamic_tail_split`
    and `tl.dynamic_alignment` do not exist in tilelang 0.1.15)."""
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

    return compile_emulated(main, target)


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


# ----------------------------------------------------------------------------- attention


@functools.lru_cache(maxsize=None)
def attention_sink(target: str, batch: int, heads: int, seq_q: int, seq_kv: int, dim: int, window: int | None,
                   bm: int = 16, bn: int = 16, threads: int = 128):
    """Causal attention whose queries are the last `seq_q` of `seq_kv` positions, with one learned
    sink logit per head added to every softmax denominator (gpt-oss; examples/attention_sink/
    example_mha_sink_fwd_bhsd.py), optionally over a sliding window of `window` keys. bhsd layout.
    The KV loop starts at the window's first block; a row whose keys are all masked in a block keeps
    its running maximum (the example's check_inf)."""
    if window is not None and window % bn:
        raise ValueError(f"attention_sink: window ({window}) must be a multiple of bn ({bn})")
    past = seq_kv - seq_q
    if past < 0:
        raise ValueError(f"attention_sink: seq_kv ({seq_kv}) must be >= seq_q ({seq_q})")
    scale = LOG2_E / math.sqrt(dim)
    masked = -T.infinity(ACCUM)

    @T.prim_func
    def main(Q: T.Tensor((batch, heads, seq_q, dim), "float16"), K: T.Tensor((batch, heads, seq_kv, dim), "float16"),
             V: T.Tensor((batch, heads, seq_kv, dim), "float16"), Sinks: T.Tensor((heads,), "float16"),
             O: T.Tensor((batch, heads, seq_q, dim), "float16")):
        with T.Kernel(T.ceildiv(seq_q, bm), heads, batch, threads=threads) as (bx, h, b):
            q_s = T.alloc_shared((bm, dim), "float16")
            k_s = T.alloc_shared((bn, dim), "float16")
            v_s = T.alloc_shared((bn, dim), "float16")
            scores = T.alloc_fragment((bm, bn), ACCUM)
            probs = T.alloc_fragment((bm, bn), "float16")
            acc = T.alloc_fragment((bm, dim), ACCUM)
            run_max = T.alloc_fragment((bm,), ACCUM)
            prev_max = T.alloc_fragment((bm,), ACCUM)
            rescale = T.alloc_fragment((bm,), ACCUM)
            block_sum = T.alloc_fragment((bm,), ACCUM)
            denom = T.alloc_fragment((bm,), ACCUM)
            # the mask compares with a loaded row position: written inline, TVM's Simplify spends
            # ~10 s on the unrolled lane arithmetic of both sides (as in tilelang_metal.attention)
            query_pos = T.alloc_fragment((bm,), "int32")
            T.copy(Q[b, h, bx * bm : (bx + 1) * bm, :], q_s)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(run_max, masked)
            for i in T.Parallel(bm):
                query_pos[i] = bx * bm + i + past
            last = T.min(T.ceildiv(seq_kv, bn), T.ceildiv((bx + 1) * bm + past, bn))
            first = T.max(0, (bx * bm + past - window) // bn) if window is not None else 0
            for kb in T.Pipelined(first, last, num_stages=1):
                T.copy(K[b, h, kb * bn : (kb + 1) * bn, :], k_s)
                for i, j in T.Parallel(bm, bn):
                    kpos = kb * bn + j
                    visible = (query_pos[i] >= kpos) & (kpos < seq_kv)
                    if window is not None:
                        visible = visible & (query_pos[i] < kpos + window)
                    scores[i, j] = T.if_then_else(visible, 0, masked)
                T.gemm(q_s, k_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                T.copy(run_max, prev_max)
                T.reduce_max(scores, run_max, dim=1, clear=False)
                for i in T.Parallel(bm):
                    # still -inf: no visible key yet (a window's first blocks); exp2(-inf - 0) = 0 below
                    run_max[i] = T.if_then_else(run_max[i] == masked, 0, run_max[i])
                    rescale[i] = T.exp2(prev_max[i] * scale - run_max[i] * scale)
                for i, j in T.Parallel(bm, bn):
                    scores[i, j] = T.exp2(scores[i, j] * scale - run_max[i] * scale)
                T.reduce_sum(scores, block_sum, dim=1)
                for i in T.Parallel(bm):
                    denom[i] = denom[i] * rescale[i] + block_sum[i]
                T.copy(scores, probs)
                for i, d in T.Parallel(bm, dim):
                    acc[i, d] *= rescale[i]
                T.copy(V[b, h, kb * bn : (kb + 1) * bn, :], v_s)
                T.gemm(probs, v_s, acc, policy=T.GemmWarpPolicy.FullRow)
            for i in T.Parallel(bm):
                denom[i] += T.exp2(T.cast(Sinks[h], ACCUM) * LOG2_E - run_max[i] * scale)  # the sink's share
            for i, d in T.Parallel(bm, dim):
                acc[i, d] /= denom[i]
            T.copy(acc, O[b, h, bx * bm : (bx + 1) * bm, :])

    return compile_emulated(main, target)


@functools.lru_cache(maxsize=None)
def blocksparse_attention(target: str, batch: int, heads: int, seq: int, dim: int, causal: bool,
                          bm: int = 16, bn: int = 16, threads: int = 128):
    """Attention over the key blocks a boolean block mask enables, per (batch, head, query block):
    disabled blocks are skipped, not masked (examples/blocksparse_attention/
    example_tilelang_block_sparse_attn.py). A row with no enabled key gets zeros."""
    scale = LOG2_E / math.sqrt(dim)
    masked = -T.infinity(ACCUM)
    q_blocks, k_blocks = T.ceildiv(seq, bm), T.ceildiv(seq, bn)

    @T.prim_func
    def main(Q: T.Tensor((batch, heads, seq, dim), "float16"), K: T.Tensor((batch, heads, seq, dim), "float16"),
             V: T.Tensor((batch, heads, seq, dim), "float16"), Mask: T.Tensor((batch, heads, q_blocks, k_blocks), "bool"),
             O: T.Tensor((batch, heads, seq, dim), "float16")):
        with T.Kernel(q_blocks, heads, batch, threads=threads) as (bx, h, b):
            q_s = T.alloc_shared((bm, dim), "float16")
            k_s = T.alloc_shared((bn, dim), "float16")
            v_s = T.alloc_shared((bn, dim), "float16")
            scores = T.alloc_fragment((bm, bn), ACCUM)
            probs = T.alloc_fragment((bm, bn), "float16")
            acc = T.alloc_fragment((bm, dim), ACCUM)
            run_max = T.alloc_fragment((bm,), ACCUM)
            prev_max = T.alloc_fragment((bm,), ACCUM)
            rescale = T.alloc_fragment((bm,), ACCUM)
            block_sum = T.alloc_fragment((bm,), ACCUM)
            denom = T.alloc_fragment((bm,), ACCUM)
            query_pos = T.alloc_fragment((bm,), "int32")  # a loaded position: see attention_sink
            T.copy(Q[b, h, bx * bm : (bx + 1) * bm, :], q_s)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(run_max, masked)
            for i in T.Parallel(bm):
                query_pos[i] = bx * bm + i
            last = T.min(k_blocks, T.ceildiv((bx + 1) * bm, bn)) if causal else k_blocks
            for kb in T.serial(last):
                if Mask[b, h, bx, kb]:
                    T.copy(K[b, h, kb * bn : (kb + 1) * bn, :], k_s)
                    for i, j in T.Parallel(bm, bn):
                        visible = kb * bn + j < seq
                        if causal:
                            visible = visible & (query_pos[i] >= kb * bn + j)
                        scores[i, j] = T.if_then_else(visible, 0, masked)
                    T.gemm(q_s, k_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullRow)
                    T.copy(run_max, prev_max)
                    T.reduce_max(scores, run_max, dim=1, clear=False)
                    for i in T.Parallel(bm):
                        run_max[i] = T.if_then_else(run_max[i] == masked, 0, run_max[i])
                        rescale[i] = T.exp2(prev_max[i] * scale - run_max[i] * scale)
                    for i, j in T.Parallel(bm, bn):
                        scores[i, j] = T.exp2(scores[i, j] * scale - run_max[i] * scale)
                    T.reduce_sum(scores, block_sum, dim=1)
                    for i in T.Parallel(bm):
                        denom[i] = denom[i] * rescale[i] + block_sum[i]
                    T.copy(scores, probs)
                    for i, d in T.Parallel(bm, dim):
                        acc[i, d] *= rescale[i]
                    T.copy(V[b, h, kb * bn : (kb + 1) * bn, :], v_s)
                    T.gemm(probs, v_s, acc, policy=T.GemmWarpPolicy.FullRow)
            for i, d in T.Parallel(bm, dim):
                acc[i, d] = T.if_then_else(denom[i] > 0, acc[i, d] / denom[i], 0)
            T.copy(acc, O[b, h, bx * bm : (bx + 1) * bm, :])

    return compile_emulated(main, target)


@functools.lru_cache(maxsize=None)
def mla_decode(target: str, batch: int, heads: int, seq_kv: int, dim: int, pe_dim: int, splits: int,
               bh: int = 16, bn: int = 32, threads: int = 128):
    """DeepSeek MLA decoding (examples/deepseek_mla/example_mla_decode.py, the split form): one
    query token per head; the shared latent KV (one kv head) is both key (with a rope part K_pe) and
    value. Scores are two T.gemm calls into one accumulator (latent and rope parts), the
    probabilities go through threadgroup memory into the PV T.gemm (FullCol policy). Each of
    `splits` threadgroups per head block covers a slice of the keys (ragged: the last may be
    short or empty) and writes its partial output and log2-sum-exp; a second kernel of the module
    combines them."""
    if heads % bh:
        raise ValueError(f"mla_decode: heads ({heads}) must be a multiple of bh ({bh})")
    scale = LOG2_E / math.sqrt(dim + pe_dim)
    masked = -T.infinity(ACCUM)
    per_split = T.ceildiv(seq_kv, splits)

    @T.macro
    def split_attention(Q, Q_pe, KV, K_pe, Lse, O_part):
        with T.Kernel(batch, heads // bh, splits, threads=threads) as (b, hb, sp):
            q_s = T.alloc_shared((bh, dim), "float16")
            qpe_s = T.alloc_shared((bh, pe_dim), "float16")
            kv_s = T.alloc_shared((bn, dim), "float16")
            kpe_s = T.alloc_shared((bn, pe_dim), "float16")
            p_s = T.alloc_shared((bh, bn), "float16")
            scores = T.alloc_fragment((bh, bn), ACCUM)
            acc = T.alloc_fragment((bh, dim), ACCUM)
            run_max = T.alloc_fragment((bh,), ACCUM)
            prev_max = T.alloc_fragment((bh,), ACCUM)
            rescale = T.alloc_fragment((bh,), ACCUM)
            block_sum = T.alloc_fragment((bh,), ACCUM)
            denom = T.alloc_fragment((bh,), ACCUM)
            T.copy(Q[b, hb * bh : (hb + 1) * bh, :], q_s)
            T.copy(Q_pe[b, hb * bh : (hb + 1) * bh, :], qpe_s)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(run_max, masked)
            start = sp * per_split
            end = T.min(seq_kv, start + per_split)
            for kb in T.Pipelined(T.ceildiv(per_split, bn), num_stages=1):
                T.copy(KV[b, start + kb * bn : start + (kb + 1) * bn, 0, :], kv_s)
                T.copy(K_pe[b, start + kb * bn : start + (kb + 1) * bn, 0, :], kpe_s)
                T.gemm(q_s, kv_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol, clear_accum=True)
                T.gemm(qpe_s, kpe_s, scores, transpose_B=True, policy=T.GemmWarpPolicy.FullCol)
                for i, j in T.Parallel(bh, bn):
                    scores[i, j] = T.if_then_else(start + kb * bn + j < end, scores[i, j], masked)
                T.copy(run_max, prev_max)
                T.reduce_max(scores, run_max, dim=1, clear=False)
                for i in T.Parallel(bh):
                    run_max[i] = T.if_then_else(run_max[i] == masked, 0, run_max[i])
                    rescale[i] = T.exp2(prev_max[i] * scale - run_max[i] * scale)
                for i, j in T.Parallel(bh, bn):
                    scores[i, j] = T.exp2(scores[i, j] * scale - run_max[i] * scale)
                T.reduce_sum(scores, block_sum, dim=1)
                T.copy(scores, p_s)
                for i in T.Parallel(bh):
                    denom[i] = denom[i] * rescale[i] + block_sum[i]
                for i, d in T.Parallel(bh, dim):
                    acc[i, d] *= rescale[i]
                T.gemm(p_s, kv_s, acc, policy=T.GemmWarpPolicy.FullCol)
            for i, d in T.Parallel(bh, dim):
                acc[i, d] = T.if_then_else(denom[i] > 0, acc[i, d] / denom[i], 0)
            for i in T.Parallel(bh):  # an empty split: log2(0) = -inf, weight 0 in the combine
                denom[i] = T.log2(denom[i]) + run_max[i] * scale
            T.copy(denom, Lse[b, hb * bh : (hb + 1) * bh, sp])
            T.copy(acc, O_part[b, hb * bh : (hb + 1) * bh, sp, :])

    @T.macro
    def combine(Lse, O_part, Out):
        with T.Kernel(heads, batch, threads=64) as (h, b):
            out = T.alloc_fragment((dim,), ACCUM)
            lse_max = T.alloc_var(ACCUM)
            lse_total = T.alloc_var(ACCUM)
            lse_max = masked
            lse_total = 0
            T.clear(out)
            for s in T.serial(splits):
                lse_max = T.max(lse_max, Lse[b, h, s])
            for s in T.serial(splits):
                lse_total += T.exp2(Lse[b, h, s] - lse_max)
            lse_total = T.log2(lse_total) + lse_max
            for s in T.serial(splits):
                for d in T.Parallel(dim):
                    out[d] += O_part[b, h, s, d] * T.exp2(Lse[b, h, s] - lse_total)
            for d in T.Parallel(dim):
                Out[b, h, d] = out[d]

    @T.prim_func
    def main(Q: T.Tensor((batch, heads, dim), "float16"), Q_pe: T.Tensor((batch, heads, pe_dim), "float16"),
             KV: T.Tensor((batch, seq_kv, 1, dim), "float16"), K_pe: T.Tensor((batch, seq_kv, 1, pe_dim), "float16"),
             Lse: T.Tensor((batch, heads, splits), ACCUM), O_part: T.Tensor((batch, heads, splits, dim), ACCUM),
             Out: T.Tensor((batch, heads, dim), "float16")):
        split_attention(Q, Q_pe, KV, K_pe, Lse, O_part)
        combine(Lse, O_part, Out)

    return compile_emulated(main, target)


# ----------------------------------------------------------------------------- linear attention


def retention_decay(heads: int) -> list[float]:
    """Per-head decay gamma_h = 1 - 2^(-5 - h) of RetNet (the kernel computes it in-kernel)."""
    return [1 - 2.0 ** (-5 - h) for h in range(heads)]


@functools.lru_cache(maxsize=None)
def chunk_retention(target: str, batch: int, seq: int, heads: int, dk: int, dv: int, chunk: int = 16, bk: int = 16, bv: int = 16):
    """RetNet's retention O_t = sum_{s <= t} gamma_h^(t - s) (q_t . k_s / sqrt(dk)) v_s in chunks
    (examples/linear_attention/example_retention_fwd.py): the intra-chunk part as a decay-masked
    score tile through threadgroup memory, the inter-chunk part from a state fragment carried over
    the chunks (T.gemm with transpose_A for K^T V). The head's log2 decay is a T.alloc_var computed
    in the kernel. Key blocks split dk: O has one slice per key block, summed by the caller (as in
    the example). `seq` need not be a multiple of `chunk`."""
    nk, nv = T.ceildiv(dk, bk), T.ceildiv(dv, bv)
    scale = dk ** -0.5

    @T.prim_func
    def main(Q: T.Tensor((batch, seq, heads, dk), "float16"), K: T.Tensor((batch, seq, heads, dk), "float16"),
             V: T.Tensor((batch, seq, heads, dv), "float16"), O: T.Tensor((nk, batch, seq, heads, dv), ACCUM)):
        with T.Kernel(nv, nk, batch * heads, threads=128) as (iv, ik, bh):
            b, h = bh // heads, bh % heads
            log_decay = T.alloc_var(ACCUM)
            log_decay = T.log2(1 - T.exp2(-5.0 - T.cast(h, ACCUM)))
            q_s = T.alloc_shared((chunk, bk), "float16")
            k_s = T.alloc_shared((chunk, bk), "float16")
            v_s = T.alloc_shared((chunk, bv), "float16")
            state = T.alloc_fragment((bk, bv), ACCUM)
            state_s = T.alloc_shared((bk, bv), "float16")
            scores = T.alloc_fragment((chunk, chunk), ACCUM)
            scores_s = T.alloc_shared((chunk, chunk), "float16")
            out = T.alloc_fragment((chunk, bv), ACCUM)
            T.clear(state)
            for c in T.Pipelined(T.ceildiv(seq, chunk)):  # num_stages=0 as in the example: v_s is updated in place
                for r, d in T.Parallel(chunk, bk):
                    q_s[r, d] = T.if_then_else(c * chunk + r < seq, Q[b, T.min(c * chunk + r, seq - 1), h, ik * bk + d] * scale, 0)
                T.copy(K[b, c * chunk : (c + 1) * chunk, h, ik * bk : (ik + 1) * bk], k_s)
                T.copy(V[b, c * chunk : (c + 1) * chunk, h, iv * bv : (iv + 1) * bv], v_s)
                T.gemm(q_s, k_s, scores, transpose_B=True, clear_accum=True)
                for r, s in T.Parallel(chunk, chunk):
                    scores_s[r, s] = T.if_then_else(r >= s, scores[r, s] * T.exp2((r - s) * log_decay), 0)
                T.copy(state, state_s)
                T.gemm(q_s, state_s, out, clear_accum=True)
                for r, d in T.Parallel(chunk, bv):
                    out[r, d] = T.exp2((r + 1) * log_decay) * out[r, d]
                T.gemm(scores_s, v_s, out)
                for r, d in T.Parallel(chunk, bv):  # v_t weighted by its decay to the chunk's end
                    v_s[r, d] = v_s[r, d] * T.exp2((chunk - r - 1) * log_decay)
                for i, j in T.Parallel(bk, bv):
                    state[i, j] = T.exp2(chunk * log_decay) * state[i, j]
                T.copy(out, O[ik, b, c * chunk : (c + 1) * chunk, h, iv * bv : (iv + 1) * bv])
                T.gemm(k_s, v_s, state, transpose_A=True)

    return compile_emulated(main, target)


# ----------------------------------------------------------------------------- attention backward


@functools.lru_cache(maxsize=None)
def flash_attention_backward(target: str, batch: int, heads: int, seq: int, dim: int, causal: bool,
                             bm: int = 16, bn: int = 16, threads: int = 128):
    """Gradients of O = softmax(Q K^T / sqrt(d)) V (examples/flash_attention/example_mha_bwd_bhsd.py
    at a Metal-sized config): a first kernel computes Delta = rowsum(dO * O); the second, per key
    block, walks the query blocks recomputing P^T = exp2(K Q^T * scale - lse) from the forward's
    log2-sum-exp, accumulates dV += P^T dO and dK += dS^T Q in fragments, and adds each query
    block's dQ = dS K into the fp32 dQ with a tile atomic add (key blocks run in parallel).
    Positions past `seq` are masked."""
    sm_scale = 1.0 / math.sqrt(dim)
    scale = sm_scale * LOG2_E
    shape = (batch, heads, seq, dim)

    @T.macro
    def row_deltas(O, dO, Delta):
        with T.Kernel(T.ceildiv(seq, bm), heads, batch, threads=threads) as (bx, h, b):
            o = T.alloc_fragment((bm, dim), ACCUM)
            do = T.alloc_fragment((bm, dim), ACCUM)
            delta = T.alloc_fragment((bm,), ACCUM)
            T.copy(O[b, h, bx * bm : (bx + 1) * bm, :], o)
            T.copy(dO[b, h, bx * bm : (bx + 1) * bm, :], do)
            for i, d in T.Parallel(bm, dim):
                o[i, d] = o[i, d] * do[i, d]
            T.reduce_sum(o, delta, dim=1)
            T.copy(delta, Delta[b, h, bx * bm : (bx + 1) * bm])

    @T.macro
    def key_block_gradients(Q, K, V, dO, Lse, Delta, dQ, dK, dV):
        with T.Kernel(T.ceildiv(seq, bn), heads, batch, threads=threads) as (bx, h, b):
            k_s = T.alloc_shared((bn, dim), "float16")
            v_s = T.alloc_shared((bn, dim), "float16")
            q_s = T.alloc_shared((bm, dim), "float16")
            do_s = T.alloc_shared((bm, dim), "float16")
            lse_s = T.alloc_shared((bm,), ACCUM)
            delta_s = T.alloc_shared((bm,), ACCUM)
            pt_s = T.alloc_shared((bn, bm), "float16")
            dst_s = T.alloc_shared((bn, bm), "float16")
            key_pos = T.alloc_fragment((bn,), "int32")  # a loaded position keeps TVM's Simplify fast
            qk_t = T.alloc_fragment((bn, bm), ACCUM)
            dp_t = T.alloc_fragment((bn, bm), ACCUM)
            dk = T.alloc_fragment((bn, dim), ACCUM)
            dv = T.alloc_fragment((bn, dim), ACCUM)
            dq = T.alloc_fragment((bm, dim), ACCUM)
            T.copy(K[b, h, bx * bn : (bx + 1) * bn, :], k_s)
            T.copy(V[b, h, bx * bn : (bx + 1) * bn, :], v_s)
            T.clear(dk)
            T.clear(dv)
            for i in T.Parallel(bn):
                key_pos[i] = bx * bn + i
            first = bx * bn // bm if causal else 0
            for qb in T.Pipelined(first, T.ceildiv(seq, bm), num_stages=1):
                T.copy(Q[b, h, qb * bm : (qb + 1) * bm, :], q_s)
                T.copy(dO[b, h, qb * bm : (qb + 1) * bm, :], do_s)
                T.copy(Lse[b, h, qb * bm : (qb + 1) * bm], lse_s)
                T.copy(Delta[b, h, qb * bm : (qb + 1) * bm], delta_s)
                T.gemm(k_s, q_s, qk_t, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(bn, bm):
                    visible = (qb * bm + j < seq) & (key_pos[i] < seq)
                    if causal:
                        visible = visible & (qb * bm + j >= key_pos[i])
                    qk_t[i, j] = T.if_then_else(visible, T.exp2(qk_t[i, j] * scale - lse_s[j]), 0)
                T.copy(qk_t, pt_s)
                T.gemm(pt_s, do_s, dv)
                T.gemm(v_s, do_s, dp_t, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(bn, bm):
                    dp_t[i, j] = qk_t[i, j] * (dp_t[i, j] - delta_s[j]) * sm_scale
                T.copy(dp_t, dst_s)
                T.gemm(dst_s, q_s, dk)
                T.gemm(dst_s, k_s, dq, transpose_A=True, clear_accum=True)
                T.atomic_add(dQ[b, h, qb * bm : (qb + 1) * bm, :], dq)
            T.copy(dk, dK[b, h, bx * bn : (bx + 1) * bn, :])
            T.copy(dv, dV[b, h, bx * bn : (bx + 1) * bn, :])

    @T.prim_func
    def main(Q: T.Tensor(shape, "float16"), K: T.Tensor(shape, "float16"), V: T.Tensor(shape, "float16"),
             O: T.Tensor(shape, "float16"), dO: T.Tensor(shape, "float16"), Lse: T.Tensor((batch, heads, seq), ACCUM),
             Delta: T.Tensor((batch, heads, seq), ACCUM), dQ: T.Tensor(shape, ACCUM), dK: T.Tensor(shape, "float16"),
             dV: T.Tensor(shape, "float16")):
        row_deltas(O, dO, Delta)
        key_block_gradients(Q, K, V, dO, Lse, Delta, dQ, dK, dV)

    return compile_emulated(main, target)


# ----------------------------------------------------------------------------- warp specialization


def warp_specialized_gemm(M: int = 64, N: int = 64, K: int = 64, bm: int = 32, bn: int = 32, bk: int = 16):
    """A producer / consumer GEMM (examples/warp_specialize/example_warp_specialize_gemm_copy_0_gemm_1.py):
    threads 128-255 copy the tiles (`T.ws(0)`), threads 0-127 run the T.gemm (`T.ws(1)`), handing
    over through mbarriers. Metal has no mbarrier and the plugin's GEMM needs the whole threadgroup:
    compiling it is refused (the test checks the message)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=256) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), ACCUM)
            loaded = T.alloc_barrier(arrive_count=128)
            consumed = T.alloc_barrier(arrive_count=128)
            with T.ws(1):
                T.clear(acc)
            for kt in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                with T.ws(0):
                    T.barrier_wait(consumed, (kt + 1) % 2)
                    T.copy(A[by * bm, kt * bk], a_s)
                    T.copy(B[kt * bk, bx * bn], b_s)
                    T.barrier_arrive(loaded)
                with T.ws(1):
                    T.barrier_wait(loaded, kt % 2)
                    T.gemm(a_s, b_s, acc)
                    T.barrier_arrive(consumed)
            with T.ws(1):
                T.copy(acc, C[by * bm, bx * bn])

    return compile_emulated(main)
