"""A kernel that maps the MLX grid itself and also asks for `T.use_swizzle(order="mlx")` keeps its
own grid and order (the plugin only names the logical tiles): it matches torch, launches exactly the
threadgroups it asked for, and each does one tile's work. Ragged tile counts (tiles_m not a multiple
of the panel) rely on the kernel's own bounds check. (A grid only one panel wide, where the
simplifier has already folded `bx // P` to 0, is not recognised: it is swizzled again, still
correct, with padding threadgroups.)"""

import pytest
import torch

from tests.codegen.test_spec_suites import user_mapped_mlx
from tests.gemm_support import assert_close, compile_emulated, operands
from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters


@pytest.mark.parametrize("M,N,K,panel", [(512, 256, 64, 4), (320, 256, 32, 2), (192, 256, 32, 4)])
def test_user_mapped_mlx_matches_torch(M, N, K, panel):
    bm, bn = 64, 128
    kernel = compile_emulated(user_mapped_mlx(M, N, K, bm, bn, panel), E.metal4_target())
    a, b, ref = operands(M, N, K, "float16")
    out = kernel(a, b)
    assert_close(out, ref, "float16", "float16", K, f"{M}x{N}x{K} panel {panel}")
    tiles_m, tiles_n = -(-M // bm), -(-N // bn)
    stats = counters(kernel, a, b)
    assert len(stats.threadgroups) == tiles_n * panel * -(-tiles_m // panel)  # the kernel's own grid
    working = [tg for tg in stats.threadgroups.values() if tg.get("matmul2d_16x32x16", 0)]
    assert len(working) == tiles_m * tiles_n
    assert all(tg["matmul2d_16x32x16"] == (bm // 16) * (bn // 32) * (K // 16) for tg in working)
