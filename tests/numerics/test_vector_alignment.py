"""Vector accesses (`half4`, `float4`) only where the first element is provably aligned to the
vector width: a GEMM reading A from column 2 of a (64, 34) tensor and writing C into the first 64
columns of a (64, 65) tensor reads A in `half2` pairs (row stride 34, offset 2: 2-element aligned
only) and writes C element by element (row stride 65), while B (row stride 64, offset 0) keeps its
4-wide loads; a padded 64x33 shared tile gets element accesses."""

import re

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E

TARGETS = {"metal": E.plain_metal_target, "metal4": E.metal4_target}


def offset_gemm(M=64, N=64, K=32, a_col=2, c_pad=1):
    @T.prim_func
    def main(A: T.Tensor((M, K + a_col), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N + c_pad), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            T.gemm(A[0:M, a_col : a_col + K], B, C[0:M, 0:N])

    return main


def padded_shared_gemm(M=64, N=64, K=32, pad=1):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            A_s = T.alloc_shared((M, K + pad), "float16")
            B_s = T.alloc_shared((K, N + pad), "float16")
            C_f = T.alloc_fragment((M, N), "float32")
            T.clear(C_f)
            T.copy(A, A_s[0:M, 0:K])
            T.copy(B, B_s[0:K, 0:N])
            T.gemm(A_s[0:M, 0:K], B_s[0:K, 0:N], C_f)
            T.copy(C_f, C)

    return main


def vector_accesses(source: str, buffer: str) -> list[str]:
    """Vector reads or writes of `buffer`: `*(... T4*)(buffer + ...)`, also through its tile pointers
    (`const device T* __src = (buffer + (...));`)."""
    names = [buffer, *re.findall(rf"device \w+\* (\w+) = \({buffer} \+", source)]
    return [hit for name in names for hit in re.findall(rf"\*\([^()]*\b(?:half|float|bfloat|uint)[234]\*\)\({name} \+", source)]


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
def test_unaligned_views_get_the_widest_aligned_accesses(target_name):
    kernel = tilelang.compile(offset_gemm(), target=TARGETS[target_name](), execution_backend="emulator")
    source = kernel.get_kernel_source()
    assert not [hit for hit in vector_accesses(source, "A") if "2*)" not in hit] and vector_accesses(source, "C") == []
    if target_name == "metal4":  # the aligned operand keeps its vector loads, A gets the widest aligned ones
        assert vector_accesses(source, "B") and vector_accesses(source, "A")
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 34, generator=g).half(), torch.randn(32, 64, generator=g).half()
    c = torch.full((64, 65), 7.0)
    kernel(a, b, c)
    # T.gemm accumulates into C by default (clear_accum=False)
    torch.testing.assert_close(c[:, :64], 7.0 + a[:, 2:].float() @ b.float(), atol=1e-2, rtol=1e-3)
    assert torch.all(c[:, 64] == 7.0)  # the column outside the view is not written


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
def test_padded_shared_tile_gets_element_accesses(target_name):
    kernel = tilelang.compile(padded_shared_gemm(), out_idx=[-1], target=TARGETS[target_name](), execution_backend="emulator")
    source = kernel.get_kernel_source()
    assert vector_accesses(source, "A_s") == [] and vector_accesses(source, "B_s") == []
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(64, 32, generator=g).half(), torch.randn(32, 64, generator=g).half()
    torch.testing.assert_close(kernel(a, b), a.float() @ b.float(), atol=1e-2, rtol=1e-3)
