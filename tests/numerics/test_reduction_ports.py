"""Kernels in the style of TileLang's examples (norm, online softmax, gemv), written for these
tests, run on Metal in the emulator and compared with torch. Shapes are small and not multiples
of the tiles where the kernel allows it."""

from __future__ import annotations

import functools

import tilelang
import tilelang.language as T
import torch


def compile_emulated(func):
    return tilelang.compile(func, target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def online_softmax(M: int, N: int, chunk: int, threads: int):
    """Row softmax in one pass for the statistics (running max and rescaled running sum over
    chunks of the row, padding masked to -inf) and one pass for the output."""
    chunks = -(-N // chunk)

    @T.prim_func
    def main(X: T.Tensor((M, N), "float16"), Y: T.Tensor((M, N), "float16")):
        with T.Kernel(M, threads=threads) as row:
            x = T.alloc_fragment((chunk,), "float32")
            e = T.alloc_fragment((chunk,), "float32")
            chunk_max = T.alloc_fragment((1,), "float32")
            chunk_sum = T.alloc_fragment((1,), "float32")
            run_max = T.alloc_fragment((1,), "float32")
            run_sum = T.alloc_fragment((1,), "float32")
            new_max = T.alloc_fragment((1,), "float32")
            T.fill(run_max, -T.infinity("float32"))
            T.fill(run_sum, 0.0)
            for c in T.serial(chunks):
                for j in T.Parallel(chunk):
                    x[j] = T.if_then_else(c * chunk + j < N, X[row, c * chunk + j].astype("float32"), -T.infinity("float32"))
                T.reduce_max(x, chunk_max, dim=0)
                for j in T.Parallel(1):
                    new_max[j] = T.max(run_max[j], chunk_max[j])
                for j in T.Parallel(chunk):
                    e[j] = T.exp(x[j] - new_max[0])
                T.reduce_sum(e, chunk_sum, dim=0)
                for j in T.Parallel(1):
                    run_sum[j] = run_sum[j] * T.exp(run_max[j] - new_max[j]) + chunk_sum[j]
                    run_max[j] = new_max[j]
            for c in T.serial(chunks):
                for j in T.Parallel(chunk):
                    if c * chunk + j < N:
                        Y[row, c * chunk + j] = (T.exp(X[row, c * chunk + j].astype("float32") - run_max[0]) / run_sum[0]).astype("float16")

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def rms_norm(M: int, N: int, rows: int, threads: int, eps: float):
    @T.prim_func
    def main(X: T.Tensor((M, N), "float32"), G: T.Tensor((N,), "float32"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as b:
            x = T.alloc_fragment((rows, N), "float32")
            sq = T.alloc_fragment((rows, N), "float32")
            ms = T.alloc_fragment((rows,), "float32")
            T.copy(X[b * rows, 0], x)
            for i, j in T.Parallel(rows, N):
                sq[i, j] = x[i, j] * x[i, j]
            T.reduce_sum(sq, ms, dim=1)
            for i in T.Parallel(rows):
                ms[i] = T.rsqrt(ms[i] / N + eps)
            for i, j in T.Parallel(rows, N):
                x[i, j] = x[i, j] * ms[i] * G[j]
            T.copy(x, Y[b * rows, 0])

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def layer_norm(M: int, N: int, rows: int, threads: int, eps: float):
    @T.prim_func
    def main(X: T.Tensor((M, N), "float16"), G: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), Y: T.Tensor((M, N), "float16")):
        with T.Kernel(T.ceildiv(M, rows), threads=threads) as b:
            x = T.alloc_fragment((rows, N), "float32")
            d = T.alloc_fragment((rows, N), "float32")
            mean = T.alloc_fragment((rows,), "float32")
            var = T.alloc_fragment((rows,), "float32")
            for i, j in T.Parallel(rows, N):
                x[i, j] = T.if_then_else(b * rows + i < M, X[b * rows + i, j].astype("float32"), 0.0)
            T.reduce_sum(x, mean, dim=1)
            for i, j in T.Parallel(rows, N):
                d[i, j] = (x[i, j] - mean[i] / N) * (x[i, j] - mean[i] / N)
            T.reduce_sum(d, var, dim=1)
            for i, j in T.Parallel(rows, N):
                if b * rows + i < M:
                    Y[b * rows + i, j] = ((x[i, j] - mean[i] / N) * T.rsqrt(var[i] / N + eps) * G[j] + B[j]).astype("float16")

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def gemv_tile_reduce(N: int, K: int, block_n: int, block_k: int, threads: int):
    """y = W @ x: each threadgroup owns block_n outputs, accumulates W * x over K in a
    (block_n, block_k) fragment, then reduces the fragment's rows with T.reduce_sum."""

    @T.prim_func
    def main(x: T.Tensor((K,), "float16"), W: T.Tensor((N, K), "float16"), y: T.Tensor((N,), "float16")):
        with T.Kernel(T.ceildiv(N, block_n), threads=threads) as bn:
            acc = T.alloc_fragment((block_n, block_k), "float32")
            out = T.alloc_fragment((block_n,), "float32")
            T.clear(acc)
            for kb in T.serial(T.ceildiv(K, block_k)):
                for i, j in T.Parallel(block_n, block_k):
                    n, k = bn * block_n + i, kb * block_k + j
                    acc[i, j] += T.if_then_else(n < N and k < K, W[n, k].astype("float32") * x[k].astype("float32"), 0.0)
            T.reduce_sum(acc, out, dim=1)
            for i in T.Parallel(block_n):
                if bn * block_n + i < N:
                    y[bn * block_n + i] = out[i].astype("float16")

    return compile_emulated(main)


@functools.lru_cache(maxsize=None)
def gemv_thread_allreduce(N: int, K: int, block_n: int, lanes: int, per_lane: int):
    """y = W @ x with a 2-D threadgroup (lanes along K, block_n rows) and TVM's
    tvm_thread_allreduce across the K lanes (lowered by LowerThreadAllreduce to simd shuffles)."""
    block_k = lanes * per_lane

    @T.prim_func
    def main(x: T.Tensor((K,), "float16"), W: T.Tensor((N, K), "float16"), y: T.Tensor((N,), "float16")):
        with T.Kernel(T.ceildiv(N, block_n), threads=(lanes, block_n)) as bn:
            tk = T.get_thread_binding(0)
            tn = T.get_thread_binding(1)
            part = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            T.clear(part)
            for kb in T.serial(T.ceildiv(K, block_k)):
                for e in T.serial(per_lane):
                    k = kb * block_k + tk * per_lane + e
                    if k < K and bn * block_n + tn < N:
                        part[0] += x[k].astype("float32") * W[bn * block_n + tn, k].astype("float32")
            with T.attr(T.comm_reducer(lambda a, b: a + b, [T.Cast("float32", 0)]), "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), part[0], True, total[0], tk, dtype="handle"))
            if bn * block_n + tn < N and tk == 0:  # one lane stores: all 32 writing y would race (racecheck)
                y[bn * block_n + tn] = total[0].astype("float16")

    return compile_emulated(main)


def test_online_softmax_matches_torch():
    M, N = 3, 150  # 3 chunks of 64, the last one partial
    x = (torch.randn(M, N) * 3).half()
    y = torch.empty(M, N, dtype=torch.float16)
    online_softmax(M, N, 64, 64)(x, y)
    torch.testing.assert_close(y.float(), torch.softmax(x.float(), dim=1), rtol=1e-2, atol=2e-3)


def test_rms_norm_matches_torch():
    M, N, eps = 6, 96, 1e-6
    x, g = torch.randn(M, N), torch.randn(N)
    y = torch.empty(M, N)
    rms_norm(M, N, 2, 64, eps)(x, g, y)
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g
    torch.testing.assert_close(y, want, rtol=1e-4, atol=1e-4)


def test_layer_norm_forward_matches_torch():
    M, N, eps = 5, 64, 1e-5  # 5 rows in blocks of 2: the last block is half empty
    x = torch.randn(M, N).half()
    g, b = torch.randn(N), torch.randn(N)
    y = torch.empty(M, N, dtype=torch.float16)
    layer_norm(M, N, 2, 128, eps)(x, g, b, y)
    want = torch.nn.functional.layer_norm(x.float(), (N,), g, b, eps)
    torch.testing.assert_close(y.float(), want, rtol=1e-2, atol=1e-2)


def test_gemv_with_a_tile_reduction_matches_torch():
    N, K = 20, 100  # neither divides its tile
    x, w = torch.randn(K).half(), torch.randn(N, K).half()
    y = torch.empty(N, dtype=torch.float16)
    gemv_tile_reduce(N, K, 8, 32, 64)(x, w, y)
    torch.testing.assert_close(y.float(), w.float() @ x.float(), rtol=1e-2, atol=1e-2)


def test_gemv_with_tvm_thread_allreduce_matches_torch():
    N, K = 10, 96
    x, w = torch.randn(K).half(), torch.randn(N, K).half()
    y = torch.empty(N, dtype=torch.float16)
    kernel = gemv_thread_allreduce(N, K, 2, 32, 4)
    kernel(x, w, y)
    torch.testing.assert_close(y.float(), w.float() @ x.float(), rtol=1e-2, atol=1e-2)
    assert "simd_shuffle_down" in kernel.get_kernel_source()
