"""kernels.quantize / kernels.dequantize against mlx.core.quantize / dequantize (affine mode, MLX's
CPU build), bit for bit, for every bits x group size x dtype, on random weights and on the groups
where MLX's scale rule matters: constant groups (the 1e-7 floor), all-negative groups (the edge is
the minimum: a positive scale), a group with one outlier, all-zero groups (q0 = 0: no bias),
positive-only groups (a negative scale). Bad arguments: one-line errors naming the argument."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.kernels.quantize import BITS

mx = pytest.importorskip("mlx.core", reason="the bit-for-bit reference is MLX's quantize (pip install mlx)")

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
BITS_DTYPES = {"float16": torch.int16, "bfloat16": torch.int16, "float32": torch.int32}


def to_mlx(t: torch.Tensor):
    return mx.array(t.float().numpy()).astype(getattr(mx, str(t.dtype).removeprefix("torch.")))


def to_torch(a) -> torch.Tensor:
    if a.dtype == mx.uint32:
        return torch.from_numpy(np.array(a).astype(np.int64)).to(torch.uint32)
    return torch.from_numpy(np.array(a.astype(mx.float32))).to(TORCH[str(a.dtype).removeprefix("mlx.core.")])


def bit_pattern(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS_DTYPES[str(t.dtype).removeprefix("torch.")])  # -0.0 vs 0.0 and NaN payloads count


def adversarial_weights(dtype: str, group_size: int, seed: int) -> torch.Tensor:
    """8 rows of 256: row 0 random, then one adversarial group at the start of each other row."""
    torch.manual_seed(seed)
    w = torch.randn(8, 256) * 3
    w[1, :group_size] = 1.5  # constant group
    w[2, :group_size] = -torch.rand(group_size) - 0.5  # all negative
    w[3, :group_size] = 0  # zeros
    w[4, :group_size] *= 0.01
    w[4, 5] = 40.0  # one outlier
    w[5, :group_size] = torch.rand(group_size)  # all positive: the edge is the maximum, a negative scale
    w[6, :group_size] = -2.0  # constant negative
    w[7, :group_size] = torch.linspace(-1, 1, group_size)  # symmetric: |min| == |max|
    return w.to(TORCH[dtype])


@pytest.mark.parametrize("bits, group_size", list(itertools.product(BITS, (32, 64, 128))))
def test_quantize_is_bit_for_bit_mlx(bits, group_size):
    for dtype in TORCH:
        w = adversarial_weights(dtype, group_size, seed=bits * group_size)
        w_q, scales, biases = kernels.quantize(w, bits=bits, group_size=group_size)
        ref_q, ref_scales, ref_biases = (to_torch(a) for a in mx.quantize(to_mlx(w), group_size=group_size, bits=bits))
        assert w_q.dtype == torch.uint32 and w_q.shape == (8, 256 * bits // 32)
        assert scales.dtype == biases.dtype == w.dtype and scales.shape == (8, 256 // group_size)
        mismatched_words = (w_q.to(torch.int64) != ref_q.to(torch.int64)).sum().item()
        assert mismatched_words == 0, f"{dtype}: {mismatched_words} words differ from mx.quantize"
        assert torch.equal(bit_pattern(scales), bit_pattern(ref_scales)), dtype
        assert torch.equal(bit_pattern(biases), bit_pattern(ref_biases)), dtype
        assert (scales < 0).any() and (scales > 0).any()  # both signs of MLX's scale rule are exercised

        out = kernels.dequantize(w_q, scales, biases, bits=bits, group_size=group_size)
        ref_out = to_torch(mx.dequantize(to_mlx_uint32(ref_q), to_mlx(ref_scales), to_mlx(ref_biases), group_size=group_size, bits=bits))
        assert out.dtype == w.dtype and torch.equal(bit_pattern(out), bit_pattern(ref_out)), dtype


def to_mlx_uint32(t: torch.Tensor):
    return mx.array(t.to(torch.int64).numpy().astype(np.uint32))


def test_continuous_bit_stream_across_words():
    """3-bit levels 0..7 repeated: element 10 sits in bits 30..32, across the first two words."""
    levels = torch.arange(32, dtype=torch.int64) % 8
    w = levels.float().reshape(1, 32)  # MLX's rule: edge 7 (the maximum), scale -1, bias 7: q = 7 - w
    w_q, scales, biases = kernels.quantize(w, bits=3, group_size=32)
    stream = sum(int(word) << (32 * i) for i, word in enumerate(w_q[0].tolist()))
    decoded = [(stream >> (3 * j)) & 7 for j in range(32)]
    expected = torch.round((w[0] - biases[0, 0]) / scales[0, 0]).clamp(0, 7).to(torch.int64).tolist()
    assert decoded == expected
    torch.testing.assert_close(kernels.dequantize(w_q, scales, biases, bits=3, group_size=32), w)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.quantize(torch.zeros(2, 96), group_size=64), r"quantize needs K \(w.shape\[-1\] = 96\) to be a positive multiple of group_size=64"),
        (lambda: kernels.quantize(torch.zeros(2, 64), bits=7), r"quantize bits=7 is not supported; use one of 2, 3, 4, 5, 6, 8"),
        (lambda: kernels.quantize(torch.zeros(2, 64), group_size=16), r"quantize group_size=16 is not supported; use one of 32, 64, 128"),
        (lambda: kernels.quantize(torch.zeros(2, 64, dtype=torch.int32)), r"quantize w has dtype torch.int32; use float16, bfloat16 or float32"),
        (lambda: kernels.quantize(torch.zeros(64)), r"quantize w must be 2-D \(N, K\) \(got shape \(64,\)\)"),
        (lambda: kernels.quantize(torch.full((1, 64), float("nan"))), r"quantize w has NaN or infinite elements"),
        (lambda: kernels.quantize(torch.zeros(1, 64), bits=4.0), r"quantize bits=4.0 must be an integer"),
        (lambda: kernels.dequantize(torch.zeros(1, 8, dtype=torch.int32), torch.zeros(1, 1), torch.zeros(1, 1)), r"dequantize w_q must be a torch.uint32 tensor"),
        (lambda: kernels.dequantize(*kernels.quantize(torch.zeros(1, 64)), group_size=32), r"dequantize scales has shape \(1, 1\), w_q needs \(1, 2\)"),
        (lambda: kernels.dequantize(*kernels.quantize(torch.zeros(1, 64)), bits=3), r"dequantize w_q has 8 words per row, not a whole number"),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
