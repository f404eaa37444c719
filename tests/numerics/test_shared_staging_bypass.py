"""Shared-staging bypass (issue 10, item 5): TileLang's standard GEMM (128x128x32 tiles, 3 pipeline
stages: 48 KiB of staging) runs on Metal 4 with no threadgroup memory, and fits plain Metal, with
results equal to torch's."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters


def _run(target, M, N, K, bk=32, stages=3):
    import tilelang

    kern = tilelang.compile(E.gemm_shared(M, N, K, 128, 128, bk, num_stages=stages, out_dtype="float16"), out_idx=[-1], target=target, execution_backend="emulator")
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    bias = torch.zeros(N)
    out = kern(a, b, bias)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)
    return counters(kern, a, b, bias).total


@pytest.mark.parametrize("M, N, K", [(256, 256, 96), (200, 136, 100)])
def test_metal4_standard_gemm_without_staging(M, N, K):
    t = _run(E.metal4_target(), M, N, K)
    assert t["threadgroup_barriers"] == t["threadgroup_load_bytes"] == t["threadgroup_store_bytes"] == 0
    assert t["matmul2d_16x32x16"] > 0


def test_plain_metal_standard_gemm_with_two_stages():
    t = _run(E.plain_metal_target(), 256, 256, 96)
    assert t["threadgroup_store_bytes"] > 0 and t["threadgroup_barriers"] > 0  # staging kept, 2 stages fit 32 KiB
    assert t["simdgroup_multiply_accumulate_8x8x8"] == 256 * 256 * 96 // 512


def test_plain_metal_simdgroup_loads_from_device_when_staging_cannot_fit():
    t = _run(E.plain_metal_target(), 136, 256, 200, bk=128, stages=2)  # one stage is 64 KiB
    assert t["threadgroup_barriers"] == t["threadgroup_store_bytes"] == 0
    assert t["simdgroup_multiply_accumulate_8x8x8"] > 0


@pytest.mark.slow
def test_metal4_bypass_with_transposed_staging_and_ragged_edges():
    import tilelang

    from tilelang_metal.ir_attrs import decisions_of

    M, N, K = 136, 200, 72
    func = E.gemm_shared(M, N, K, 64, 64, 32, num_stages=2, trans_A=True, trans_B=True)
    kern = tilelang.compile(func, out_idx=[-1], target=E.metal4_target(), execution_backend="emulator")
    assert any(d.startswith("shared staging bypass") for d in decisions_of(kern.artifact.host_mod.functions.values()))
    torch.manual_seed(1)
    a = torch.randn(K, M, dtype=torch.float16)  # stored K x M
    b = torch.randn(N, K, dtype=torch.float16)  # stored N x K
    torch.testing.assert_close(kern(a, b, torch.zeros(N)), a.float().T @ b.float().T, rtol=1e-3, atol=1e-3)
