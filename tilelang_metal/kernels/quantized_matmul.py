"""Matrix products with affine-quantized weights in MLX's layout (`mx.quantize`, `kernels.quantize`),
written in TileLang: out (M, N) = x (M, K) @ dequant(w).T, dequant(w) = scales * q + biases per group
of `group_size` consecutive elements along K.

    w       uint32 (N, K * bits / 32)   each row one little-endian bit stream of its K levels
    scales  dtype  (N, K / group_size)
    biases  dtype  (N, K / group_size)

(transpose=True, the default: w as nn.Linear stores it; transpose=False below.)

The vector kernel (decoding's qmv: M <= VECTOR_MAX_M, and M=None): a threadgroup holds `SIMDGROUPS`
simdgroups, each owning `COLUMNS` neighbouring output columns (rows of w); the 32 lanes of a
simdgroup split K, each lane reading a run of a column's bit stream per step: `WORDS_PER_LANE` words
(one vector load) at 2, 4 and 8 bits, `bits` words (32 levels, some across two words) at 3, 5 and 6.
K a multiple of 32 keeps every row's words a whole number of lane runs, so a lane's run lies wholly
inside or outside the row, and inside one group: one scale and bias per run. The lane
dequantizes its run as kernels.dequantize does (`rounded_product`, `rounded_sum`: bit for bit, so
an infinite x times a weight of 0 is NaN as in torch, anything else keeps its sign) and multiplies it
with the same K elements of each of `MAX_ROWS` rows of x, accumulating in float32; one `simd_sum` per output adds the
lanes' partials (no threadgroup memory, no barrier). The second grid axis walks M in chunks of
`MAX_ROWS`, so a threadgroup reads its weights once for that many rows. A column past N reads the last
column (clamped) and stores nothing.

The tiled kernel (prefill, M > VECTOR_MAX_M): a threadgroup of 128 threads computes a 32x64 tile of
out; per K step of 32 (inside one group) it copies the x tile to threadgroup memory and dequantizes
the 64x32 tile of w there (2, 4, 8 bits: each thread 1 to 4 whole words; 3, 5, 6 bits: 16
levels of a row, each from a 64-bit window of its two words; dequantized as in the vector kernel),
then T.gemm(x_tile, w_tile^T) accumulates in float32 (simdgroup matrices on plain metal; on metal4
the x tile's staging is bypassed). Rows of w past N read the last one. Both tiles' rows are padded to
an odd multiple of 16 bytes (kernels.gemm.staged_row_pad) and a thread's dequantized levels are stored
as runs of at least 16 bytes (8 bits in 16-bit dtypes: two words per thread), so simdgroup_load's
8 rows, the x copy and the w stores meet in no threadgroup bank (dense 64-byte rows replayed).

transpose=False (w (K, N) quantized along N, out = x @ dequant(w)): the tiled kernel for every M,
each thread dequantizing 16 neighbouring columns of a row of the 32x64 w tile; any K; the same padding.

`M=None` compiles one kernel for every row count (a dynamic first dimension).

No `from __future__ import annotations` here: TileLang evaluates the T.Tensor annotations.
"""

from typing import Any

import tilelang.language as T

from ..core.dtypes import MSL_SCALAR, MSL_SCALAR_BYTES
from ..target.isa import SIMD_WIDTH
from .gemm import staged_row_pad
from .quantize import BITS, GROUP_SIZES
from .sizes import integer_sizes

ACCUM = "float32"
DTYPES = ("float16", "bfloat16", "float32")
WORD_BITS = 32
WORDS_PER_LANE = 2  # 8 bytes of w per lane and step: 16 levels at 4 bits, 8 at 8 bits (MLX's qmv reads as many)
COLUMNS = 4  # output columns per simdgroup
SIMDGROUPS = 2
MAX_ROWS = 4  # rows of x per threadgroup (the second grid axis walks M in chunks of this)
# the tiled kernel (prefill): x and dequantized w tiles in threadgroup memory, T.gemm on them
TILE_M, TILE_N, TILE_K, TILE_THREADS = 32, 64, 32, 128  # TILE_K divides every group size: one scale per row and step
STORE_RUN_BYTES = 16  # the widest store a thread's neighbouring dequantized levels merge into
VECTOR, TILED = "vector", "tiled"
ROUTES = (VECTOR, TILED)
VECTOR_MAX_M = 8  # rows up to which the vector kernel is chosen (kernels.matmul's GEMV_MAX_ROWS; a heuristic, not measured)


