"""kernels.quantized_matmul in the emulator against torch: x @ kernels.dequantize(w_q, ...).T in
float64. Every bits (4, 8; 3, 5, 6 with levels across words), group size (32, 64, 128) and dtype appear, in six dynamic-M kernels
called with M = 1, 3 and 7 (the vector kernel) (one row chunk, and two of 4 with a ragged one); N = 13 (a full and a
ragged threadgroup of 8 columns) and K = 640 (several groups, not a multiple of a step: 512 levels
at 4 bits, 256 at 8, so the last step has idle lanes); NaN and inf in x; a static M; the tiled kernel (T.gemm on dequantized tiles of w, N = 72; 4, 8 and 6 bits);
transpose=False (w (K, N), K = 45); no threadgroup bank replays in the tiled kernels; the metal4 target; the race checker; the mlx backend on weights straight from mx.quantize; one-line errors.
Kernels compile once (lru_cache)."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.emulator import counters, racecheck

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
N, K = 13, 640
TILED_N = 72  # a full tile of 64 columns and a ragged one
# (bits, group_size, dtype): each bits, group size and dtype at least once (the tiled kernels add 4 x 128 x fp16, 8 x 32 x bf16)
LAYOUTS = [(4, 32, "float16"), (8, 64, "bfloat16"), (4, 128, "float32")]
# levels across word boundaries: 3, 5 and 6 bits (2 bits takes the whole-level path of 4 and 8); 5 and 6 bits
# differ from 3 only in constants: the slow tier (two compiles fewer in the quick one)
STREAM_LAYOUTS = [(3, 32, "float32"), pytest.param(5, 128, "float16", marks=pytest.mark.slow),
                  pytest.param(6, 64, "bfloat16", marks=pytest.mark.slow)]
# the kernel dequantizes in float32, the reference rounds each weight to dtype first, and the output is
# rounded to dtype: each costs at most half an ulp of the row's |x| . |w| (float32: the summation order)
ROUNDING = {"float16": 2.0**-11, "bfloat16": 2.0**-8, "float32": 2.0**-20}


@functools.lru_cache(maxsize=None)
def qmm_kernel(bits: int, group_size: int, dtype: str, M=None, metal4: bool = False, backend: str = "emulator"):
    target = kernels.metal4_target() if metal4 else None
    return kernels.quantized_matmul(M, N, K, bits=bits, group_size=group_size, dtype=dtype, target=target, execution_backend=backend)


@functools.lru_cache(maxsize=None)
def tiled_kernel(bits: int, group_size: int, dtype: str, M=None, metal4: bool = False):
    target = kernels.metal4_target() if metal4 else None
    route = "tiled" if M is None else None  # a static M over VECTOR_MAX_M picks it by itself
    return kernels.quantized_matmul(M, TILED_N, K, bits=bits, group_size=group_size, dtype=dtype, target=target, execution_backend="emulator", route=route)


def operands(M: int, bits: int, group_size: int, dtype: str, seed: int, n: int = N) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    w_q, scales, biases = kernels.quantize(torch.randn(n, K).to(TORCH[dtype]), bits=bits, group_size=group_size)
    return torch.randn(M, K).to(TORCH[dtype]), w_q, scales, biases


def check(out: torch.Tensor, x: torch.Tensor, w_q, scales, biases, bits: int, group_size: int, transpose: bool = True) -> None:
    w = kernels.dequantize(w_q, scales, biases, bits=bits, group_size=group_size).double()
    w = w if transpose else w.T  # (N, K) either way
    ref = x.double() @ w.T
    bound = 2 * ROUNDING[str(x.dtype).removeprefix("torch.")] * (x.double().abs() @ w.abs().T) + 1e-30
    assert out.shape == ref.shape and out.dtype == x.dtype
    finite = torch.isfinite(ref)
    torch.testing.assert_close(out.double()[~finite], ref[~finite], rtol=0, atol=0, equal_nan=True)
    assert torch.isfinite(out[finite]).all()
    error = (out.double() - ref).abs()[finite] / bound[finite]
    assert error.numel() == 0 or error.max() <= 1, f"error {error.max().item():.3g} x bound"


@pytest.mark.parametrize("bits, group_size, dtype", LAYOUTS + STREAM_LAYOUTS)
def test_rows_match_torch(bits, group_size, dtype):
    kernel = qmm_kernel(bits, group_size, dtype)
    for M in (1, 3, 7):
        args = operands(M, bits, group_size, dtype, seed=M * bits + group_size)
        check(kernel(*args), *args, bits, group_size)


@pytest.mark.parametrize("bits, group_size, dtype", [(4, 32, "float16"), (8, 64, "bfloat16")])
def test_non_finite_x_matches_torch(bits, group_size, dtype):
    """Row 0 a NaN, row 1 a +inf, row 2 a -inf, row 3 both infinities: NaN / +-inf by each weight's sign
    (NaN where the weight is 0) / NaN or an infinity by the two weights' signs; the rest finite."""
    x, *weights = operands(5, bits, group_size, dtype, seed=11)
    x[0, 100] = math.nan
    x[1, K - 1] = math.inf
    x[2, 0] = -math.inf
    x[3, 7], x[3, 300] = math.inf, -math.inf
    out = qmm_kernel(bits, group_size, dtype)(x, *weights)
    check(out, x, *weights, bits, group_size)
    assert torch.isnan(out[0]).all() and torch.isinf(out[1]).any() and torch.isinf(out[2]).any() and torch.isfinite(out[4]).all()


