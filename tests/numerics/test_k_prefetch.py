"""Register prefetch of the next K step (issue 10, item 3; TILELANG_METAL_K_PREFETCH=1): same results
as torch and the same work as without it, the next step's loads placed before the current MMAs."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters


def _compile(target, M, N, K):
    import tilelang

    return tilelang.compile(E.gemm_direct_global(M, N, K), out_idx=[-1], target=target, execution_backend="emulator")


@pytest.mark.parametrize(
    "which, M, N, K",
    [
        ("metal4", 64, 128, 96),  # 6 steps (even)
        pytest.param("metal4", 200, 200, 80, marks=pytest.mark.slow),  # 5 steps (odd), interior and edge threadgroups
        pytest.param("metal", 67, 129, 44, marks=pytest.mark.slow),  # 5 whole 8-steps + a ragged last step
    ],
)
def test_prefetch_matches_torch_and_does_the_same_work(which, M, N, K, monkeypatch):
    target = E.metal4_target() if which == "metal4" else E.plain_metal_target()
    torch.manual_seed(M + K)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    monkeypatch.setenv("TILELANG_METAL_K_PREFETCH", "1")
    on = _compile(target, M, N, K)
    torch.testing.assert_close(on(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)
    source = on.get_kernel_source()
    assert "_next[" in source and "for (int k_pair" in source
    loop = source.split("for (int k_pair", 1)[1]
    mma = "__ct_op.run(" if which == "metal4" else "simdgroup_multiply_accumulate("
    assert loop.index("_next") < loop.index(mma)  # step k+1's loads come before step k's MMAs
    with_prefetch = counters(on, a, b).total
    monkeypatch.setenv("TILELANG_METAL_K_PREFETCH", "0")
    off = _compile(target, M, N, K)
    assert "_next[" not in off.get_kernel_source()
    assert counters(off, a, b).total == with_prefetch
