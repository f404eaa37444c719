"""A T.Parallel epilogue that names a value (`x = acc[i, j] + Bias[j]`) lowers without tilelang's
"T.vectorized loop ... is lowered as a serial loop" warning on either target (issue 34: a new user saw
it for a loop they never wrote). The warning comes from tilelang's C++ LegalizeVectorizedLoop on
stderr; the control kernel, a hand-written T.vectorized loop that accumulates, shows it is captured."""

import pytest
import tilelang.language as T

from gemm_support import lower_source
from tilelang_metal import kernels

WARNING = "is lowered as a serial loop"
M = N = 64
K = 32


def bias_epilogue():
    @T.prim_func
    def gemm_bias(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), Bias: T.Tensor((N,), "float16"),
                  C: T.Tensor((M, N), "float16")):
        with T.Kernel(1, threads=128):
            a = T.alloc_shared((M, K), "float16")
            b = T.alloc_shared((K, N), "float16")
            acc = T.alloc_fragment((M, N), "float32")
            T.clear(acc)
            T.copy(A, a)
            T.copy(B, b)
            T.gemm(a, b, acc)
            for i, j in T.Parallel(M, N):
                x = acc[i, j] + Bias[j]
                C[i, j] = x

    return gemm_bias


def accumulating_vector_loop():
    @T.prim_func
    def total(A: T.Tensor((128,), "float32"), Out: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            s = T.alloc_local((1,), "float32")
            s[0] = 0
            for v in T.vectorized(4):
                s[0] += A[tx * 4 + v]
            Out[tx] = s[0]

    return total


@pytest.mark.parametrize("target", [kernels.plain_metal_target, kernels.metal4_target], ids=["metal", "metal4"])
def test_parallel_epilogue_with_a_named_value_lowers_quietly(target, capfd, monkeypatch):
    monkeypatch.delenv("TILELANG_METAL_LOWERING_CACHE", raising=False)  # a cache hit would print nothing
    capfd.readouterr()
    source = lower_source(bias_epilogue(), target())
    assert "Bias" in source
    assert WARNING not in capfd.readouterr().err


def test_the_warning_is_seen_when_tilelang_prints_it(capfd, monkeypatch):
    # tilelang prints the warning while it lowers: a warm lowering cache (the suite's) skips that
    monkeypatch.delenv("TILELANG_METAL_LOWERING_CACHE", raising=False)
    capfd.readouterr()
    lower_source(accumulating_vector_loop(), kernels.plain_metal_target())
    assert WARNING in capfd.readouterr().err