def test_static_m_matches_dynamic_m():
    args = operands(5, 4, 128, "float32", seed=12)
    out = qmm_kernel(4, 128, "float32", M=5)(*args)
    check(out, *args, 4, 128)
    torch.testing.assert_close(out, qmm_kernel(4, 128, "float32")(*args), rtol=0, atol=0)


def test_metal4_target_matches_plain_metal():
    args = operands(3, 4, 128, "float32", seed=13)
    torch.testing.assert_close(qmm_kernel(4, 128, "float32", metal4=True)(*args), qmm_kernel(4, 128, "float32")(*args), rtol=0, atol=0)


def test_race_free_with_simd_sums_only():
    """Lanes split K and meet in simd_sum: no threadgroup memory, no barrier; each word of w is read
    once per threadgroup (for all rows of the chunk), as 8-byte vectors."""
    kernel = qmm_kernel(4, 128, "float32")
    args = operands(7, 4, 128, "float32", seed=14)
    check(racecheck(kernel, *args, seeds=(0, 1)), *args, 4, 128)
    total = counters(kernel, *args).total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0, total
    assert "simd_sum(" in kernel.get_kernel_source() and "uint2" in kernel.get_kernel_source()


def test_mlx_backend_takes_mx_quantize_weights_unchanged():
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build gives the weights and the second reference")
    import numpy as np

    torch.manual_seed(15)
    x, w = mx.array(torch.randn(3, K).numpy()), mx.array(torch.randn(N, K).numpy())
    w_q, scales, biases = mx.quantize(w, group_size=128, bits=4)
    out = qmm_kernel(4, 128, "float32", backend="mlx")(x, w_q, scales, biases)
    assert isinstance(out, mx.array)
    expected = mx.quantized_matmul(x, w_q, scales, biases, transpose=True, group_size=128, bits=4)
    np.testing.assert_allclose(np.array(out), np.array(expected), rtol=1e-5, atol=1e-4)
    as_torch = [torch.from_numpy(np.array(a).astype(np.int64 if a.dtype == mx.uint32 else np.float32)) for a in (w_q, scales, biases)]
    check(torch.from_numpy(np.array(out)), torch.from_numpy(np.array(x)), as_torch[0].to(torch.uint32), *as_torch[1:], 4, 128)


