"""A T.gemm whose A and B differ in dtype is refused with the cast that fixes that kernel
(gemm/problem.py): which operand, to which dtype, and how for the scope it is in; the staging
bypass leaves such a GEMM alone, so the message names the kernel's own buffers. The advised fix
(a float16 shared buffer filled by a casting T.copy) runs and matches torch."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import functools

import pytest
import tilelang.language as T
import torch
from gemm_support import compile_emulated, lower_source

from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import GemmLoweringError


def _gemm(M, N, K, a_dtype, b_dtype, scope, *, staged_b_dtype=None, bM=32, bN=32, bK=32):
    """C = A B over bM x bN tiles; `scope` says where the T.gemm reads A and B from. B is staged as
    `staged_b_dtype` (default: B's own dtype)."""
    b_stage = staged_b_dtype or b_dtype

    @T.prim_func
    def main(A: T.Tensor((M, K), a_dtype), B: T.Tensor((K, N), b_dtype), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=128) as (bx, by):
            C_l = T.alloc_fragment((bM, bN), "float32")
            T.clear(C_l)
            if scope == "global":
                T.gemm(A[by * bM : (by + 1) * bM, 0:K], B[0:K, bx * bN : (bx + 1) * bN], C_l)
            else:
                A_x = T.alloc_fragment((bM, bK), a_dtype) if scope == "fragment" else T.alloc_shared((bM, bK), a_dtype)
                B_s = T.alloc_shared((bK, bN), b_stage)
                for k in T.serial(T.ceildiv(K, bK)):
                    T.copy(A[by * bM, k * bK], A_x)
                    T.copy(B[k * bK, bx * bN], B_s)
                    T.gemm(A_x, B_s, C_l)
            T.copy(C_l, C[by * bM, bx * bN])

    return main


def _refusal(func, target) -> str:
    with pytest.raises(GemmLoweringError) as info:
        lower_source(func, target)
    text = str(info.value)
    assert "\n" not in text, text
    return text


@pytest.mark.parametrize("which", ["plain", "metal4"])
def test_shared_float32_b_is_told_to_stage_as_float16(plain_metal, metal4, which):
    text = _refusal(_gemm(64, 64, 64, "float16", "float32", "shared"), plain_metal if which == "plain" else metal4)
    assert "got A=float16, B=float32" in text, text
    # the kernel's own buffer (metal4 would otherwise have bypassed the staging and named global B)
    assert 'cast B to float16: declare B_s with T.alloc_shared(..., "float16") (the T.copy that fills it casts)' in text, text
    assert "or cast A to float32" in text, text


def test_global_operands_are_told_to_convert_the_tensor(metal4):
    text = _refusal(_gemm(64, 64, 64, "float32", "bfloat16", "global"), metal4)
    assert 'cast A to bfloat16: declare A as T.Tensor(..., "bfloat16")' in text, text
    assert "T.alloc_shared(..., \"bfloat16\")" in text and "or cast B to float32" in text, text


def test_register_a_is_told_to_copy_into_a_cast_fragment(plain_metal):
    text = _refusal(_gemm(64, 64, 64, "float32", "float16", "fragment"), plain_metal)
    assert 'cast A to float16: T.copy A_x into a T.alloc_fragment(..., "float16")' in text, text


def test_float16_with_bfloat16_goes_to_float32(plain_metal):
    text = _refusal(_gemm(64, 64, 64, "float16", "bfloat16", "shared"), plain_metal)
    assert 'cast A to float32: declare A_x with T.alloc_shared(..., "float32")' in text, text
    assert 'cast B to float32: declare B_s with T.alloc_shared(..., "float32")' in text, text


@functools.lru_cache(maxsize=None)
def _advised_fix(M, N, K):
    from tilelang_metal.kernels import plain_metal_target

    return compile_emulated(_gemm(M, N, K, "float16", "float32", "shared", staged_b_dtype="float16"), plain_metal_target())


def test_the_advised_cast_runs_and_matches_torch():
    """B float32 in memory, staged as float16 by the T.copy: ragged tiles (40x56x72 over 32x32x32),
    and a B value beyond float16's range, which the cast turns into inf as torch's .half() does."""
    M, N, K = 40, 56, 72
    g = torch.Generator().manual_seed(3)
    a = torch.randn(M, K, generator=g).half()
    b = torch.randn(K, N, generator=g)
    b[5, 7] = 70000.0  # -> inf in float16: column 7 becomes +-inf
    kernel = _advised_fix(M, N, K)
    c = kernel(a, b)
    ref = a.float() @ b.half().float()
    assert torch.isinf(ref[:, 7]).all()
    torch.testing.assert_close(c, ref, rtol=1e-3, atol=1e-2, equal_nan=True)
    racecheck(kernel, a, b)
