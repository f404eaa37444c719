"""kernels.gemv_small_m at the M of 1..8 that tests/numerics/test_gemv_small_m.py leaves out, each
dtype in turn, against torch at odd N and K (one kernel per M with N and K dynamic), the last
ones also under the race checker."""

from __future__ import annotations

import pytest

from tests.numerics.test_gemv_small_m import SHAPES, _check, _inputs, gemv
from tilelang_metal.emulator import racecheck


@pytest.mark.slow
@pytest.mark.parametrize("M, dtype", [(1, "bfloat16"), (4, "float32"), (5, "float16"), (6, "bfloat16"), (7, "float32"),
                                      (8, "bfloat16"), (8, "float32")])
def test_gemv_small_m_row_count_matches_torch(M, dtype):
    kernel = gemv(M, dtype)
    for N, K in SHAPES:
        a, b = _inputs(M, N, K, dtype)
        _check(kernel(a, b), a, b, dtype)
    if M >= 7:
        a, b = _inputs(M, 70, 201, dtype, seed=3)
        _check(racecheck(kernel, a, b, seeds=(0, 1)), a, b, dtype)