@pytest.mark.parametrize("bits, group_size, dtype, M", [(4, 128, "float16", None), (8, 32, "bfloat16", 40), (6, 64, "float32", 33)])
def test_tiled_rows_match_torch(bits, group_size, dtype, M):
    """T.gemm on dequantized w tiles: one row, a full 32-row tile and one row more, 40 rows (a ragged
    tile); on the fp16 kernel a NaN, a +inf and a -inf row too."""
    kernel = tiled_kernel(bits, group_size, dtype, M)
    for rows in (1, 33, 40) if M is None else (M,):
        x, *weights = operands(rows, bits, group_size, dtype, seed=rows + bits, n=TILED_N)
        if M is None and rows == 40:
            x[5, 17], x[6, K - 1], x[7, 0] = math.nan, math.inf, -math.inf
        out = kernel(x, *weights)
        check(out, x, *weights, bits, group_size)
    assert "simdgroup_multiply_accumulate" in kernel.get_kernel_source()


@pytest.mark.parametrize("bits, group_size, dtype, M", [(4, 128, "float16", None), (8, 32, "bfloat16", 40), (6, 64, "float32", 33), (3, 32, "float16", "kn")])
def test_tiled_kernels_have_no_bank_replays(bits, group_size, dtype, M):
    """The x and w tiles' rows padded to an odd multiple of 16 bytes, and each thread's dequantized
    levels stored as 16-byte runs: simdgroup_load's 8 rows (w's transposed or not), the x copy and the
    w stores meet in no bank. Before, with dense 64-byte rows (128 with transpose=False) and 8-byte
    runs at 8 bits: 30720, 30720, 61440 and 3576 replays here (50 331 648 on compare_mlx's qmm row)."""
    if M == "kn":
        kernel = transposed_kernel()
        torch.manual_seed(19)
        weights = kernels.quantize(torch.randn(TRANSPOSED["K"], TRANSPOSED["N"]).half(), bits=bits, group_size=group_size)
        args = (torch.randn(64, TRANSPOSED["K"]).half(), *weights)
    else:
        kernel = tiled_kernel(bits, group_size, dtype, M)
        args = operands(M or 64, bits, group_size, dtype, seed=19, n=TILED_N)
    check(kernel(*args), *args, bits, group_size, transpose=M != "kn")
    total = counters(kernel, *args).total
    assert total["threadgroup_replays"] == 0, total


def test_route_by_m():
    assert [kernels.quantized_matmul_route(m)[0] for m in (None, 1, 8, 9, 4096)] == ["vector", "vector", "vector", "tiled", "tiled"]
    assert kernels.quantized_matmul_route(1, transpose=False)[0] == "tiled"


TRANSPOSED = dict(N=96, K=45, bits=3, group_size=32, dtype="float16")


@functools.lru_cache(maxsize=None)
def transposed_kernel():
    return kernels.quantized_matmul(None, transpose=False, execution_backend="emulator", **TRANSPOSED)


def test_transpose_false_matches_torch():
    """w (K, N) quantized along N (mx.quantize of w as stored for x @ w): 3 bits (levels across words),
    N = 96 (a full and a half 64-column tile), K = 45 (not a multiple of the 32-row K step: the last
    w tile's rows past K are zeros); an inf in x; 33 rows under the race checker."""
    n, k, bits, group_size, dtype = (TRANSPOSED[key] for key in ("N", "K", "bits", "group_size", "dtype"))
    kernel = transposed_kernel()
    for rows in (1, 7, 33):
        torch.manual_seed(rows)
        weights = kernels.quantize(torch.randn(k, n).to(TORCH[dtype]), bits=bits, group_size=group_size)
        x = torch.randn(rows, k).to(TORCH[dtype])
        x[rows - 1, 3] = math.inf
        out = racecheck(kernel, x, *weights, seeds=(0, 1)) if rows == 33 else kernel(x, *weights)
        check(out, x, *weights, bits, group_size, transpose=False)


