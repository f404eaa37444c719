"""MLX's steel GEMM, split-K GEMM and GEMV, unmodified, in the emulator, against torch.

Launch values (tile configs, function constants, GEMMParams, grids) come from mlx_gemm.py, which
follows MLX's matmul.cpp and says where each comes from. Each test first checks that MLX's own
dispatch (mlx_gemm.route) sends its shape to the kernel under test. Inputs are drawn in the
operand's dtype and torch computes in float32 from the same values; MLX accumulates in float32 and
rounds once, so the tolerance is one rounding of the output dtype plus float32 reassociation.
"""

from __future__ import annotations

import pytest
import torch

import mlx_gemm as mg
from tilelang_metal.emulator import EmulatorRuntimeError
from tilelang_metal.emulator.foreign import memory_counts_unavailable

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1)}


def _operands(M: int, N: int, K: int, dtype: torch.dtype, transpose_a: bool, transpose_b: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn((K, M) if transpose_a else (M, K), generator=g).to(dtype)
    b = torch.randn((N, K) if transpose_b else (K, N), generator=g).to(dtype)
    return a, b


def _reference(a: torch.Tensor, b: torch.Tensor, transpose_a: bool, transpose_b: bool) -> torch.Tensor:
    return (a.T if transpose_a else a).float() @ (b.T if transpose_b else b).float()


def _assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    rtol, atol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), ref.to(out.dtype).float(), rtol=rtol, atol=atol)


# Small device (an M3, "applegpu_g15g"): NT takes 64x32x32 / 2x2 simdgroups, half and bfloat NN / TN
# 64x64x16 / 1x2, float NN / TN the 64x64x16 / 2x2 default. Aligned shapes are multiples of the tile;
# 100x75x71 has full and partial tiles in both directions (all four store paths of the MN-unaligned
# loop) and a K remainder (71 = 4 * 16 + 7); 37x53x71 is one partial tile.
GEMM_CASES = [
    ("nn", torch.float32, (64, 128, 80)),
    ("nn", torch.float32, (100, 75, 71)),
    ("nn", torch.float32, (64, 53, 80)),  # align_M and align_K, not align_N
    ("nt", torch.float16, (64, 96, 96)),
    ("nt", torch.float16, (37, 53, 71)),
    ("tn", torch.bfloat16, (64, 128, 80)),
    ("tn", torch.bfloat16, (37, 53, 71)),
]


@pytest.mark.parametrize("layout,dtype,shape", GEMM_CASES, ids=[f"{c[0]}-{str(c[1])[6:]}-{'x'.join(map(str, c[2]))}" for c in GEMM_CASES])
def test_steel_gemm_matches_torch(mlx_include, layout, dtype, shape):
    M, N, K = shape
    ta, tb = layout[0] == "t", layout[1] == "t"
    assert mg.route(M, N, K, dtype, ta, tb) == "gemm"
    a, b = _operands(M, N, K, dtype, ta, tb)
    out, _ = mg.steel_gemm(a, b, transpose_a=ta, transpose_b=tb, include=mlx_include)
    _assert_matches(out, _reference(a, b, ta, tb))


def test_steel_gemm_propagates_nan_and_inf(mlx_include):
    M, N, K = 100, 75, 71
    a, b = _operands(M, N, K, torch.float32, False, False, seed=1)
    a[3, 70] = float("nan")  # in the K remainder (read by load_safe): row 3 is NaN
    a[90, 5] = float("inf")  # a partial row tile: row 90 is +-inf where b[5, j] != 0
    b[40, 70] = float("-inf")  # the last, 11-wide column tile: column 70 is -+inf except where row 90 meets it
    out, _ = mg.steel_gemm(a, b, include=mlx_include)
    ref = _reference(a, b, False, False)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4, equal_nan=True)
    assert torch.isnan(out[3]).all() and torch.isinf(out[90, :70]).all() and torch.isinf(out[:3, 70]).all()
    assert torch.isfinite(out[[0, 1, 2, 4, 99]][:, :70]).all()  # nothing leaked into neighbouring rows / tiles


