"""Register staging (TILELANG_METAL_REGISTER_STAGING, on by default) across dtypes, transposed B, 2-4
pipeline stages and ragged shapes, each run under the emulator's race detection against torch."""

from __future__ import annotations

import pytest
import tilelang
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck
from tilelang_metal.transform.shared_staging import keep_shared_staging

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

CASES = [
    ("metal", 37, 45, 61, 32, 2, "float32", False),  # fp32 operands: 16-byte float4 moves
    ("metal", 33, 70, 50, 32, 3, "float16", True),  # B stored N x K
    ("metal4", 70, 100, 90, 64, 2, "bfloat16", True),
    ("metal4", 64, 64, 96, 64, 4, "float16", False),  # 4 stages, aligned
]


@pytest.mark.slow
@pytest.mark.parametrize("which, M, N, K, block, stages, dtype, trans_B", CASES)
def test_staged_pipelines_match_torch_without_races(which, M, N, K, block, stages, dtype, trans_B):
    func = E.gemm_shared(M, N, K, block, block, 16, num_stages=stages, dtype=dtype, out_dtype="float32", trans_B=trans_B)
    target = E.plain_metal_target() if which == "metal" else E.metal4_target()
    kernel = tilelang.compile(keep_shared_staging(func), out_idx=[-1], target=target, execution_backend="emulator")
    assert "staged_" in kernel.get_kernel_source()
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K).to(TORCH[dtype])
    b = torch.randn(*((N, K) if trans_B else (K, N))).to(TORCH[dtype])
    reference = a.float() @ (b.float().T if trans_B else b.float())
    out = racecheck(kernel, a, b, torch.zeros(N))
    tol = 3e-2 if dtype == "bfloat16" else 1e-2
    torch.testing.assert_close(out.float(), reference, rtol=tol, atol=tol)