def rounded_product(scale: Any, level: Any, dtype: str) -> Any:
    """scale * level rounded to dtype: the first step of kernels.dequantize's (and MLX's) weight
    scale * q + bias, computed in float32 (exact: an 8-bit level times a 24-bit scale at most)."""
    return T.cast(T.cast(scale, ACCUM) * T.cast(level, ACCUM), dtype)


def rounded_sum(product: Any, bias: Any, dtype: str) -> Any:
    """product + bias rounded to dtype: the float32 sum of two dtype values rounded again is the
    correctly rounded sum (float32 has at least 2p + 2 bits of a 16-bit float's p). The product is
    stored before (`rounded_product`), so no compiler fuses the two into one rounding: a level whose
    weight is exactly 0 in kernels.dequantize would keep a residual, and x = inf times it would give
    inf, not torch's NaN; the weights are kernels.dequantize's bit for bit."""
    return T.cast(T.cast(product, ACCUM) + T.cast(bias, ACCUM), dtype)


def unpacked_level(packed: Any, column: int, j: int, bits: int) -> Any:
    """Level j (a Python int) of the run in packed[column, :] (uint32 words of one bit stream): its
    word and shift are constants; a level that runs into the next word takes its high bits from it."""
    first, shift = divmod(j * bits, WORD_BITS)
    level = packed[column, first] >> T.uint32(shift)
    if shift + bits > WORD_BITS:
        level = level | (packed[column, first + 1] << T.uint32(WORD_BITS - shift))
    return level & T.uint32((1 << bits) - 1)


def _check(M: Any, N: Any, K: Any, bits: Any, group_size: Any, dtype: Any, transpose: Any) -> tuple[Any, int, int, int, int]:
    """(M or None, N, K, bits, group_size) checked, or a one-line ValueError naming the bad argument."""
    what = "quantized_matmul"
    if M is None:
        N, K, bits, group_size = integer_sizes(what, N=N, K=K, bits=bits, group_size=group_size)
    else:
        M, N, K, bits, group_size = integer_sizes(what, M=M, N=N, K=K, bits=bits, group_size=group_size)
        if M <= 0:
            raise ValueError(f"{what} needs M >= 1 (got M={M}); pass M=None for a kernel that takes any row count")
    if not isinstance(transpose, bool):
        raise ValueError(f"{what} transpose={transpose!r} must be True (w (N, K), as nn.Linear stores it) or False (w (K, N))")
    if bits not in BITS:
        raise ValueError(f"{what} bits={bits} is not supported; use one of {', '.join(map(str, BITS))} (mx.quantize's affine bits)")
    if group_size not in GROUP_SIZES:
        raise ValueError(f"{what} group_size={group_size} is not supported; use one of {', '.join(map(str, GROUP_SIZES))}")
    if dtype not in DTYPES:
        raise ValueError(f"{what} dtype={dtype!r} is not supported; use one of {', '.join(DTYPES)}")
    if N <= 0:
        raise ValueError(f"{what} needs N >= 1 (got N={N}): the output columns, w's rows")
    if K <= 0:
        raise ValueError(f"{what} needs K >= 1 (got K={K}): x's columns")
    quantized, size = ("K", K) if transpose else ("N", N)  # the axis mx.quantize grouped: w's last
    if size % group_size:
        raise ValueError(f"{what} needs {quantized} to be a multiple of group_size={group_size} with transpose={transpose} "
                         f"(got {quantized}={size}); pad w's quantized axis with zeros, or pick a group_size dividing {quantized}")
    return M, N, K, bits, group_size