def test_tiled_race_free_and_metal4_matches_plain_metal():
    """The w tile is written by every thread and read by every simdgroup: a barrier on both sides of
    each step's T.gemm; on metal4 the same numbers from cooperative tensors."""
    args = operands(33, 4, 128, "float16", seed=17, n=TILED_N)
    plain = tiled_kernel(4, 128, "float16")
    out = racecheck(plain, *args, seeds=(0, 1))
    check(out, *args, 4, 128)
    metal4 = tiled_kernel(4, 128, "float16", metal4=True)
    check(metal4(*args), *args, 4, 128)
    assert "simdgroup_multiply_accumulate" not in metal4.get_kernel_source()


def test_transpose_false_agrees_with_mlx():
    """The same (K, N) layout as mx.quantize gives it, and mx.quantized_matmul(transpose=False)'s numbers."""
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build gives the weights and the second reference")
    import numpy as np

    torch.manual_seed(18)
    x, w = (mx.array(torch.randn(*shape).numpy()).astype(mx.float16) for shape in ((5, 45), (45, 96)))
    quantized = mx.quantize(w, group_size=32, bits=3)
    expected = mx.quantized_matmul(x, *quantized, transpose=False, group_size=32, bits=3)
    as_torch = [torch.from_numpy(np.array(a).astype(np.int64)).to(torch.uint32) if a.dtype == mx.uint32
                else torch.from_numpy(np.array(a.astype(mx.float32))).half() for a in (x, *quantized)]
    out = transposed_kernel()(*as_torch)
    check(out, *as_torch, 3, 32, transpose=False)
    torch.testing.assert_close(out.float(), torch.from_numpy(np.array(expected.astype(mx.float32))), rtol=4e-3, atol=4e-2)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=7, group_size=32), r"quantized_matmul bits=7 is not supported; use one of 2, 3, 4, 5, 6, 8"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=48), r"quantized_matmul group_size=48 is not supported"),
        (lambda: kernels.quantized_matmul(1, 8, 96, bits=4, group_size=64), r"quantized_matmul needs K to be a multiple of group_size=64 with transpose=True \(got K=96\)"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=32, transpose=False), r"quantized_matmul needs N to be a multiple of group_size=32 with transpose=False \(got N=8\)"),
        (lambda: kernels.quantized_matmul(1, 64, 0, bits=4, group_size=32, transpose=False), r"quantized_matmul needs K >= 1 \(got K=0\)"),
        (lambda: kernels.quantized_matmul(1, 64, 8, bits=4, group_size=32, transpose=False, route="vector"), r"quantized_matmul route='vector' needs transpose=True"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=32, dtype="int8"), r"quantized_matmul dtype='int8' is not supported"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=32, transpose="yes"), r"quantized_matmul transpose='yes' must be True"),
        (lambda: kernels.quantized_matmul(0, 8, 64, bits=4, group_size=32), r"quantized_matmul needs M >= 1 \(got M=0\)"),
        (lambda: kernels.quantized_matmul(1, 0, 64, bits=4, group_size=32), r"quantized_matmul needs N >= 1 \(got N=0\)"),
        (lambda: kernels.quantized_matmul(1, 8, 64.0, bits=4, group_size=32), r"quantized_matmul K=64.0 must be an integer"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=32, chip="M0"), r"unknown Apple chip 'M0'"),
        (lambda: kernels.quantized_matmul(1, 8, 64, bits=4, group_size=32, route="qmm"), r"quantized_matmul route='qmm' is not supported"),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)


def test_wrong_weight_shape_is_refused_by_name():
    kernel = qmm_kernel(4, 128, "float32")
    x, w_q, scales, biases = operands(1, 4, 128, "float32", seed=16)
    with pytest.raises(Exception, match="W") as info:
        kernel(x, w_q[:, :-1].contiguous(), scales, biases)
    assert "\n" not in str(info.value)
