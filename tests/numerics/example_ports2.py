"""More kernels in the style of TileLang's `examples/` (mhc Sinkhorn normalization, KDA chunk-local
cumsum, online log-sum-exp over a dynamic length with `T.Pipelined`, uint4 dequantize GEMM with
group scales, split-K GEMV with atomic adds, fp16 / bf16 casts, a masked index gather, a two-level
atomic histogram), written for `test_example_ports2.py`: the same
algorithms and TileLang features at Metal-sized tiles, our own code. Each builder returns a
compiled emulator kernel, cached per configuration so the test module compiles each kernel once."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations.
import functools

import tilelang
import tilelang.language as T

LOG2_E = 1.4426950408889634


def compile_emulated(func, **kwargs):
    return tilelang.compile(func, target="metal", execution_backend="emulator", **kwargs)


# ----------------------------------------------------------------------------- mhc: Sinkhorn


@functools.lru_cache(maxsize=None)
def sinkhorn(batch: int, n: int, threads: int = 32):
    """Per (n, n) matrix: P = exp(L - rowmax), then `iters` rounds (a runtime scalar, 0 allowed) of
    dividing every row by its sum and every column by its sum (examples/mhc: the Sinkhorn-Knopp
    projection of the hyper-connection mixing matrix). Row and column sums are fragment reductions
    along dim 1 and dim 0 inside a loop whose trip count is only known at run time."""

    @T.prim_func
    def main(L: T.Tensor((batch, n, n), "float32"), P: T.Tensor((batch, n, n), "float32"), iters: T.int32):
        with T.Kernel(batch, threads=threads) as b:
            p = T.alloc_fragment((n, n), "float32")
            row = T.alloc_fragment((n,), "float32")
            col = T.alloc_fragment((n,), "float32")
            T.copy(L[b, :, :], p)
            T.reduce_max(p, row, dim=1)
            for i, j in T.Parallel(n, n):
                p[i, j] = T.exp(p[i, j] - row[i])
            for _ in T.serial(iters):
                T.reduce_sum(p, row, dim=1)
                for i, j in T.Parallel(n, n):
                    p[i, j] = p[i, j] / row[i]
                T.reduce_sum(p, col, dim=0)
                for i, j in T.Parallel(n, n):
                    p[i, j] = p[i, j] / col[j]
            T.copy(p, P[b, :, :])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- KDA: chunk cumsum


@functools.lru_cache(maxsize=None)
def chunk_cumsum(batch: int, seq: int, heads: int, chunk: int, reverse: bool, threads: int = 64):
    """Out[b, t, h] = sum of G[b, s, h] over the s in t's chunk of `chunk` steps with s <= t (or
    s >= t when `reverse`): the chunk-local gate cumsum of examples/KDA (FLA's chunk_local_cumsum).
    The last chunk is partial: `T.copy` pads the tile, the scan must not carry the padding in."""

    @T.prim_func
    def main(G: T.Tensor((batch, seq, heads), "float32"), Out: T.Tensor((batch, seq, heads), "float32")):
        with T.Kernel(T.ceildiv(seq, chunk), batch, threads=threads) as (c, b):
            tile = T.alloc_shared((chunk, heads), "float32")
            T.copy(G[b, c * chunk:(c + 1) * chunk, :], tile)
            T.cumsum(tile, dim=0, reverse=reverse)
            T.copy(tile, Out[b, c * chunk:(c + 1) * chunk, :])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- online log-sum-exp


@functools.lru_cache(maxsize=None)
def pipelined_logsumexp(rows: int = 8, bn: int = 32, threads: int = 64, stages: int = 2):
    """Lse[i] = log(sum_j exp(X[i, j])) over a symbolic number of columns N, streamed through
    shared memory by a `T.Pipelined` loop of ceil(N / bn) steps (0 when N is 0, 1 when N <= bn),
    with the online max / rescaled sum of examples/online_softmax. Rows that are all -inf (and
    empty rows) give -inf, a +inf entry gives +inf, a NaN gives NaN, as torch.logsumexp."""
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Lse: T.Tensor((M,), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bm:
            xs = T.alloc_shared((rows, bn), "float32")
            x = T.alloc_fragment((rows, bn), "float32")
            m = T.alloc_fragment((rows,), "float32")
            m_prev = T.alloc_fragment((rows,), "float32")
            m_tile = T.alloc_fragment((rows,), "float32")
            s = T.alloc_fragment((rows,), "float32")
            s_tile = T.alloc_fragment((rows,), "float32")
            T.fill(m, -T.infinity("float32"))
            T.fill(s, 0.0)
            for k in T.Pipelined(T.ceildiv(N, bn), num_stages=stages):
                T.copy(X[bm * rows, k * bn], xs)
                for i, j in T.Parallel(rows, bn):
                    x[i, j] = T.if_then_else(k * bn + j < N, xs[i, j], -T.infinity("float32"))
                T.copy(m, m_prev)
                T.reduce_max(x, m_tile, dim=1)
                for i in T.Parallel(rows):
                    m[i] = T.max(m_prev[i], m_tile[i])
                # a row whose max is still -inf (or +inf) subtracts 0, not itself: no inf - inf
                for i, j in T.Parallel(rows, bn):
                    x[i, j] = T.exp2((x[i, j] - T.if_then_else(T.isinf(m[i]), 0.0, m[i])) * LOG2_E)
                T.reduce_sum(x, s_tile, dim=1)
                for i in T.Parallel(rows):
                    # equal maxima (both -inf after an all -inf tile, say) rescale by 1, not exp(NaN)
                    s[i] = s[i] * T.if_then_else(m_prev[i] == m[i], 1.0, T.exp2((m_prev[i] - m[i]) * LOG2_E)) + s_tile[i]
            for i in T.Parallel(rows):
                if bm * rows + i < M:
                    Lse[bm * rows + i] = T.if_then_else(T.isinf(m[i]), m[i], T.log(s[i]) + m[i])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- dequantize GEMM


@functools.lru_cache(maxsize=None)
def uint4_dequant_gemm(M: int, N: int, K: int, group: int, bm: int = 32, bn: int = 32, bk: int = 32, threads: int = 128):
    """C = A @ W^T with W[n, k] = (q[n, k] - 8) * Scale[n, k // group], the 4-bit q packed two per
    byte of B (low nibble first): each K step unpacks and scales a (bn, bk) tile of W into
    threadgroup memory and runs `T.gemm` on it (examples/dequantize_gemm, uint4 with group scales,
    fp16 operands and fp32 accumulation)."""
    if K % bk or bk % group and group % bk:
        raise ValueError(f"uint4_dequant_gemm: K ({K}) must be a multiple of bk ({bk}), and bk and the group ({group}) must divide one another")

    @T.prim_func
    def main(
        A: T.Tensor((M, K), "float16"),
        B: T.Tensor((N, K // 2), "uint8"),
        Scale: T.Tensor((N, K // group), "float16"),
        C: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            packed = T.alloc_shared((bn, bk // 2), "uint8")
            w_s = T.alloc_shared((bn, bk), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for k in T.Pipelined(K // bk, num_stages=1):
                T.copy(A[by * bm, k * bk], a_s)
                T.copy(B[bx * bn, k * (bk // 2)], packed)
                for i, j in T.Parallel(bn, bk):
                    q = (packed[i, j // 2] >> T.cast((j % 2) * 4, "uint8")) & T.uint8(15)
                    scale = Scale[T.min(bx * bn + i, N - 1), (k * bk + j) // group]
                    w_s[i, j] = (T.cast(q, "float16") - T.float16(8)) * scale
                T.gemm(a_s, w_s, acc, transpose_B=True)
            T.copy(acc, C[by * bm, bx * bn])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- split-K GEMV


@functools.lru_cache(maxsize=None)
def splitk_gemv(N: int, K: int, splits: int, bn: int = 4, bk: int = 64, threads: int = 64):
    """y += W @ x with K cut into `splits` slices, one per threadgroup along the grid's y axis:
    each reduces its slice of (bn, bk) tiles into a fragment and adds its partial sums into y with
    `T.atomic_add` (examples/gemv, the split-K variant). The caller zeroes y."""
    slice_k = -(-K // splits)

    @T.prim_func
    def main(x: T.Tensor((K,), "float16"), W: T.Tensor((N, K), "float16"), y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, bn), splits, threads=threads) as (bx, sk):
            w = T.alloc_fragment((bn, bk), "float32")
            part = T.alloc_fragment((bn,), "float32")
            total = T.alloc_fragment((bn,), "float32")
            T.clear(total)
            for kt in T.serial(T.ceildiv(slice_k, bk)):
                for i, j in T.Parallel(bn, bk):
                    kk = sk * slice_k + kt * bk + j
                    w[i, j] = T.if_then_else(
                        (kt * bk + j < slice_k) and (kk < K) and (bx * bn + i < N),
                        T.cast(W[bx * bn + i, kk], "float32") * T.cast(x[kk], "float32"),
                        0.0,
                    )
                T.reduce_sum(w, part, dim=1)
                for i in T.Parallel(bn):
                    total[i] += part[i]
            for i in T.Parallel(bn):
                if bx * bn + i < N:
                    T.atomic_add(y[bx * bn + i], total[i])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- cast / gather


@functools.lru_cache(maxsize=None)
def cast_rows(M: int, N: int, out_dtype: str, rows: int = 4, threads: int = 32):
    """Y = cast(X * 1, out_dtype) through a fragment (examples/cast, the bf16 / fp16 output side):
    rounding to nearest even, overflow to inf, NaN kept, subnormals kept."""

    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), Y: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bm:
            x = T.alloc_fragment((rows, N), "float32")
            y = T.alloc_fragment((rows, N), out_dtype)
            T.copy(X[bm * rows, 0], x)
            for i, j in T.Parallel(rows, N):
                y[i, j] = T.cast(x[i, j], out_dtype)
            T.copy(y, Y[bm * rows, 0])

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def gather_rows(rows: int, D: int, picks: int, bp: int = 8, threads: int = 64):
    """Out[p, :] = Src[Idx[p], :] for Idx[p] >= 0 and zeros for Idx[p] < 0 (the masked index gather of
    examples/deepseek_nsa / sparse MLA: selected KV rows staged into threadgroup memory by index)."""

    @T.prim_func
    def main(Src: T.Tensor((rows, D), "float16"), Idx: T.Tensor((picks,), "int32"), Out: T.Tensor((picks, D), "float16")):
        with T.Kernel(T.ceildiv(picks, bp), threads=threads) as b:
            tile = T.alloc_shared((bp, D), "float16")
            for i, j in T.Parallel(bp, D):
                p = T.min(b * bp + i, picks - 1)
                tile[i, j] = T.if_then_else(Idx[p] >= 0, Src[T.max(Idx[p], 0), j], T.float16(0))
            T.copy(tile, Out[b * bp, 0])

    return compile_emulated(main)


# ----------------------------------------------------------------------------- histogram


@functools.lru_cache(maxsize=None)
def histogram(numel: int, bins: int, blocks: int, threads: int = 64):
    """Hist[v] += 1 for every value v of X in [0, bins) (others ignored): each threadgroup counts a
    grid-stride share into a threadgroup histogram with atomic adds, then adds it into the device
    histogram with one atomic per bin (the two-level atomic pattern of examples/*/example_atomic*).
    The caller zeroes Hist."""

    @T.prim_func
    def main(X: T.Tensor((numel,), "int32"), Hist: T.Tensor((bins,), "int32")):
        with T.Kernel(blocks, threads=threads) as b:
            local = T.alloc_shared((bins,), "int32")
            tx = T.get_thread_binding()
            T.clear(local)
            for idx in T.serial(b * threads + tx, numel, step=blocks * threads):
                if X[idx] >= 0 and X[idx] < bins:
                    T.atomic_add(local[X[idx]], 1)
            for v in T.Parallel(bins):
                T.atomic_add(Hist[v], local[v])

    return compile_emulated(main)