def test_steel_gemm_passes_the_race_check_and_counts_its_matrix_operations(mlx_include):
    M, N, K = 100, 75, 71
    a, b = _operands(M, N, K, torch.float32, False, False, seed=2)
    out, launch = mg.steel_gemm(a, b, include=mlx_include)
    launch.racecheck(seeds=(0, 1))  # two schedules of threads and threadgroups, bitwise-equal outputs
    _assert_matches(launch.output, _reference(a, b, False, False))
    counts = launch.counters()
    # 2 x 2 threadgroups, each ceil(71 / 16) = 5 K steps of 16 = 2 fragments of 8 over a 64 x 64 tile of
    # 8 x 8 x 8 multiply-accumulates (one count per simdgroup operation)
    assert counts["simdgroup_multiply_accumulate_8x8x8"] == 4 * 5 * 2 * (64 // 8) * (64 // 8)
    if memory_counts_unavailable() is None:  # traced memory (clang)
        # every K step stages a 64 x 16 tile of A and a 16 x 64 tile of B in threadgroup memory (float),
        # edge tiles included (zero-filled); each output is written once; nothing is narrow in fp32
        assert counts["threadgroup_store_bytes"] == 4 * 5 * (64 * 16 + 16 * 64) * 4
        assert (counts["device_store_instructions"], counts["device_store_bytes"]) == (M * N, 4 * M * N)
        assert counts["device_load_bytes"] >= 4 * (M * K * 2 + K * N * 2)  # each panel read by 2 tiles
        assert counts["narrow_device_loads"] == 0


# split-K: bm = 16 below M = 40, bn = 32 from N = 40, bk = 16; partitions: next_power_of_2 of
# (K / 16) / (ceil(M / 32) * ceil(N / 32)), clamped to [2, 32]. 32x64x512: 16 partitions, aligned;
# 37x53x333: 8 partitions of 32, the last one also takes the 77 remaining K (4 steps and 13);
# 41x30x200: 8 partitions of 16, the last with 72 more (4 steps and 8).
SPLITK_CASES = [("nn", torch.float32, (32, 64, 512), 16), ("nt", torch.float16, (37, 53, 333), 8),
                ("tn", torch.bfloat16, (41, 30, 200), 8)]


@pytest.mark.parametrize("layout,dtype,shape,partitions", SPLITK_CASES,
                         ids=[f"{c[0]}-{str(c[1])[6:]}-{'x'.join(map(str, c[2]))}" for c in SPLITK_CASES])
def test_steel_gemm_splitk_matches_torch(mlx_include, layout, dtype, shape, partitions):
    M, N, K = shape
    ta, tb = layout[0] == "t", layout[1] == "t"
    assert mg.route(M, N, K, dtype, ta, tb) == "splitk"
    assert mg._split_k_partitions(M, N, K) == partitions
    a, b = _operands(M, N, K, dtype, ta, tb, seed=3)
    out, launch = mg.steel_gemm_splitk(a, b, transpose_a=ta, transpose_b=tb, include=mlx_include)
    _assert_matches(out, _reference(a, b, ta, tb))
    partial = launch.dispatches[0].args[2]  # every partition's float32 partial product was written
    assert partial.shape[0] == partitions and torch.isfinite(partial).all()


# GEMV (gemv_axbpy): `gemv` with K > 64 uses 4 simdgroups of 1 x 32 threads, 4 x 4 elements each;
# with K <= 64, one simdgroup of 8 x 4 threads. `gemv_t` below 512 outputs: 2 simdgroups of 8 x 4.
@pytest.mark.parametrize("dtype,M,K", [(torch.float32, 37, 71), (torch.float16, 64, 50), (torch.bfloat16, 300, 129)])
def test_gemv_matches_torch(mlx_include, dtype, M, K):
    assert mg.route(M, 1, K, dtype, False, False) == "gemv"
    g = torch.Generator().manual_seed(4)
    mat, vec = torch.randn(M, K, generator=g).to(dtype), torch.randn(K, generator=g).to(dtype)
    out, _ = mg.gemv(mat, vec, include=mlx_include)
    _assert_matches(out, mat.float() @ vec.float())


@pytest.mark.parametrize("dtype,K,N", [(torch.float32, 71, 64), (torch.float16, 200, 96)])
def test_gemv_t_matches_torch(mlx_include, dtype, K, N):
    assert mg.route(1, N, K, dtype, False, False) == "gemv"
    g = torch.Generator().manual_seed(5)
    vec, mat = torch.randn(K, generator=g).to(dtype), torch.randn(K, N, generator=g).to(dtype)
    out, _ = mg.gemv_t(vec, mat, include=mlx_include)
    _assert_matches(out, vec.float() @ mat.float())


def test_steel_gemm_batched_with_addmm_output_source_matches_torch(mlx_include):
    """A batch on the grid's z axis (one batch axis: has_batch false, the batch strides in GEMMParams)
    and AddMM's output source: a bias (N,) read with ldc = 0 (alpha = beta = 1: epilogue_op_add), and
    a (batch, M, N) C with alpha, beta (do_axpby). M = 128 fills its row tiles; N = 90 and K = 71 do not."""
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(3, 128, 71, generator=g).half(), torch.randn(3, 71, 90, generator=g).half()
    bias, c = torch.randn(90, generator=g).half(), torch.randn(3, 128, 90, generator=g).half()
    ref = a.float() @ b.float()
    out, launch = mg.steel_gemm(a, b, include=mlx_include)
    assert launch.dispatches[0].grid[2] == 3
    _assert_matches(out, ref)
    out, _ = mg.steel_gemm(a, b, include=mlx_include, c=bias)
    _assert_matches(out, ref + bias.float())
    out, _ = mg.steel_gemm(a, b, include=mlx_include, c=c, alpha=1.5, beta=-0.5)
    _assert_matches(out, 1.5 * ref - 0.5 * c.float())


def test_steel_addmm_reads_c_past_a_ragged_row_tile(mlx_include):
    # BlockMMA::apply_epilogue_safe bounds C's columns only: in the last row tile of M = 70 it reads
    # the rows of C past 70 (an (M, N) C, ldc = N), past the buffer's end in the last batch. Their
    # sums are never stored; on a GPU the read is out of bounds of C. A bias (ldc = 0) stays inside.
    g = torch.Generator().manual_seed(4)
    a, b, c = torch.randn(70, 48, generator=g).half(), torch.randn(48, 90, generator=g).half(), torch.randn(70, 90, generator=g).half()
    with pytest.raises(EmulatorRuntimeError, match=r"out-of-bounds access to device buffer 'C'"):
        mg.steel_gemm(a, b, include=mlx_include, c=c, alpha=1.5, beta=-0.5)
    out, _ = mg.steel_gemm(a, b, include=mlx_include, c=c[0].contiguous())
    _assert_matches(out, a.float() @ b.float() + c[0].float())


def test_gemv_with_lanes_returned_early_is_reported_not_miscomputed(mlx_include):
    # K <= 64: a simdgroup holds 8 rows of 4 lanes; past the last row, whole rows of lanes return
    # ("Exit simdgroup if rows out of bound") and the others go on to simd_shuffle_down. Metal runs
    # the shuffle with the active lanes (the returned lanes' values feed only lanes whose result is
    # dropped); the emulator's collectives need all 32 lanes (docs/emulator.md, MLX assumptions).
    mat, vec = torch.randn(300, 50).half(), torch.randn(50).half()
    with pytest.raises(EmulatorRuntimeError, match=r"divergent simd collective: .* reached simd_shuffle_down; thread \d+ returned"):
        mg.gemv(mat, vec, include=mlx_include)


def test_gemv_t_with_a_ragged_output_hits_a_divergent_barrier(mlx_include):
    # gemv_t's K loop has a threadgroup_barrier inside `if (out_col < out_vec_size)`: with 53 outputs
    # the last threadgroup's threads past column 53 skip it. MSL requires every thread of the group to
    # reach a barrier; MLX relies on the GPU tolerating it (docs/emulator.md, MLX assumptions).
    vec, mat = torch.randn(71), torch.randn(71, 53)
    with pytest.raises(EmulatorRuntimeError, match=r"divergent barrier: \d+ of 64 threads .* reached threadgroup_barrier"):
        mg.gemv_t(vec, mat, include=mlx_include)
