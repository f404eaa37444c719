"""User-written TileLang programs for the adversarial sweep (tests/slow/test_adversarial.py): small
kernels of the kinds users write, each with symbolic sizes so one compile serves every shape.

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

import tilelang.language as T

COLS = 33  # columns of the row kernels: odd, not a multiple of a simdgroup or a vector
ROWS = 4  # rows per threadgroup of the row kernels
PADDED_COLS = 64
THREADS = 128
BINS = 16  # histogram bins of the atomic kernel


def user_module():
    """Seven kernels in one module over a symbolic row count `n` (0 included: empty grids) and a
    runtime trip count `steps`; every access is guarded in the program itself, so the module can
    be compiled with `tl.disable_safe_memory_legalize`.

    - Yi = int32 elementwise whose branch depends on the thread (tx % 3) and the value;
      Yb = int8 and Yu = uint8 elementwise that wrap around, Ys = int16 with an arithmetic shift;
      Yd = floor division and modulo by a runtime divisor of either sign; YC = Collatz steps (a
      while loop), YL = a running sum left by T.loop_break once it passes steps * 50
    - Yh = where(x > 0, sqrt(x), exp(x) / 2) in float16 (T.Parallel, data-dependent branch)
    - RS / RM / RN / RA = row sum / max / min / absmax of X (n, 33) float32 by T.reduce_*
    - CS / RCS = cumulative sum of X along its rows, forward and reversed (T.cumsum on threadgroup memory)
    - H = histogram of Xi mod 16 (int32 atomics), S = column sums of X (float atomics),
      AM = max of Xi (int32 atomic max), FX / FN = column max / min of X (float atomic max / min),
      H16 / BM / BC = float16 sums, bfloat16 maxima and bfloat16 counts by bins of Xi (16-bit atomics)
    - P[i] = sum over s < steps of X[i, s mod 33] * (s + 1) (a loop of runtime trip count: 0, 1, ...)
    - W = V * 2 + 1 with V a (n, 33) float16 view of any strides (T.StridedTensor)
    """
    n = T.dynamic("n")
    v0, v1 = T.dynamic("v0"), T.dynamic("v1")

    @T.prim_func
    def main(
        Xi: T.Tensor((n,), "int32"),
        Xb: T.Tensor((n,), "int8"),
        Xh: T.Tensor((n,), "float16"),
        X: T.Tensor((n, COLS), "float32"),
        V: T.StridedTensor((n, COLS), (v0, v1), "float16"),
        Xs: T.Tensor((n,), "int16"),
        Xu: T.Tensor((n,), "uint8"),
        steps: T.int32,
        divisor: T.int32,
        Yi: T.Tensor((n,), "int32"),
        Yd: T.Tensor((n,), "int32"),
        Ys: T.Tensor((n,), "int16"),
        Yu: T.Tensor((n,), "uint8"),
        Yb: T.Tensor((n,), "int8"),
        YC: T.Tensor((n,), "int32"),
        YL: T.Tensor((n,), "int32"),
        Yh: T.Tensor((n,), "float16"),
        RS: T.Tensor((n,), "float32"),
        RM: T.Tensor((n,), "float32"),
        RN: T.Tensor((n,), "float32"),
        RA: T.Tensor((n,), "float32"),
        CS: T.Tensor((n, COLS), "float32"),
        RCS: T.Tensor((n, COLS), "float32"),
        H: T.Tensor((BINS,), "int32"),
        S: T.Tensor((COLS,), "float32"),
        AM: T.Tensor((1,), "int32"),
        FX: T.Tensor((COLS,), "float32"),
        FN: T.Tensor((COLS,), "float32"),
        H16: T.Tensor((8,), "float16"),
        BM: T.Tensor((8,), "bfloat16"),
        BC: T.Tensor((8,), "bfloat16"),
        P: T.Tensor((n,), "float32"),
        W: T.Tensor((n, COLS), "float32"),
    ):
        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            for t in T.Parallel(THREADS):
                i = bx * THREADS + t
                if i < n:
                    v = Xi[i]
                    if t % 3 == 0:
                        Yi[i] = v * 3 - 7
                    elif v < 0:
                        Yi[i] = v >> 1
                    else:
                        Yi[i] = v % 7
                    Yb[i] = Xb[i] * T.int8(3) + T.int8(1)
                    Yd[i] = T.floordiv(v, divisor) ^ T.floormod(v, divisor)
                    Ys[i] = Xs[i] * T.int16(7) - (Xs[i] >> 3)
                    Yu[i] = (Xu[i] >> 2) ^ (Xu[i] * T.uint8(5))
                    # a while loop of data-dependent trip count (Collatz steps of |v| % 97 + 1)
                    walk = T.alloc_var("int32")
                    count = T.alloc_var("int32")
                    walk = T.abs(v) % 97 + 1
                    count = 0
                    while walk != 1:
                        if walk % 2 == 0:
                            walk = walk // 2
                        else:
                            walk = walk * 3 + 1
                        count = count + 1
                    YC[i] = count
                    # a serial loop each thread leaves at its own iteration (T.loop_break)
                    total = T.alloc_var("int32")
                    total = 0
                    for k in T.serial(200):
                        if total > steps * 50:
                            T.loop_break()
                        total = total + T.abs(v) % 13 + k
                    YL[i] = total
                    x = Xh[i]
                    if x > T.float16(0):
                        Yh[i] = T.sqrt(x)
                    else:
                        Yh[i] = T.exp(x) * T.float16(0.5)

        with T.Kernel(T.ceildiv(n, ROWS), threads=THREADS) as bx:
            # a fragment of 4 x 33 does not split over 128 threads (refused by name): padded to 64
            # columns, 0 for the sum and the row's first element for the max
            x = T.alloc_fragment((ROWS, PADDED_COLS), "float32")
            y = T.alloc_fragment((ROWS, PADDED_COLS), "float32")
            row_sum = T.alloc_fragment((ROWS,), "float32")
            row_max = T.alloc_fragment((ROWS,), "float32")
            row_min = T.alloc_fragment((ROWS,), "float32")
            row_absmax = T.alloc_fragment((ROWS,), "float32")
            for i, j in T.Parallel(ROWS, PADDED_COLS):
                r = T.min(bx * ROWS + i, n - 1)
                x[i, j] = T.if_then_else(j < COLS, X[r, T.min(j, COLS - 1)], T.float32(0))
                y[i, j] = X[r, T.min(j, COLS - 1) * T.cast(j < COLS, "int32")]
            T.reduce_sum(x, row_sum, dim=1)
            T.reduce_max(y, row_max, dim=1)
            T.reduce_min(y, row_min, dim=1)
            T.reduce_absmax(y, row_absmax, dim=1)
            for i in T.Parallel(ROWS):
                if bx * ROWS + i < n:
                    RS[bx * ROWS + i] = row_sum[i]
                    RM[bx * ROWS + i] = row_max[i]
                    RN[bx * ROWS + i] = row_min[i]
                    RA[bx * ROWS + i] = row_absmax[i]

        with T.Kernel(T.ceildiv(n, ROWS), threads=THREADS) as bx:
            tile = T.alloc_shared((ROWS, COLS), "float32")
            for i, j in T.Parallel(ROWS, COLS):
                r = bx * ROWS + i
                tile[i, j] = T.if_then_else(r < n, X[T.min(r, n - 1), j], T.float32(0))
            rtile = T.alloc_shared((ROWS, COLS), "float32")
            for i, j in T.Parallel(ROWS, COLS):
                rtile[i, j] = tile[i, j]
            T.cumsum(tile, dim=1)
            T.cumsum(rtile, dim=1, reverse=True)
            for i, j in T.Parallel(ROWS, COLS):
                if bx * ROWS + i < n:
                    CS[bx * ROWS + i, j] = tile[i, j]
                    RCS[bx * ROWS + i, j] = rtile[i, j]

        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            for t in T.Parallel(THREADS):
                i = bx * THREADS + t
                if i < n:
                    T.atomic_add(H[Xi[i] % BINS], 1)
                    T.atomic_max(AM[0], Xi[i])
                    # 16-bit atomics on neighbouring elements (one 32-bit word holds two of them)
                    T.atomic_add(H16[Xi[i] % 8], T.cast(Xi[i] % 5, "float16"))
                    T.atomic_max(BM[Xi[i] % 8], T.cast(Xi[i], "bfloat16"))
                    T.atomic_add(BC[(Xi[i] // 8) % 8], T.cast(1, "bfloat16"))
                    for j in T.serial(COLS):
                        T.atomic_add(S[j], X[i, j])
                        T.atomic_max(FX[j], X[i, j])
                        T.atomic_min(FN[j], X[i, j])

        with T.Kernel(T.ceildiv(n, THREADS), threads=THREADS) as bx:
            for t in T.Parallel(THREADS):
                i = bx * THREADS + t
                if i < n:
                    acc = T.alloc_var("float32")
                    acc = T.float32(0)
                    for s in T.serial(steps):
                        acc += X[i, s % COLS] * T.cast(s + 1, "float32")
                    P[i] = acc

        with T.Kernel(T.ceildiv(n, ROWS), threads=THREADS) as bx:
            for i, j in T.Parallel(ROWS, COLS):
                r = bx * ROWS + i
                if r < n:
                    W[r, j] = T.cast(V[r, j], "float32") * 2.0 + 1.0

    return main


def gemm_epilogue(block_m: int = 32, block_n: int = 32, block_k: int = 16, threads: int = 128, dtype: str = "bfloat16"):
    """C = relu(A @ B * 0.5 + bias) + R with M, N, K symbolic (K = 0 included: a K loop of zero
    trips, C = relu(bias) + R), the standard fragment accumulator and a T.Parallel epilogue that
    stores C itself under its own bounds test."""
    M, N, K = T.dynamic("m"), T.dynamic("n"), T.dynamic("k")

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        Bias: T.Tensor((N,), "float32"),
        R: T.Tensor((M, N), "float32"),
        C: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(M, block_m), threads=threads) as (bx, by):
            a_s = T.alloc_shared((block_m, block_k), dtype)
            b_s = T.alloc_shared((block_k, block_n), dtype)
            acc = T.alloc_fragment((block_m, block_n), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, block_k), num_stages=2):
                T.copy(A[by * block_m, ko * block_k], a_s)
                T.copy(B[ko * block_k, bx * block_n], b_s)
                T.gemm(a_s, b_s, acc)
            for i, j in T.Parallel(block_m, block_n):
                row = by * block_m + i
                col = bx * block_n + j
                if row < M and col < N:
                    C[row, col] = T.max(acc[i, j] * 0.5 + Bias[col], 0) + R[row, col]

    return main


TILE = 32


def own_barriers():
    """Kernels that place their own T.sync_threads, compiled with tl.disable_thread_storage_sync
    (the configuration such kernels set): M, N symbolic, `rounds` a runtime trip count (0, 1, ...).

    - Y = X^T through a padded threadgroup tile (T.copy of a ragged tile in, a barrier, read across)
    - Z[r] = sum of row r of X over the column tiles (a barrier, one thread per row, float atomics)
    - Q = X after `rounds` smoothing steps within each 128-element tile of its rows: b[t] = a[t - 1] +
      a[t + 1] (the tile's own element at its ends), a[t] = b[t] / 2, a barrier after each half
    """
    M, N = T.dynamic("m"), T.dynamic("n")

    @T.prim_func
    def main(
        X: T.Tensor((M, N), "float32"),
        rounds: T.int32,
        Y: T.Tensor((N, M), "float32"),
        Z: T.Tensor((M,), "float32"),
        Q: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(T.ceildiv(N, TILE), T.ceildiv(M, TILE), threads=THREADS) as (bx, by):
            tile = T.alloc_shared((TILE, TILE + 1), "float32")
            for i, j in T.Parallel(TILE, TILE):
                r = by * TILE + i
                c = bx * TILE + j
                tile[i, j] = T.if_then_else(r < M and c < N, X[T.min(r, M - 1), T.min(c, N - 1)], T.float32(0))
            T.sync_threads()
            for j, i in T.Parallel(TILE, TILE):
                if bx * TILE + j < N and by * TILE + i < M:
                    Y[bx * TILE + j, by * TILE + i] = tile[i, j]
            tx = T.get_thread_binding()
            if tx < TILE:
                if by * TILE + tx < M:
                    total = T.alloc_var("float32")
                    total = T.float32(0)
                    for j in T.serial(TILE):
                        total += tile[tx, j]
                    T.atomic_add(Z[by * TILE + tx], total)

        with T.Kernel(T.ceildiv(N, THREADS), M, threads=THREADS) as (bx, row):
            a = T.alloc_shared((THREADS,), "float32")
            b = T.alloc_shared((THREADS,), "float32")
            tx = T.get_thread_binding()
            c = bx * THREADS + tx
            a[tx] = T.if_then_else(c < N, X[row, T.min(c, N - 1)], T.float32(0))
            T.sync_threads()
            for _ in T.serial(rounds):
                b[tx] = a[T.max(tx, 1) - 1] + a[T.min(tx + 1, THREADS - 1)]
                T.sync_threads()
                a[tx] = b[tx] * T.float32(0.5)
                T.sync_threads()
            if c < N:
                Q[row, c] = a[tx]

    return main


def strided_copy(rows: int = 16, cols: int = 40):
    """O = A * 2 through threadgroup memory (T.copy in, a fragment, T.copy out) with both A and O
    views of any row pitch (symbolic strides, unit column stride) and n symbolic: ragged row
    tiles, row starts at any element (A) or any 16-byte boundary (O)."""
    n = T.dynamic("n")
    a_pitch, o_pitch = T.dynamic("a_pitch"), T.dynamic("o_pitch")

    @T.prim_func
    def main(A: T.StridedTensor((n, cols), (a_pitch, 1), "float16"), O: T.StridedTensor((n, cols), (o_pitch, 1), "float32")):
        with T.Kernel(T.ceildiv(n, rows), threads=THREADS) as bx:
            a_s = T.alloc_shared((rows, cols), "float16")
            o_f = T.alloc_fragment((rows, cols), "float32")
            T.copy(A[bx * rows, 0], a_s)
            for i, j in T.Parallel(rows, cols):
                o_f[i, j] = T.cast(a_s[i, j], "float32") * 2.0
            T.copy(o_f, O[bx * rows, 0])

    return main
