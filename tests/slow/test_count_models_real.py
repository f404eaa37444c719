"""benchmark/count_models.py on a real kernel: the GEMM model's full-size counts from proxies equal
the emulator's counts of the full launch (ragged in both dimensions, so every tile class occurs)."""

from __future__ import annotations

import pytest
import tilelang
import torch
from bench_support import load_benchmark

from tilelang_metal import kernels
from tilelang_metal.emulator import counters

models = load_benchmark("count_models")


@pytest.mark.parametrize("M,N", [(200, 300), (40, 300)])
def test_gemm_model_equals_the_full_launch(M, N):
    K = 48

    def count(m: int, n: int) -> dict[str, float]:
        kern = tilelang.compile(kernels.gemm_direct_global(m, n, K), out_idx=[-1], target=kernels.plain_metal_target(),
                                execution_backend="emulator")
        a, b = torch.randn(m, K).half(), torch.randn(K, n).half()
        return {k: float(v) for k, v in counters(kern, a, b).total.items()}

    assert models.gemm_counts(M, N, 64, 128, count) == pytest.approx(count(M, N))