def quantized_matmul_route(M: Any, transpose: bool = True) -> tuple[str, str]:
    """(route, reason): "vector" for M=None (any row count: decoding's kernel) and M <= VECTOR_MAX_M, else "tiled";
    "tiled" for every M with transpose=False."""
    if M is not None:
        (M,) = integer_sizes("quantized_matmul_route", M=M, minimum=1)
    if not isinstance(transpose, bool):
        raise ValueError(f"quantized_matmul_route transpose={transpose!r} must be True (w (N, K)) or False (w (K, N))")
    if not transpose:
        return TILED, "transpose=False: w (K, N) is dequantized in tiles along N for T.gemm (no vector kernel for that layout yet)"
    if M is None:
        return VECTOR, "M=None: the vector kernel takes any row count (decoding's shape); pass route='tiled' for prefill"
    if M <= VECTOR_MAX_M:
        return VECTOR, f"M={M} <= {VECTOR_MAX_M}: a {TILE_M}-row tile would compute mostly padding; lanes split K instead"
    return TILED, f"M={M} > {VECTOR_MAX_M}: dequantized {TILE_N}x{TILE_K} tiles of w in threadgroup memory are read by {TILE_M} rows of x through T.gemm"


def quantized_matmul_program(M: Any, N: int, K: int, *, bits: int, group_size: int, dtype: str = "float16",
                             transpose: bool = True, route: str | None = None) -> Any:
    """The `T.prim_func` (X, W, scales, biases, out) of `route` (None: `quantized_matmul_route(M)`);
    compile with `out_idx=[-1]`."""
    M = _check(M, N, K, bits, group_size, dtype, transpose)[0]  # M an int before the route compares it
    if route is None:
        route = quantized_matmul_route(M, transpose)[0]
    if route not in ROUTES:
        raise ValueError(f"quantized_matmul route={route!r} is not supported; use one of {', '.join(ROUTES)} or None (by M)")
    if route == VECTOR and not transpose:
        raise ValueError("quantized_matmul route='vector' needs transpose=True; pass route='tiled' or None for w (K, N)")
    build = _vector_program if route == VECTOR else _tiled_program if transpose else _tiled_kn_program
    return build(M, N, K, bits=bits, group_size=group_size, dtype=dtype, transpose=transpose)


