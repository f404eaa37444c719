"""MLX's NAX kernels (MetalPerformancePrimitives matmul2d on cooperative tensors), unmodified, in the
emulator, against torch: the fused GEMM `steel_gemm_fused_nax` (NN, NT, TN; fp16, bf16; aligned and
unaligned tiles) and the fused attention `attention_nax` (head dim 64, causal and not, ragged
lengths, grouped K/V heads). Launch parameters are MLX's host code's (tests/mlx_reference/mlx_nax.py
says where each value comes from). Shapes are chosen so that MLX's own dispatch (matmul.cpp) picks
the fused NAX kernel: N > 64 (thin kernel below), K <= 2 max(M, N) (split-K above)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from tilelang_metal.emulator.foreign import memory_counts_unavailable

sys.path.insert(0, str(Path(__file__).parent))
import mlx_nax  # noqa: E402


def _operands(M: int, N: int, K: int, ta: bool, tb: bool, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if ta else (M, K), generator=g).to(dtype)
    b = torch.randn((N, K) if tb else (K, N), generator=g).to(dtype)
    return a, b


def _reference(a, b, ta, tb):
    return (a.float().T if ta else a.float()) @ (b.float().T if tb else b.float())


def _close(d, ref, dtype):
    # fp32 accumulation in both; the output is rounded once to fp16 / bf16 (relative 2^-11 / 2^-8)
    tol = {torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1)}[dtype]
    torch.testing.assert_close(d.float(), ref, rtol=tol[0], atol=tol[1])


LAYOUTS = [(False, False), (False, True), (True, False)]
IDS = ["nn", "nt", "tn"]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=IDS)
def test_gemm_fused_nax_unaligned(mlx_include, ta, tb, dtype):
    # M, N, K not multiples of bm = bn = 128, bk = 512: load_safe / store_safe, K only in the tail
    M, N, K = 100, 130, 77
    a, b = _operands(M, N, K, ta, tb, dtype)
    d = mlx_nax.gemm_fused_nax(mlx_include, a, b, transpose_a=ta, transpose_b=tb)
    _close(d, _reference(a, b, ta, tb), dtype)


@pytest.mark.parametrize("ta,tb,dtype", [(False, False, torch.float16), (False, True, torch.float16),
                                         (True, False, torch.float16), (False, False, torch.bfloat16)],
                         ids=["nn-fp16", "nt-fp16", "tn-fp16", "nn-bf16"])
def test_gemm_fused_nax_aligned(mlx_include, ta, tb, dtype):
    M, N, K = 256, 256, 512  # K = 2 max(M, N): still the fused kernel, one full bk block
    a, b = _operands(M, N, K, ta, tb, dtype, seed=1)
    d = mlx_nax.gemm_fused_nax(mlx_include, a, b, transpose_a=ta, transpose_b=tb)
    _close(d, _reference(a, b, ta, tb), dtype)


@pytest.mark.parametrize("ta,tb", LAYOUTS, ids=IDS)
def test_gemm_fused_nax_full_k_blocks_and_a_tail(mlx_include, ta, tb):
    # K = 550: one aligned bk = 512 block plus a 38-wide tail; M = 300 leaves a partial row of tiles
    M, N, K = 300, 96, 550
    a, b = _operands(M, N, K, ta, tb, torch.float16, seed=2)
    d = mlx_nax.gemm_fused_nax(mlx_include, a, b, transpose_a=ta, transpose_b=tb)
    _close(d, _reference(a, b, ta, tb), torch.float16)


def test_gemm_fused_nax_max_device_tiles_and_swizzle(mlx_include):
    # architectures ending in 's' / 'c' / 'd': bm = 64, wm = 2, bk = 256, swizzle_log = 2
    M, N, K = 300, 96, 550
    a, b = _operands(M, N, K, False, False, torch.float16, seed=3)
    launch = mlx_nax.gemm_fused_nax_launch(mlx_include, a, b, device="s")
    (step,) = launch.dispatches
    assert step.block == (32, 4, 2) and step.grid == (4, 2, 1)  # tn = 1, tm = 5, tile 4
    _close(launch.run(), _reference(a, b, False, False), torch.float16)


def test_gemm_fused_nax_nan_and_inf_stay_in_their_rows_and_columns(mlx_include):
    M, N, K = 100, 130, 77
    a, b = _operands(M, N, K, False, True, torch.float16, seed=4)
    a[3, 10] = float("nan")
    a[99, 76] = float("inf")  # the last row and column: beside the zero padding of load_safe
    b[129, 0] = float("-inf")  # transposed B: row 129 is output column 129
    d = mlx_nax.gemm_fused_nax(mlx_include, a, b, transpose_b=True)
    ref = _reference(a, b, False, True)
    torch.testing.assert_close(d.float(), ref, rtol=2e-3, atol=2e-2, equal_nan=True)
    assert torch.isnan(d[3]).all() and torch.isinf(d[99]).sum() >= 1
    assert not torch.isnan(d[:3]).any() and not torch.isnan(d[4:99, :129]).any()


def test_gemm_fused_nax_batched_with_a_bias_matches_torch(mlx_include):
    """A batch on the grid's z axis (GEMMParams' batch strides) with AddMM's output source, a bias (N,)
    read with ldc = 0 (alpha = beta = 1), at a ragged M, N and K."""
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(2, 100, 77, generator=g).half(), torch.randn(2, 77, 130, generator=g).half()
    bias = torch.randn(130, generator=g).half()
    launch = mlx_nax.gemm_fused_nax_launch(mlx_include, a, b, c=bias)
    assert launch.dispatches[0].grid[2] == 2
    _close(launch.run(), a.float() @ b.float() + bias.float(), torch.float16)


def test_gemm_fused_nax_counts_matmul2d_runs(mlx_include):
    # per simdgroup with output (32 x 32 of D): TM = 2 rows x TN / 2 = 1 column pair x TK = 2 per
    # SK = 32 slice of K, one matmul2d(16, 32, 16) each; out-of-range simdgroups and threadgroups run none
    M, N, K = 100, 130, 77
    a, b = _operands(M, N, K, False, False, torch.float16)
    counts = mlx_nax.gemm_fused_nax_launch(mlx_include, a, b).counters()
    assert counts["matmul2d_16x32x16"] == math.ceil(M / 32) * math.ceil(N / 32) * 4 * math.ceil(K / 32)
    if memory_counts_unavailable() is None:  # traced memory (clang)
        # each active simdgroup reads the in-range rows of its 32-row A panel and columns of its 32-column
        # B panel over all of K, element by element (NAXFrag load / load_safe: `src[r * str_x + c + j]`,
        # 2-byte loads), and writes each of its in-range outputs once
        row_blocks = [min(32, M - r) for r in range(0, M, 32)]
        col_blocks = [min(32, N - c) for c in range(0, N, 32)]
        elements = K * sum(rows + cols for rows in row_blocks for cols in col_blocks)
        assert counts["device_load_instructions"] == counts["narrow_device_loads"] == elements
        assert counts["device_load_bytes"] == 2 * elements
        assert (counts["device_store_instructions"], counts["device_store_bytes"]) == (M * N, 2 * M * N)
        assert counts["threadgroup_load_bytes"] == counts["threadgroup_store_bytes"] == 0  # no staging


# ---------------------------------------------------------------- attention

def _qkv(B, H, H_kv, qL, kL, dtype=torch.float16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, h, L, 64, generator=g).to(dtype) for h, L in ((H, qL), (H_kv, kL), (H_kv, kL))]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("qL,kL", [(37, 45), (64, 96)], ids=["ragged", "aligned"])
def test_attention_nax_prefill(mlx_include, causal, qL, kL):
    q, k, v = _qkv(1, 2, 1, qL, kL)  # two query heads share one K/V head (gqa_factor 2)
    o = mlx_nax.attention_nax(mlx_include, q, k, v, causal=causal)
    ref = mlx_nax.attention_reference(q, k, v, causal)
    torch.testing.assert_close(o.float(), ref, rtol=2e-3, atol=2e-3)


def test_attention_nax_bf16_causal_ragged(mlx_include):
    q, k, v = _qkv(2, 1, 1, 19, 19, dtype=torch.bfloat16, seed=5)
    o = mlx_nax.attention_nax(mlx_include, q, k, v, causal=True)
    torch.testing.assert_close(o.float(), mlx_nax.attention_reference(q, k, v, True), rtol=1.6e-2, atol=1.6e-2)


def test_attention_nax_counts_and_skips_causal_blocks(mlx_include):
    qL, kL = 64, 96
    q, k, v = _qkv(1, 2, 1, qL, kL)
    counts = mlx_nax.attention_nax_launch(mlx_include, q, k, v, causal=True).counters()
    # per simdgroup and key block: S = Q K^T is TK / 2 = 1 pair x TD = 4, O += P V is TV / 2 = 2 pairs
    # x TK = 2, 8 matmul2d in all; causal: query block 0 (rows 0..63 + qL_off 32) needs key blocks
    # 0..ceil(96 / 32) - 1 = 3, all of them here
    kb_lim = min(math.ceil(kL / 32), math.ceil((qL + (kL - qL)) / 32))
    assert counts["matmul2d_16x32x16"] == 2 * 4 * kb_lim * 8


def test_attention_nax_passes_the_race_check(mlx_include):
    q, k, v = _qkv(1, 2, 1, 37, 45)
    launch = mlx_nax.attention_nax_launch(mlx_include, q, k, v, causal=True)
    o = launch.racecheck(seeds=(0, 1))
    torch.testing.assert_close(o.float(), mlx_nax.attention_reference(q, k, v, True), rtol=2e-3, atol=2e-3)
