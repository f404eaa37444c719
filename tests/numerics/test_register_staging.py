"""Register staging of a pipelined K loop (issue 10, item 3; TILELANG_METAL_REGISTER_STAGING): same results
as torch, the same device loads and matrix operations as without it, no more barriers, no race."""

from __future__ import annotations

import functools

import pytest
import tilelang
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.transform.shared_staging import keep_shared_staging

WORK = (
    "device_load_instructions", "device_load_bytes", "predicated_device_loads", "threadgroup_store_instructions",
    "threadgroup_store_bytes", "threadgroup_load_bytes", "matmul2d_16x32x16", "simdgroup_multiply_accumulate_8x8x8",
)


@functools.lru_cache(maxsize=None)
def _kernel(which, M, N, K, block, stages, accum, staging):
    func = E.gemm_shared(M, N, K, block, block, 16, num_stages=stages, out_dtype="float16", accum_dtype=accum)
    target = E.metal4_target() if which == "metal4" else E.plain_metal_target()
    with pytest.MonkeyPatch.context() as patch:  # the setting is read at lowering; restored afterwards
        patch.setenv("TILELANG_METAL_REGISTER_STAGING", staging)
        kernel = tilelang.compile(keep_shared_staging(func), out_idx=[-1], target=target, execution_backend="emulator")
    assert ("staged_" in kernel.get_kernel_source()) == (staging == "1")
    return kernel


CASES = [
    pytest.param("metal", 64, 64, 64, 32, 2, "float32", marks=pytest.mark.slow),  # aligned, 4 K steps
    ("metal", 50, 40, 71, 32, 3, "float32"),  # ragged M, N, K (5 steps, the last partial)
    ("metal", 40, 24, 53, 32, 2, "float16"),  # fp16 accumulator, ragged
    pytest.param("metal4", 100, 70, 77, 64, 3, "float32", marks=pytest.mark.slow),  # cooperative tensors, ragged, interior/edge split
    ("metal4", 128, 64, 48, 64, 2, "float32"),  # 16-byte moves through the registers
]


@pytest.mark.parametrize("which, M, N, K, block, stages, accum", CASES)
def test_matches_torch_with_the_same_work(which, M, N, K, block, stages, accum):
    torch.manual_seed(M * K + stages)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    bias = torch.zeros(N, dtype=torch.float16 if accum == "float16" else torch.float32)
    on = _kernel(which, M, N, K, block, stages, accum, "1")
    tol = 5e-2 if accum == "float16" else 2e-2
    torch.testing.assert_close(on(a, b, bias).float(), a.float() @ b.float(), rtol=tol, atol=tol)
    off = _kernel(which, M, N, K, block, stages, accum, "0")
    staged, plain = counters(on, a, b, bias).total, counters(off, a, b, bias).total
    assert {k: staged[k] for k in WORK} == {k: plain[k] for k in WORK}
    assert plain["matmul2d_16x32x16"] + plain["simdgroup_multiply_accumulate_8x8x8"] > 0
    assert staged["threadgroup_barriers"] <= plain["threadgroup_barriers"]


def test_no_race_in_a_ragged_pipelined_kernel():
    M, N, K = 50, 40, 71
    torch.manual_seed(3)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    bias = torch.zeros(N)
    out = racecheck(_kernel("metal", M, N, K, 32, 3, "float32", "1"), a, b, bias)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)


def test_copy_read_in_its_own_step_is_not_staged():
    """`stage=[0, 1, 1]` puts B's copy in the T.gemm's stage: B_s has one version, written and read in
    the same K step, so its stores cannot move after the MMAs; the loop is left as written."""
    import tilelang.language as T

    M, N, K, bm, bk = 64, 64, 64, 32, 16

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // bm, M // bm, threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bm), "float16")
            acc = T.alloc_fragment((bm, bm), "float32")
            T.clear(acc)
            for ko in T.Pipelined(K // bk, num_stages=2, order=[0, 1, 2], stage=[0, 1, 1]):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bm], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * bm, bx * bm])

    kernel = tilelang.compile(keep_shared_staging(main), out_idx=[2], target=E.plain_metal_target(), execution_backend="emulator")
    assert "staged_" not in kernel.get_kernel_source()
    torch.manual_seed(5)
    a, b = torch.randn(M, K, dtype=torch.float16), torch.randn(K, N, dtype=torch.float16)
    torch.testing.assert_close(kernel(a, b), a.float() @ b.float(), rtol=1e-2, atol=1e-2)