def _vector_program(M: Any, N: int, K: int, *, bits: int, group_size: int, dtype: str, transpose: bool) -> Any:
    M, N, K, bits, group_size = _check(M, N, K, bits, group_size, dtype, transpose)
    # 2, 4, 8 bits: WORDS_PER_LANE words of whole levels; 3, 5, 6: `bits` words, 32 levels (some across two words)
    run_words = WORDS_PER_LANE if WORD_BITS % bits == 0 else bits
    run = run_words * WORD_BITS // bits  # K elements of one lane's run: 32 at least, so inside one group
    words = K * bits // WORD_BITS  # per row of w: (K / 32) * bits, a multiple of run_words
    groups = K // group_size
    step_words = SIMD_WIDTH * run_words
    level_places = list(range(run))
    steps = -(-words // step_words)
    mask = (1 << bits) - 1
    rows = MAX_ROWS if M is None else min(M, MAX_ROWS)
    block_n = SIMDGROUPS * COLUMNS
    n_rows = T.dynamic("M") if M is None else M
    # a lane's x run as one vector load when it is at most 16 bytes, else in 16-byte pieces
    x_bytes = {"float16": 2, "bfloat16": 2, "float32": 4}[dtype]
    x_piece = min(run, 16 // x_bytes)

    @T.prim_func
    def qmv(
        X: T.Tensor((n_rows, K), dtype),
        W: T.Tensor((N, words), "uint32"),
        Scales: T.Tensor((N, groups), dtype),
        Biases: T.Tensor((N, groups), dtype),
        Out: T.Tensor((n_rows, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, block_n), T.ceildiv(n_rows, rows), threads=(SIMD_WIDTH, SIMDGROUPS)) as (bx, by):
            lane = T.get_thread_binding(0)
            sg = T.get_thread_binding(1)
            packed = T.alloc_local((COLUMNS, run_words), "uint32")
            products = T.alloc_local((1,), dtype)
            weights = T.alloc_local((COLUMNS, run), dtype)
            xs = T.alloc_local((run,), dtype)
            acc = T.alloc_local((rows, COLUMNS), ACCUM)
            T.clear(acc)
            n0 = bx * block_n + sg * COLUMNS
            m0 = by * rows
            for s in T.serial(steps):
                word0 = s * step_words + lane * run_words
                if word0 < words:  # a lane's run is wholly in the row or wholly past it
                    k0 = (s * SIMD_WIDTH + lane) * run
                    group = k0 // group_size
                    for c in T.unroll(COLUMNS):
                        n = T.min(n0 + c, N - 1)  # columns past N read the last one and store nothing
                        if run_words in (2, 4):  # 8 or 16 bytes: one vector load
                            for v in T.vectorized(run_words):
                                packed[c, v] = W[n, word0 + v]
                        else:
                            for v in T.unroll(run_words):
                                packed[c, v] = W[n, word0 + v]
                        scale = Scales[n, group]
                        bias = Biases[n, group]
                        for j in level_places:  # a Python list: unrolled as the IR is built, words and shifts constant
                            level = unpacked_level(packed, c, j, bits)
                            products[0] = rounded_product(scale, level, dtype)
                            weights[c, j] = rounded_sum(products[0], bias, dtype)
                    for r in T.unroll(rows):  # unrolled: acc stays in registers (constant indices)
                        if m0 + r < n_rows:
                            for p in T.unroll(run // x_piece):
                                for v in T.vectorized(x_piece):
                                    xs[p * x_piece + v] = X[m0 + r, k0 + p * x_piece + v]
                            for c in T.unroll(COLUMNS):
                                for j in T.unroll(run):
                                    acc[r, c] += T.cast(xs[j], ACCUM) * T.cast(weights[c, j], ACCUM)
            for r in T.unroll(rows):
                for c in T.unroll(COLUMNS):
                    acc[r, c] = T.warp_reduce_sum(acc[r, c])
            if lane == 0:
                for r in T.unroll(rows):
                    if m0 + r < n_rows:
                        for c in T.unroll(COLUMNS):
                            if n0 + c < N:
                                Out[m0 + r, n0 + c] = T.cast(acc[r, c], dtype)

    return qmv


def _tiled_program(M: Any, N: int, K: int, *, bits: int, group_size: int, dtype: str, transpose: bool) -> Any:
    M, N, K, bits, group_size = _check(M, N, K, bits, group_size, dtype, transpose)
    whole = WORD_BITS % bits == 0  # 2, 4, 8 bits: whole levels per word, each thread dequantizes whole words
    per_word = WORD_BITS // bits
    words = K * bits // WORD_BITS
    groups = K // group_size
    tile_words = TILE_K * bits // WORD_BITS  # words of one row of w per K step
    # whole levels: a thread dequantizes runs of `run_words` neighbouring words of a row, at least 16 bytes
    # of levels (two words at 8 bits in 16-bit dtypes): a simdgroup's stores are then 16-byte runs of the
    # padded rows, which meet in no bank (8-byte runs of 4 rows would)
    run_words = max(1, STORE_RUN_BYTES // (WORD_BITS // bits * MSL_SCALAR_BYTES[MSL_SCALAR[dtype]])) if whole else 1
    runs = tile_words // run_words  # runs per row of the tile
    loads = TILE_N * runs // TILE_THREADS  # runs each thread dequantizes per K step (whole levels)
    share = TILE_N * TILE_K // TILE_THREADS  # levels each thread dequantizes per K step (3, 5, 6 bits)
    parts = TILE_K // share  # threads per row of the tile
    mask = (1 << bits) - 1
    n_rows = T.dynamic("M") if M is None else M
    x_pad, w_pad = staged_row_pad(TILE_K, dtype), staged_row_pad(TILE_K, dtype)

    @T.prim_func
    def qmm(
        X: T.Tensor((n_rows, K), dtype),
        W: T.Tensor((N, words), "uint32"),
        Scales: T.Tensor((N, groups), dtype),
        Biases: T.Tensor((N, groups), dtype),
        Out: T.Tensor((n_rows, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, TILE_N), T.ceildiv(n_rows, TILE_M), threads=TILE_THREADS) as (bx, by):
            tid = T.get_thread_binding()
            x_tile = T.alloc_shared((TILE_M, TILE_K + x_pad), dtype)
            w_tile = T.alloc_shared((TILE_N, TILE_K + w_pad), dtype)
            acc = T.alloc_fragment((TILE_M, TILE_N), ACCUM)
            products = T.alloc_local((1,), dtype)
            T.clear(acc)
            for ks in T.serial(K // TILE_K):
                T.copy(X[by * TILE_M, ks * TILE_K], x_tile[0:TILE_M, 0:TILE_K])
                group = ks * TILE_K // group_size  # TILE_K divides group_size: one group per row of the step
                if whole:
                    for i in T.unroll(loads):
                        slot = i * TILE_THREADS + tid
                        row = slot // runs
                        word0 = slot % runs * run_words
                        n = T.min(bx * TILE_N + row, N - 1)  # rows of w past N read the last one; T.copy stores no column past N
                        scale = Scales[n, group]
                        bias = Biases[n, group]
                        for v in T.unroll(run_words):  # a scalar per word (a local array would cost registers)
                            packed = W[n, ks * tile_words + word0 + v]
                            for j in T.unroll(per_word):
                                level = (packed >> T.uint32(j * bits)) & T.uint32(mask)
                                products[0] = rounded_product(scale, level, dtype)
                                w_tile[row, (word0 + v) * per_word + j] = rounded_sum(products[0], bias, dtype)
                else:
                    # `share` consecutive levels of one row per thread; a level may open in one word and end in the
                    # next: both read as one 64-bit window (a shift below 32, never by the full width)
                    row = tid // parts
                    n = T.min(bx * TILE_N + row, N - 1)
                    scale = Scales[n, group]
                    bias = Biases[n, group]
                    for j in T.unroll(share):
                        bit = (tid % parts * share + j) * bits
                        low = W[n, ks * tile_words + bit // WORD_BITS]
                        high = W[n, ks * tile_words + T.min(bit // WORD_BITS + 1, tile_words - 1)]
                        window = (T.cast(high, "uint64") << T.uint64(WORD_BITS)) | T.cast(low, "uint64")
                        level = T.cast((window >> T.cast(bit % WORD_BITS, "uint64")) & T.uint64(mask), "uint32")
                        products[0] = rounded_product(scale, level, dtype)
                        w_tile[row, tid % parts * share + j] = rounded_sum(products[0], bias, dtype)
                T.gemm(x_tile[0:TILE_M, 0:TILE_K], w_tile[0:TILE_N, 0:TILE_K], acc, transpose_B=True)
            T.copy(acc, Out[by * TILE_M, bx * TILE_N])

    return qmm


def _tiled_kn_program(M: Any, N: int, K: int, *, bits: int, group_size: int, dtype: str, transpose: bool) -> Any:
    """The tiled kernel for transpose=False: w (K, N) quantized along N (w_q (K, N * bits / 32), scales
    (K, N / group_size)), out = x @ dequant(w). Each thread dequantizes 16 neighbouring columns of one
    row of the 32x64 w tile (one group: 16 divides every group size), every level from a 64-bit
    window of its two words; rows past K are zeros (x's are too: T.copy fills them), columns past N
    read the row's last word and group and are never stored."""
    M, N, K, bits, group_size = _check(M, N, K, bits, group_size, dtype, transpose)
    words = N * bits // WORD_BITS
    groups = N // group_size
    share = TILE_N * TILE_K // TILE_THREADS  # 16 columns of one row per thread
    parts = TILE_N // share
    n_rows = T.dynamic("M") if M is None else M
    x_pad, w_pad = staged_row_pad(TILE_K, dtype), staged_row_pad(TILE_N, dtype)

    @T.prim_func
    def qmm_kn(
        X: T.Tensor((n_rows, K), dtype),
        W: T.Tensor((K, words), "uint32"),
        Scales: T.Tensor((K, groups), dtype),
        Biases: T.Tensor((K, groups), dtype),
        Out: T.Tensor((n_rows, N), dtype),
    ):
        with T.Kernel(T.ceildiv(N, TILE_N), T.ceildiv(n_rows, TILE_M), threads=TILE_THREADS) as (bx, by):
            tid = T.get_thread_binding()
            x_tile = T.alloc_shared((TILE_M, TILE_K + x_pad), dtype)
            w_tile = T.alloc_shared((TILE_K, TILE_N + w_pad), dtype)
            acc = T.alloc_fragment((TILE_M, TILE_N), ACCUM)
            products = T.alloc_local((1,), dtype)
            T.clear(acc)
            for ks in T.serial(T.ceildiv(K, TILE_K)):
                T.copy(X[by * TILE_M, ks * TILE_K], x_tile[0:TILE_M, 0:TILE_K])
                row = tid // parts
                k = ks * TILE_K + row
                n = bx * TILE_N + tid % parts * share
                if k < K:
                    group = T.min(n // group_size, groups - 1)
                    scale = Scales[k, group]
                    bias = Biases[k, group]
                    for j in T.unroll(share):
                        bit = (n + j) * bits
                        low = W[k, T.min(bit // WORD_BITS, words - 1)]
                        high = W[k, T.min(bit // WORD_BITS + 1, words - 1)]
                        window = (T.cast(high, "uint64") << T.uint64(WORD_BITS)) | T.cast(low, "uint64")
                        level = T.cast((window >> T.cast(bit % WORD_BITS, "uint64")) & T.uint64((1 << bits) - 1), "uint32")
                        products[0] = rounded_product(scale, level, dtype)
                        w_tile[row, tid % parts * share + j] = rounded_sum(products[0], bias, dtype)
                else:
                    for j in T.unroll(share):
                        w_tile[row, tid % parts * share + j] = T.cast(0, dtype)
                T.gemm(x_tile[0:TILE_M, 0:TILE_K], w_tile[0:TILE_K, 0:TILE_N], acc)
            T.copy(acc, Out[by * TILE_M, bx * TILE_N])

    return qmm_kn


def quantized_matmul(M: Any, N: int, K: int, *, bits: int, group_size: int, dtype: str = "float16", transpose: bool = True,
                     chip: Any = None, target: Any = None, execution_backend: str | None = None, route: str | None = None) -> Any:
    """The compiled kernel, called as `kernel(x (M, K), w (N, K * bits / 32) uint32, scales, biases) -> out (M, N)`
    with w, scales and biases as `mx.quantize` / `kernels.quantize` return them. `chip` is accepted for
    `kernels.matmul`'s signature; both kernels are the same on every chip. `route` ("vector", "tiled")
    overrides the choice by M (`quantized_matmul_route`)."""
    import tilelang

    from ..performance.roofline import chip as chip_named

    if chip is not None and not hasattr(chip, "name"):
        chip_named(chip)  # an unknown chip name is refused in one line, as kernels.matmul does
    program = quantized_matmul_program(M, N, K, bits=bits, group_size=group_size, dtype=dtype, transpose=transpose, route=route)
    kwargs = {"execution_backend": execution_backend} if execution_backend else {}
    return tilelang.compile(program, out_idx=[-1], target=target or "metal", **kwargs)
