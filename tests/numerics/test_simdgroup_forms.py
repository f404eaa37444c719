"""Whole-matrix forms of simdgroup accumulators (transform/simdgroup_forms.py) compute what the
per-lane forms computed: register GEMMs cleared with `make_filled_simdgroup_matrix` and written with
`simdgroup_store` match torch in the emulator, including C views of wider tensors, threadgroup C,
partial tiles (masked per-lane stores) and an epilogue between the GEMM and the store. The counters
show the store does no more work than the `float2` lane stores it replaces."""


import pytest
import tilelang.language as T
import torch

import tilelang

from tests.gemm_support import assert_close, operands
from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters


def register_gemm(M, N, K, bm, bn, bk, dtype="float16", c_cols=None, epilogue=False, via_shared=False, threads=128):
    """C[:, :N] of an (M, c_cols) tensor = A @ B (+ 1 after a relu when `epilogue`)."""
    c_cols = c_cols or N

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, c_cols), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bm, bk), dtype)
            B_s = T.alloc_shared((bk, bn), dtype)
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, C_f)
            if epilogue:
                for i, j in T.Parallel(bm, bn):
                    C_f[i, j] = T.max(C_f[i, j], 0) + 1.0
            if via_shared:
                C_s = T.alloc_shared((bm, bn), "float32")
                T.copy(C_f, C_s)
                T.copy(C_s, C[by * bm, bx * bn])
            else:
                T.copy(C_f, C[by * bm, bx * bn])

    return main


CASES = {
    "aligned_fp16": dict(M=128, N=128, K=64, bm=64, bn=64, bk=32),
    "aligned_bf16": dict(M=64, N=64, K=32, bm=32, bn=64, bk=16, dtype="bfloat16"),
    "aligned_fp32": dict(M=64, N=64, K=32, bm=32, bn=32, bk=16, dtype="float32"),
    "wider_c_view": dict(M=64, N=64, K=32, bm=32, bn=32, bk=16, c_cols=72),
    "odd_c_stride": dict(M=64, N=64, K=32, bm=32, bn=32, bk=16, c_cols=65),
    "partial": dict(M=45, N=61, K=35, bm=32, bn=32, bk=16),
    "epilogue": dict(M=64, N=64, K=32, bm=32, bn=32, bk=16, epilogue=True),
    "threadgroup_c": dict(M=64, N=64, K=32, bm=32, bn=32, bk=16, via_shared=True),
}
WHOLE_MATRIX = {"aligned_fp16", "aligned_bf16", "aligned_fp32", "wider_c_view", "epilogue", "threadgroup_c"}


@pytest.fixture(scope="module")
def kernels():
    cache = {}

    def get(name):
        if name not in cache:
            func = register_gemm(**CASES[name])  # C is passed in: columns outside the view must survive
            cache[name] = tilelang.compile(func, target=E.plain_metal_target(), execution_backend="emulator")
        return cache[name]

    return get


@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_torch(kernels, name):
    case = CASES[name]
    M, N, K, dtype = case["M"], case["N"], case["K"], case.get("dtype", "float16")
    kernel = kernels(name)
    src = kernel.get_kernel_source()
    assert ("simdgroup_store(C_f" in src) == (name in WHOLE_MATRIX), name
    assert "make_filled_simdgroup_matrix<float, 8, 8>" in src
    a, b, ref = operands(M, N, K, dtype)
    if case.get("epilogue"):
        ref = ref.clamp_min(0) + 1.0
    c_cols = case.get("c_cols", N)
    c = torch.full((M, c_cols), -7.0)
    kernel(a, b, c)
    assert_close(c[:, :N].contiguous(), ref, dtype, "float32", K, name)
    assert (c[:, N:] == -7.0).all(), "columns outside the C view were written"


def test_store_does_no_more_work(kernels):
    """Per threadgroup: one 8-byte store per lane per 8x8 matrix (64x64 fp32 tile = 2048 stores of
    16 KiB), none predicated; the same as the float2 per-lane stores."""
    kernel = kernels("aligned_fp16")
    a, b, _ = operands(128, 128, 64, "float16")
    stats = counters(kernel, a, b, torch.zeros(128, 128))
    for tg in stats.threadgroups.values():
        assert tg["device_store_bytes"] == 64 * 64 * 4
        assert tg["device_store_instructions"] == 64 * 64 // 2
        assert tg["predicated_device_stores"] == 0
