"""Kernels in the style of TileLang's examples (topk, hadamard_transform, convolution,
dequantize_gemm, blocksparse_gemm, linear_attention, norm, gemm_streamk), written for the port
tests. Each builder returns a compiled emulator kernel, cached per configuration so a test module
compiles each kernel once."""

# No `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations, and a
# string annotation cannot see builder arguments the kernel body does not use.
import functools
import math

import tilelang
import tilelang.language as T

from tilelang_metal.kernels import metal4_target

TARGETS = {"metal": lambda: "metal", "metal4": metal4_target}


def compile_emulated(func, target: str = "metal"):
    return tilelang.compile(func, target=TARGETS[target](), execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def topk(M: int, N: int, K: int, rows: int = 8, threads: int = 128):
    """The K largest values of each row and their indices, largest first, by K rounds of a row max;
    ties go to the lowest index (the max of N - j over the positions holding the maximum)."""

    @T.prim_func
    def main(L: T.Tensor((M, N), "float32"), V: T.Tensor((M, K), "float32"), I: T.Tensor((M, K), "int32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as bx:
            x = T.alloc_fragment((rows, N), "float32")
            flipped = T.alloc_fragment((rows, N), "int32")
            best = T.alloc_fragment((rows,), "float32")
            best_flipped = T.alloc_fragment((rows,), "int32")
            T.copy(L[bx * rows, 0], x)
            for r in T.serial(K):
                T.reduce_max(x, best, dim=1)
                for i, j in T.Parallel(rows, N):
                    flipped[i, j] = T.if_then_else(x[i, j] == best[i], N - j, 0)
                T.reduce_max(flipped, best_flipped, dim=1)
                for i, j in T.Parallel(rows, N):
                    if j == N - best_flipped[i]:
                        x[i, j] = -T.infinity("float32")
                for i in T.Parallel(rows):
                    if bx * rows + i < M:
                        V[bx * rows + i, r] = best[i]
                        I[bx * rows + i, r] = N - best_flipped[i]

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def hadamard(B: int, n: int, threads: int):
    """Y = X @ H_n (Sylvester order), one row per threadgroup. Thread t holds elements
    [t*E, (t+1)*E); the butterfly on bit b of the element index runs in registers for the bits
    inside a thread, with simd shuffles (T.shfl_xor) for the lane bits, and through threadgroup
    memory for the simdgroup bits."""
    if n & (n - 1) or threads & (threads - 1) or n < threads:
        raise ValueError(f"hadamard: n ({n}) and threads ({threads}) must be powers of two with n >= threads")
    per_thread = n // threads
    element_bits = int(math.log2(per_thread))
    lane_bits = int(math.log2(min(threads, 32)))
    group_bits = int(math.log2(max(threads // 32, 1)))

    @T.prim_func
    def main(X: T.Tensor((B, n), "float32"), Y: T.Tensor((B, n), "float32")):
        with T.Kernel(B, threads=threads) as row:
            tx = T.get_thread_binding()
            v = T.alloc_local((per_thread,), "float32")
            partner = T.alloc_local((per_thread,), "float32")
            exchange = T.alloc_shared((n,), "float32")
            for e in T.serial(per_thread):
                v[e] = X[row, tx * per_thread + e]
            for s in T.unroll(element_bits):
                for e in T.serial(per_thread):
                    partner[e] = v[e ^ (1 << s)]
                for e in T.serial(per_thread):
                    v[e] = T.if_then_else((e >> s) & 1 == 0, v[e] + partner[e], partner[e] - v[e])
            for s in T.unroll(lane_bits):
                for e in T.serial(per_thread):
                    partner[e] = T.shfl_xor(v[e], 1 << s)
                for e in T.serial(per_thread):
                    v[e] = T.if_then_else((tx >> s) & 1 == 0, v[e] + partner[e], partner[e] - v[e])
            for s in T.unroll(group_bits):
                for e in T.serial(per_thread):
                    exchange[tx * per_thread + e] = v[e]
                for e in T.serial(per_thread):
                    partner[e] = exchange[(tx ^ (32 << s)) * per_thread + e]
                for e in T.serial(per_thread):
                    v[e] = T.if_then_else((tx >> (5 + s)) & 1 == 0, v[e] + partner[e], partner[e] - v[e])
            for e in T.serial(per_thread):
                Y[row, tx * per_thread + e] = v[e]

    return compile_emulated(main)


def conv_output_size(size: int, ks: int, stride: int, pad: int, dilation: int) -> int:
    return (size + 2 * pad - dilation * (ks - 1) - 1) // stride + 1


@functools.lru_cache(maxsize=None)
def im2col_conv(target: str, N: int, H: int, W: int, C: int, F: int, ks: int, stride: int, pad: int, dilation: int,
                bm: int = 32, bn: int = 16, bk: int = 16, tile_op: bool = False):
    """NHWC convolution as a GEMM: the im2col tile of the input is gathered into threadgroup memory
    (zero outside the image) by index arithmetic, or with `tile_op` by TileLang's `T.im2col` tile op (`c2d_im2col` in the examples);
    the weights are read through a (ks*ks*C, F) view of their tensor and the output is written
    through an (N*OH*OW, F) view of its tensor."""
    OH, OW = conv_output_size(H, ks, stride, pad, dilation), conv_output_size(W, ks, stride, pad, dilation)
    KK = ks * ks * C

    @T.prim_func
    def main(Data: T.Tensor((N, H, W, C), "float16"), Wt: T.Tensor((ks, ks, C, F), "float16"), Out: T.Tensor((N, OH, OW, F), "float16")):
        with T.Kernel(T.ceildiv(F, bn), T.ceildiv(N * OH * OW, bm), threads=128) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            w_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            w_flat = T.Tensor((KK, F), "float16", Wt.data)
            out_flat = T.Tensor((N * OH * OW, F), "float16", Out.data)
            T.clear(acc)
            for kt in T.Pipelined(T.ceildiv(KK, bk), num_stages=1):
                if tile_op:
                    T.im2col(Data, a_s, by, kt, ks, stride, dilation, pad)
                else:
                    for i, j in T.Parallel(bm, bk):
                        m = by * bm + i
                        kk = kt * bk + j
                        h = m % (OH * OW) // OW * stride + kk // (ks * C) * dilation - pad
                        w = m % OW * stride + kk // C % ks * dilation - pad
                        inside = m < N * OH * OW and kk < KK and h >= 0 and h < H and w >= 0 and w < W
                        a_s[i, j] = T.if_then_else(
                            inside, Data[T.min(m // (OH * OW), N - 1), T.max(T.min(h, H - 1), 0), T.max(T.min(w, W - 1), 0), kk % C], T.float16(0))
                T.copy(w_flat[kt * bk, bx * bn], w_s)
                T.gemm(a_s, w_s, acc)
            T.copy(acc, out_flat[by * bm, bx * bn])

    return compile_emulated(main, target)


@functools.lru_cache(maxsize=None)
def int4_gemv(M: int, N: int, K: int, group: int, lanes: int = 32, rows: int = 4, per_lane: int = 8):
    """Y[m, n] = sum_k X[m, k] * (q[n, k] - 8) * Scale[n, k // group], the 4-bit q packed two per
    byte (low nibble first). A 2-D threadgroup: `lanes` threads along K (one simdgroup, summed with
    T.warp_reduce_sum), `rows` output rows."""
    if K % per_lane or per_lane % 2 or K % group:
        raise ValueError(f"int4_gemv: K ({K}) must be a multiple of per_lane ({per_lane}, even) and of group ({group})")
    block_k = lanes * per_lane

    @T.prim_func
    def main(X: T.Tensor((M, K), "float16"), Q: T.Tensor((N, K // 2), "uint8"), Scale: T.Tensor((N, K // group), "float16"), Y: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, rows), M, threads=(lanes, rows)) as (bn, m):
            lane = T.get_thread_binding(0)
            n = bn * rows + T.get_thread_binding(1)
            packed = T.alloc_local((per_lane // 2,), "uint8")
            w = T.alloc_local((per_lane,), "float32")
            acc = T.alloc_local((1,), "float32")
            T.clear(acc)
            for kb in T.serial(T.ceildiv(K, block_k)):
                k0 = kb * block_k + lane * per_lane
                if n < N and k0 < K:
                    for b in T.vectorized(per_lane // 2):
                        packed[b] = Q[n, k0 // 2 + b]
                    for e in T.serial(per_lane):
                        nibble = (packed[e // 2] >> T.uint8(4 * (e % 2))) & T.uint8(15)
                        w[e] = (T.Cast("float32", nibble) - 8.0) * T.Cast("float32", Scale[n, (k0 + e) // group])
                    for e in T.serial(per_lane):
                        acc[0] += T.Cast("float32", X[m, k0 + e]) * w[e]
            total = T.warp_reduce_sum(acc[0])
            if lane == 0 and n < N:
                Y[m, n] = T.Cast("float16", total)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def int8_gemv_dp4a(M: int, N: int, K: int, lanes: int = 32, rows: int = 2, per_lane: int = 8):
    """Y[m, n] = sum_k X[m, k] * W[n, k] on int8 with an int32 accumulator, four products at a time
    with T.dp4a (TileLang's int8 dequantize-GEMV path), summed over the K lanes with
    T.warp_reduce_sum."""
    if K % per_lane or per_lane % 4:
        raise ValueError(f"int8_gemv_dp4a: K ({K}) must be a multiple of per_lane ({per_lane}, a multiple of 4)")
    block_k = lanes * per_lane

    @T.prim_func
    def main(X: T.Tensor((M, K), "int8"), Wt: T.Tensor((N, K), "int8"), Y: T.Tensor((M, N), "int32")):
        with T.Kernel(T.ceildiv(N, rows), M, threads=(lanes, rows)) as (bn, m):
            lane = T.get_thread_binding(0)
            n = bn * rows + T.get_thread_binding(1)
            x = T.alloc_local((per_lane,), "int8")
            w = T.alloc_local((per_lane,), "int8")
            acc = T.alloc_local((1,), "int32")
            T.clear(acc)
            for kb in T.serial(T.ceildiv(K, block_k)):
                k0 = kb * block_k + lane * per_lane
                if n < N and k0 < K:
                    for e in T.serial(per_lane):
                        x[e] = X[m, k0 + e]
                        w[e] = Wt[n, k0 + e]
                    for q in T.serial(per_lane // 4):
                        T.dp4a(x[q * 4], w[q * 4], acc[0])
            total = T.warp_reduce_sum(acc[0])
            if lane == 0 and n < N:
                Y[m, n] = total

    return compile_emulated(main)


def mask_shape(M: int, N: int, K: int, bm: int, bn: int, bk: int) -> tuple[int, int, int]:
    return (-(-M // bm), -(-N // bn), -(-K // bk))


@functools.lru_cache(maxsize=None)
def blocksparse_gemm(target: str, M: int, N: int, K: int, bm: int = 32, bn: int = 32, bk: int = 16):
    """C = A @ B over the (M-tile, N-tile, K-tile) products a bool mask enables."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), Mask: T.Tensor(mask_shape(M, N, K, bm, bn, bk), "bool"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for k in T.Pipelined(T.ceildiv(K, bk), num_stages=1):
                if Mask[by, bx, k]:
                    T.copy(A[by * bm, k * bk], a_s)
                    T.copy(B[k * bk, bx * bn], b_s)
                    T.gemm(a_s, b_s, acc)
            T.copy(acc, C[by * bm, bx * bn])

    return compile_emulated(main, target)


@functools.lru_cache(maxsize=None)
def chunked_linear_attention(target: str, Bt: int, S: int, H: int, DK: int, DV: int, chunk: int = 16):
    """O_t = sum_{s <= t} (scale * q_t . k_s) v_s, chunk by chunk: the causal part inside a chunk
    (masked Q K^T staged in threadgroup memory, times V) plus Q times the state sum k_s^T v_s of the
    chunks before; the final state is an output too. A tail chunk (S not a multiple) reads zeros."""
    scale = DK**-0.5

    @T.prim_func
    def main(Q: T.Tensor((Bt, S, H, DK), "float16"), Kt: T.Tensor((Bt, S, H, DK), "float16"), V: T.Tensor((Bt, S, H, DV), "float16"),
             O: T.Tensor((Bt, S, H, DV), "float32"), State: T.Tensor((Bt, H, DK, DV), "float32")):
        with T.Kernel(Bt * H, threads=128) as bh:
            b = bh // H
            h = bh % H
            q = T.alloc_shared((chunk, DK), "float16")
            k = T.alloc_shared((chunk, DK), "float16")
            v = T.alloc_shared((chunk, DV), "float16")
            state = T.alloc_fragment((DK, DV), "float32")
            state_s = T.alloc_shared((DK, DV), "float16")
            s = T.alloc_fragment((chunk, chunk), "float32")
            s_s = T.alloc_shared((chunk, chunk), "float16")
            o = T.alloc_fragment((chunk, DV), "float32")
            T.clear(state)
            for c in T.Pipelined(T.ceildiv(S, chunk), num_stages=1):
                for i, j in T.Parallel(chunk, DK):
                    t = c * chunk + i
                    q[i, j] = T.if_then_else(t < S, Q[b, T.min(t, S - 1), h, j] * T.float16(scale), T.float16(0))
                    k[i, j] = T.if_then_else(t < S, Kt[b, T.min(t, S - 1), h, j], T.float16(0))
                for i, j in T.Parallel(chunk, DV):
                    t = c * chunk + i
                    v[i, j] = T.if_then_else(t < S, V[b, T.min(t, S - 1), h, j], T.float16(0))
                T.gemm(q, k, s, transpose_B=True, clear_accum=True)
                for i, j in T.Parallel(chunk, chunk):
                    s_s[i, j] = T.if_then_else(i >= j, s[i, j], 0.0)
                T.gemm(s_s, v, o, clear_accum=True)
                T.copy(state, state_s)
                T.gemm(q, state_s, o)
                T.gemm(k, v, state, transpose_A=True)
                for i, j in T.Parallel(chunk, DV):
                    if c * chunk + i < S:
                        O[b, c * chunk + i, h, j] = o[i, j]
            T.copy(state, State[b, h, :, :])

    return compile_emulated(main, target)


@functools.lru_cache(maxsize=None)
def layer_norm_backward(N: int, D: int, rows: int, threads: int):
    """dX, dGamma, dBeta of y = (x - mean) * rstd * gamma + beta, given mean and rstd. Each
    threadgroup takes `rows` rows: two row reductions for dX, two column reductions for its part
    of dGamma / dBeta, added into the outputs with tile atomics."""

    @T.prim_func
    def main(DY: T.Tensor((N, D), "float16"), X: T.Tensor((N, D), "float16"), G: T.Tensor((D,), "float32"), Mean: T.Tensor((N,), "float32"),
             Rstd: T.Tensor((N,), "float32"), DX: T.Tensor((N, D), "float16"), DG: T.Tensor((D,), "float32"), DB: T.Tensor((D,), "float32")):
        with T.Kernel(T.ceildiv(N, rows), threads=threads) as bx:
            x_hat = T.alloc_fragment((rows, D), "float32")
            dx_hat = T.alloc_fragment((rows, D), "float32")
            product = T.alloc_fragment((rows, D), "float32")
            dy = T.alloc_fragment((rows, D), "float32")
            sum_dx_hat = T.alloc_fragment((rows,), "float32")
            sum_product = T.alloc_fragment((rows,), "float32")
            dg = T.alloc_fragment((D,), "float32")
            db = T.alloc_fragment((D,), "float32")
            for i, j in T.Parallel(rows, D):
                r = T.min(bx * rows + i, N - 1)
                live = bx * rows + i < N
                dy[i, j] = T.if_then_else(live, T.Cast("float32", DY[r, j]), 0.0)
                x_hat[i, j] = T.if_then_else(live, (T.Cast("float32", X[r, j]) - Mean[r]) * Rstd[r], 0.0)
                dx_hat[i, j] = dy[i, j] * G[j]
                product[i, j] = dx_hat[i, j] * x_hat[i, j]
            T.reduce_sum(dx_hat, sum_dx_hat, dim=1)
            T.reduce_sum(product, sum_product, dim=1)
            for i, j in T.Parallel(rows, D):
                if bx * rows + i < N:
                    DX[bx * rows + i, j] = T.Cast("float16", Rstd[bx * rows + i] * (dx_hat[i, j] - (sum_dx_hat[i] + x_hat[i, j] * sum_product[i]) / D))
            for i, j in T.Parallel(rows, D):
                product[i, j] = dy[i, j] * x_hat[i, j]
            T.reduce_sum(product, dg, dim=0)
            T.reduce_sum(dy, db, dim=0)
            T.atomic_add(DG, dg)
            T.atomic_add(DB, db)

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def streamk_gemm(target: str, M: int, N: int, K: int, programs: int, bm: int = 16, bn: int = 32, bk: int = 16):
    """C = A @ B^T with the (tile, K step) iterations split evenly over `programs` threadgroups. A
    threadgroup walks its range tile piece by tile piece: a piece covering a whole tile's K range is
    stored, a partial piece is added into C with tile atomics (C starts at zero)."""
    tiles_n = -(-N // bn)
    steps = -(-K // bk)
    total = -(-M // bm) * tiles_n * steps
    share, extra = divmod(total, programs)

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((N, K), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(programs, threads=64) as pid:
            a_s = T.alloc_shared((bm, bk), "float16")
            b_s = T.alloc_shared((bn, bk), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            it = T.alloc_var("int32")
            piece_end = T.alloc_var("int32")
            it = pid * share + T.min(pid, extra)
            end = (pid + 1) * share + T.min(pid + 1, extra)
            while it < end:
                tile = it // steps
                first = it % steps
                piece_end = T.min(it + steps - first, end)
                tm = tile // tiles_n
                tn = tile % tiles_n
                T.clear(acc)
                for k in T.Pipelined(piece_end - it, num_stages=1):
                    T.copy(A[tm * bm, (first + k) * bk], a_s)
                    T.copy(B[tn * bn, (first + k) * bk], b_s)
                    T.gemm(a_s, b_s, acc, transpose_B=True)
                if first == 0 and piece_end % steps == 0:
                    T.copy(acc, C[tm * bm, tn * bn])
                else:
                    T.atomic_add(C[tm * bm, tn * bn], acc)
                it = piece_end

    return compile_emulated(main, target), total
