"""MLX's affine quantized matrix-vector kernels (`affine_qmv_fast`, `affine_qmv`, `affine_qvm`),
unmodified, in the emulator, against torch.

Launch values come from mlx_quantized.py, which follows MLX's quantized.cpp; each case first checks
that MLX's dispatch (mlx_quantized.route) sends its shape to the kernel under test. The weights are
quantized here by our own affine quantizer (per group of `group_size` values: scale = (max - min) /
(2^bits - 1), bias = min, q = round((w - bias) / scale)), packed as MLX packs them; the reference is
x @ W^T in float32 from the dequantized weights (q * scale + bias, with scale and bias rounded to the
activation dtype as the kernel reads them). The kernels accumulate in float32 and round once, so the
tolerance is one rounding of the output dtype plus float32 reassociation.
"""

from __future__ import annotations

import pytest
import torch

import mlx_quantized as mq
from mlx_gemm import Device
from tilelang_metal.emulator.foreign import memory_counts_unavailable

TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float16: (2e-3, 2e-2), torch.bfloat16: (1.6e-2, 1e-1)}
M3, M2 = Device("applegpu_g15g"), Device("applegpu_g14g")  # M2: several vectors stay on qmv (no qmv_wide)


def pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack unsigned `bits`-bit values (last axis) into uint32 words, value j of each word in bits
    [bits * j, bits * (j + 1)): the order quantized.h's affine_quantize writes and its qdot /
    affine_dequantize read (4-bit: value 4i + 1 is `ws[i] & 0x00f0` of the uint16 view, scaled by 1/16)."""
    per_word = 32 // bits
    q = q.to(torch.int64).reshape(*q.shape[:-1], q.shape[-1] // per_word, per_word)
    words = (q << (torch.arange(per_word, dtype=torch.int64) * bits)).sum(-1)
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).view(torch.uint32).contiguous()


def quantize(weights: torch.Tensor, group_size: int, bits: int, dtype: torch.dtype):
    """(w, scales, biases, dequantized float32 weights) of `weights` quantized along its last axis."""
    rows, cols = weights.shape
    groups = weights.float().reshape(rows, cols // group_size, group_size)
    lo, hi = groups.amin(-1), groups.amax(-1)
    levels = 2**bits - 1
    scale = ((hi - lo) / levels).clamp_min(1e-7)
    q = torch.round((groups - lo[..., None]) / scale[..., None]).clamp(0, levels)
    scales, biases = scale.to(dtype), lo.to(dtype)  # what the kernel reads
    dequantized = (q * scales.float()[..., None] + biases.float()[..., None]).reshape(rows, cols)
    return pack(q.reshape(rows, cols), bits), scales, biases, dequantized


def _dequantized(w: torch.Tensor, scales: torch.Tensor, biases: torch.Tensor, group_size: int, bits: int) -> torch.Tensor:
    """Unpack `w` independently of `pack` (shifts of each word) and dequantize, in float32."""
    per_word = 32 // bits
    words = w.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    q = (words[..., None] >> (torch.arange(per_word) * bits)) & (2**bits - 1)
    q = q.reshape(w.shape[0], -1, group_size).float()
    return (q * scales.float()[..., None] + biases.float()[..., None]).reshape(w.shape[0], -1)


def _operands(M: int, N: int, K: int, group_size: int, bits: int, dtype: torch.dtype, transpose: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    weights = torch.randn((N, K) if transpose else (K, N), generator=g)
    x = torch.randn(M, K, generator=g).to(dtype)
    w, scales, biases, dequantized = quantize(weights, group_size, bits, dtype)
    reference = x.float() @ (dequantized.T if transpose else dequantized)
    return x, w, scales, biases, reference


def _assert_matches(out: torch.Tensor, ref: torch.Tensor) -> None:
    rtol, atol = TOLERANCE[out.dtype]
    torch.testing.assert_close(out.float(), ref.to(out.dtype).float(), rtol=rtol, atol=atol, equal_nan=True)


def test_pack_order_and_route_follow_mlx():
    # 4-bit: value j in nibble j; 8-bit: value j in byte j (little-endian words)
    assert pack(torch.arange(8), 4).item() == 0x76543210
    assert pack(torch.tensor([1, 2, 3, 250]), 8).item() == 0xFA030201
    # quantized.cpp: qmv_quad for K 64 / 128, qmv_wide for 2+ vectors from M3 on, qmv_fast for whole
    # 8-row tiles and K a multiple of 512 (4-bit) / 256 (8-bit), qmm from get_qmv_batch_limit vectors
    # (13 on an M3 at these sizes), qvm below K = 1024 without transpose, then qvm_split_k
    assert mq.route(1, 32, 128, 4, True) == "qmv_quad"
    assert mq.route(2, 32, 512, 4, True, M3) == "qmv_wide" and mq.route(2, 32, 512, 4, True, M2) == "qmv_fast"
    assert (mq.route(1, 16, 512, 4, True), mq.route(1, 16, 256, 8, True)) == ("qmv_fast", "qmv_fast")
    assert (mq.route(1, 16, 256, 4, True), mq.route(1, 13, 512, 4, True)) == ("qmv", "qmv")
    assert (mq.route(12, 64, 512, 4, True), mq.route(13, 64, 512, 4, True)) == ("qmv_wide", "qmm_splitk")
    assert (mq.route(1, 64, 1023, 4, False), mq.route(1, 64, 1024, 4, False), mq.route(4, 64, 64, 4, False)) == (
        "qvm", "qvm_split_k", "qmm")


# (dtype, group_size, bits, M, N, K, device). qmv_fast: 2 simdgroups x 4 rows per threadgroup, each
# lane 2 packs (16 4-bit / 8 8-bit values) per step of 512 / 256; K at that minimum and at 2 steps;
# 3 vectors on an M2 (rows of x in grid x).
FAST_CASES = [
    (torch.float16, 64, 4, 1, 16, 512, M3),
    (torch.bfloat16, 32, 4, 1, 24, 1024, M3),
    (torch.float32, 64, 4, 1, 8, 512, M3),
    (torch.float16, 32, 8, 1, 16, 256, M3),
    (torch.float16, 64, 4, 3, 16, 512, M2),
]


def _id(c) -> str:
    return f"{str(c[0])[6:]}-gs{c[1]}-b{c[2]}-{c[3]}x{c[4]}x{c[5]}"


@pytest.mark.parametrize("dtype,group_size,bits,M,N,K,device", FAST_CASES, ids=[_id(c) for c in FAST_CASES])
def test_qmv_fast_matches_torch(mlx_include, dtype, group_size, bits, M, N, K, device):
    x, w, scales, biases, ref = _operands(M, N, K, group_size, bits, dtype, True)
    family, launch = mq.qmv(x, w, scales, biases, group_size=group_size, bits=bits, include=mlx_include, device=device)
    assert family == "qmv_fast"
    _assert_matches(launch.output, ref)


# affine_qmv, where quantized.cpp sends every shape qmv_fast does not take: 37 rows (odd; the last
# simdgroup's 4 rows moved back to 33-36, so rows 33-35 are written by both simdgroups of the last
# threadgroup), 5 rows (fewer than a tile: per-row guards), K not a multiple of the 256-value block
# (load_vector_safe / qdot_safe on the tail lanes), K of 3 groups (no whole block), 8-bit, 13 rows.
GENERIC_CASES = [
    (torch.float16, 64, 4, 1, 37, 320, M3),
    (torch.bfloat16, 32, 4, 1, 5, 96, M3),
    (torch.float32, 64, 4, 1, 16, 576, M3),
    (torch.float16, 64, 8, 1, 13, 192, M3),
]


@pytest.mark.parametrize("dtype,group_size,bits,M,N,K,device", GENERIC_CASES, ids=[_id(c) for c in GENERIC_CASES])
def test_qmv_matches_torch(mlx_include, dtype, group_size, bits, M, N, K, device):
    x, w, scales, biases, ref = _operands(M, N, K, group_size, bits, dtype, True, seed=1)
    family, launch = mq.qmv(x, w, scales, biases, group_size=group_size, bits=bits, include=mlx_include, device=device)
    assert family == "qmv"
    _assert_matches(launch.output, ref)


@pytest.mark.parametrize("N", [13, 3])
def test_qmv_fast_partial_rows_of_the_0_32_4_header(mlx_include, N):
    # The 0.32.4 kernel's partial_rows variant: rows past N reuse row N - 1's weights and are not
    # stored (13: the second threadgroup's second simdgroup keeps 1 row; 3: one simdgroup returns).
    x, w, scales, biases, ref = _operands(1, N, 512, 64, 4, torch.float16, True, seed=2)
    family, launch = mq.qmv(x, w, scales, biases, group_size=64, bits=4, include=mlx_include, partial_rows=True)
    assert family == "qmv_fast"
    _assert_matches(launch.output, ref)


# affine_qvm (transpose=False, K < 1024): each simdgroup owns 32 output columns and walks K 32 rows at
# a time, lane l on row l; K = 77 leaves 13 rows for the last step (the other lanes add zeros),
# K = 20 has only that partial step; N = 160 in threadgroups of 64 columns: the last one's second
# simdgroup returns.
QVM_CASES = [
    (torch.float16, 64, 4, 1, 192, 77, M3),
    (torch.bfloat16, 32, 4, 1, 160, 40, M3),
    (torch.float32, 32, 8, 2, 96, 20, M3),
]


@pytest.mark.parametrize("dtype,group_size,bits,M,N,K,device", QVM_CASES, ids=[_id(c) for c in QVM_CASES])
def test_qvm_matches_torch(mlx_include, dtype, group_size, bits, M, N, K, device):
    x, w, scales, biases, ref = _operands(M, N, K, group_size, bits, dtype, False, seed=3)
    family, launch = mq.qvm(x, w, scales, biases, group_size=group_size, bits=bits, include=mlx_include, device=device)
    assert family == "qvm"
    _assert_matches(launch.output, ref)


def test_nan_in_x_propagates_to_its_row_only(mlx_include):
    # qmv_fast folds sum(x) * bias into every output of a vector: a NaN in x makes its whole row of y
    # NaN, and the other vector of the launch (grid x = 1) stays finite; the same through qvm.
    x, w, scales, biases, _ = _operands(2, 16, 512, 64, 4, torch.float16, True, seed=4)
    x[0, 300] = float("nan")
    _, launch = mq.qmv(x, w, scales, biases, group_size=64, bits=4, include=mlx_include, device=M2)
    y = launch.output
    assert torch.isnan(y[0]).all() and torch.isfinite(y[1]).all()
    _assert_matches(y, x.float() @ _dequantized(w, scales, biases, 64, 4).T)
    x, w, scales, biases, _ = _operands(1, 192, 77, 64, 4, torch.float16, False, seed=4)
    x[0, 70] = float("nan")  # in the partial last step of 32 rows
    _, launch = mq.qvm(x, w, scales, biases, group_size=64, bits=4, include=mlx_include)
    assert torch.isnan(launch.output).all()


def test_qmv_passes_the_race_check_and_counts_its_reductions(mlx_include):
    # 37 rows: 5 threadgroups, the last one's two simdgroups both write rows 33-35 (the same values)
    N, K = 37, 320
    x, w, scales, biases, ref = _operands(1, N, K, 64, 4, torch.float16, True, seed=5)
    _, launch = mq.qmv(x, w, scales, biases, group_size=64, bits=4, include=mlx_include)
    launch.output.fill_(float("nan"))
    launch.racecheck(seeds=(0, 1))  # two schedules of threads and threadgroups, bitwise-equal outputs
    _assert_matches(launch.output, ref)
    counts = launch.counters()
    # every simdgroup of the 5 x 2 reduces its 4 rows with one simd_sum each; no barrier
    assert counts["simd_collectives"] == 5 * 2 * 4 and counts["threadgroup_barriers"] == 0
    if memory_counts_unavailable() is None:  # traced memory (clang)
        # lane 0 of each simdgroup stores its 4 rows: 40 half stores, 3 rows twice
        assert (counts["device_store_instructions"], counts["device_store_bytes"]) == (40, 80)
        # Loads are counted per read in the source (the traced build is unoptimized): per simdgroup,
        # one 256-value block on 32 lanes (8 values a lane), then the 64-value tail on lanes 0-7.
        # load_vector reads each x twice (sum and copy); qdot reads each uint16 of weights once per
        # mask (4 times, 2 uint16 a lane and row); a scale and a bias per lane and row. All 2 bytes.
        block = 32 * (8 * 2 + 4 * 2 * 4 + 4 * 2)
        tail = 8 * (8 * 2 + 4 * 2 * 4 + 4 * 2)
        assert counts["device_load_instructions"] == counts["narrow_device_loads"] == 10 * (block + tail)
        assert counts["device_load_bytes"] == 2 * 10 * (block + tail)


def test_qmm_t_matches_torch(mlx_include):
    # affine_qmm_t, where quantized.cpp sends 13+ vectors on an M3 (K, N <= 4096) when its split-K count
    # is 1: 80 x 96 is 3 x 3 tiles of 32, so 512 // 9 = 56 partitions, capped at K / 64 = 1 for K = 64.
    # M = 40 leaves a partial row tile (load_safe of x, store_result_safe); N = 96 keeps aligned_N.
    M, N, K = 40, 96, 64
    assert mq.route(M, N, K, 4, True, M3) == "qmm_splitk" and mq.qmm_split_k(M, N, K, 64) == 1
    assert mq.qmm_split_k(512, 4096, 4096, 64) == 1  # 2048 tiles: compare_mlx's qmm problem runs the plain qmm
    x, w, scales, biases, ref = _operands(M, N, K, 64, 4, torch.float16, True, seed=6)
    family, launch = mq.qmm(x, w, scales, biases, group_size=64, bits=4, include=mlx_include, device=M3)
    assert family == "qmm_t"
    _assert_matches(launch.output, ref)
