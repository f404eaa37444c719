"""Large GEMM shapes in the emulator (minutes on a small CPU): run by `scripts/test.sh`, skipped by `--quick`."""

import pytest
from gemm_support import assert_close, compile_emulated, operands

from tilelang_metal import kernels as E


@pytest.mark.slow
def test_thousand_cubed_with_128_tiles(metal4):
    M = N = K = 1000
    func = E.gemm_direct_global(M, N, K, block_M=128, block_N=128, threads=256)
    a, b, ref = operands(M, N, K, "float16")
    out = compile_emulated(func, metal4)(a, b)
    assert_close(out, ref, "float16", "float16", K, "direct 1000x1000x1000 128x128 tiles, 256 threads")
