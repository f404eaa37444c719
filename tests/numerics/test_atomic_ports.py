"""Ported kernels that need atomics, run in the emulator against torch: a split-K GEMM whose K
slices (threadgroups along z) add their partial products into C with atomic adds (element form
from a shared tile, and tile form straight from the accumulator fragment; simdgroup `metal` and
cooperative-tensor `metal4` targets), and an int32 histogram privatized per threadgroup in
threadgroup memory and merged into device memory."""


import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.kernels import metal4_target

TARGETS = {"metal": lambda: "metal", "metal4": metal4_target}


@functools.lru_cache(maxsize=None)
def splitk_gemm(target: str, tile_form: bool, M: int = 40, N: int = 48, K: int = 96, split_k: int = 3):
    """C += A @ B, K cut into split_k slices; each (bx, by, bz) threadgroup adds one slice's product."""
    bm, bn, bk = 32, 32, 16
    slice_k = K // split_k

    @T.prim_func
    def kernel(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), split_k, threads=128) as (bx, by, bz):
            a_tile = T.alloc_shared((bm, bk), "float16")
            b_tile = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(slice_k, bk), num_stages=0):
                T.copy(A[by * bm, bz * slice_k + ko * bk], a_tile)
                T.copy(B[bz * slice_k + ko * bk, bx * bn], b_tile)
                T.gemm(a_tile, b_tile, acc)
            if tile_form:
                T.atomic_add(C[by * bm, bx * bn], acc)
            else:
                c_tile = T.alloc_shared((bm, bn), "float32")
                T.copy(acc, c_tile)
                for i, j in T.Parallel(bm, bn):
                    if by * bm + i < M and bx * bn + j < N:
                        T.atomic_add(C[by * bm + i, bx * bn + j], c_tile[i, j])

    return tilelang.compile(kernel, target=TARGETS[target](), execution_backend="emulator"), (M, N, K)


@pytest.mark.parametrize("target", ["metal", "metal4"])
@pytest.mark.parametrize("tile_form", [False, True], ids=["element", "tile"])
def test_splitk_gemm_accumulates_slices_with_atomic_adds(target, tile_form):
    kernel, (M, N, K) = splitk_gemm(target, tile_form)
    gen = torch.Generator().manual_seed(11)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(K, N, generator=gen).half()
    c = torch.randn(M, N, generator=gen)  # atomics add to what is there: start from non-zero C
    want = c + a.float() @ b.float()
    kernel(a, b, c)
    torch.testing.assert_close(c, want, rtol=1e-3, atol=1e-3)


NBINS, CHUNK, THREADS = 37, 256, 64


@functools.lru_cache(maxsize=None)
def histogram(n: int):
    @T.prim_func
    def kernel(X: T.Tensor((n,), "int32"), Hist: T.Tensor((NBINS,), "int32")):
        with T.Kernel(T.ceildiv(n, CHUNK), threads=THREADS) as bx:
            local_bins = T.alloc_shared((NBINS,), "int32")
            T.clear(local_bins)
            for k in T.serial(CHUNK // THREADS):
                i = bx * CHUNK + k * THREADS + T.get_thread_binding()
                if i < n:
                    T.atomic_add(local_bins[X[i]], 1)
            T.atomic_add(Hist, local_bins)  # tile form: one device atomic per bin and threadgroup

    return tilelang.compile(kernel, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("n", [1000, 257])
def test_int32_histogram_matches_torch_bincount(n):
    gen = torch.Generator().manual_seed(n)
    x = torch.randint(0, NBINS, (n,), generator=gen, dtype=torch.int32)
    x[: n // 3] = 5  # a hot bin
    hist = torch.zeros(NBINS, dtype=torch.int32)
    histogram(n)(x, hist)
    assert torch.equal(hist, torch.bincount(x.long(), minlength=NBINS).to(torch.int32))
