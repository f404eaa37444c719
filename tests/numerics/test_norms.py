"""kernels.rms_norm and kernels.layer_norm in the emulator against torch (F.rms_norm / F.layer_norm in
float64) and MLX (mx.fast.rms_norm / layer_norm): rows 1 and 7 through one dynamic-row kernel per
column count; one column and ragged rows (33, 100: a simdgroup per row), 1000, 2048 and over 4096
(4097: a threadgroup per row); a row far from 0 (the variance is a second pass, not
E[x^2] - mean^2); NaN / inf rows; fp16 / bf16 with float32 accumulation; the metal4 target; the
race checker on both layouts; one-line errors. Kernels compile once (lru_cache)."""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from tilelang_metal import kernels
from tilelang_metal.emulator import counters, racecheck

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
EPS = 1e-5
KINDS = ("rms_norm", "layer_norm")
# float32 tolerances: the layer norm's row 3 (mean 300, spread 3) loses ulp(300) / 3 ~ 1e-5 of each
# normalized input to float32 itself, times |weight| ~ 3 (torch's own float32 layer_norm is as far off);
# a variance from E[x^2] - mean^2 is ~1e-3 off there
ATOL = {"rms_norm": 1e-5, "layer_norm": 1e-4}


@functools.lru_cache(maxsize=None)
def norm_kernel(kind: str, cols: int, dtype: str = "float32", metal4: bool = False):
    build = kernels.rms_norm if kind == "rms_norm" else kernels.layer_norm
    target = kernels.metal4_target() if metal4 else None
    return build(None, cols, dtype=dtype, eps=EPS, target=target, execution_backend="emulator")


def operands(kind: str, rows: int, cols: int, dtype: str, seed: int) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(seed)
    x = torch.randn(rows, cols) * 3
    if rows > 3:
        x[3] += 300.0  # mean 300, spread 3: E[x^2] - mean^2 would lose most of the variance's bits in float32
    params = (torch.randn(cols), torch.randn(cols)) if kind == "layer_norm" else (torch.randn(cols),)
    return tuple(t.to(TORCH[dtype]) for t in (x, *params))


def reference(kind: str, x: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
    """torch in float64, rounded to x's dtype."""
    wide = [t.double() for t in (x, *params)]
    if kind == "rms_norm":
        out = F.rms_norm(wide[0], (x.shape[-1],), wide[1], eps=EPS)
    else:
        out = F.layer_norm(wide[0], (x.shape[-1],), wide[1], wide[2], eps=EPS)
    return out.to(x.dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [1, 33, 100, 4097])
def test_float32_rows_match_torch(kind, cols):
    kernel = norm_kernel(kind, cols)
    for rows in (1, 7):
        args = operands(kind, rows, cols, "float32", seed=rows * cols)
        out = kernel(*args)
        torch.testing.assert_close(out, reference(kind, *args), rtol=1e-5, atol=ATOL[kind])


# element loads, a simdgroup per row; 16-byte vectors, a threadgroup of 256 per row
@pytest.mark.parametrize("kind, dtype, cols", [("rms_norm", "float16", 100), ("layer_norm", "bfloat16", 2048)])
def test_half_inputs_accumulate_in_float32_and_round_once(kind, dtype, cols):
    args = operands(kind, 7, cols, dtype, seed=3)
    out = norm_kernel(kind, cols, dtype)(*args)
    assert out.dtype == TORCH[dtype]
    ref = reference(kind, *args)
    # one rounding of a float32 result: at most one unit in the last place from torch's rounding of its own
    ulp = {"float16": 2.0**-10, "bfloat16": 2.0**-7}[dtype]
    torch.testing.assert_close(out.float(), ref.float(), rtol=ulp, atol=ulp)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("cols", [33, 4097])
def test_non_finite_rows_match_torch(kind, cols):
    """Row 0 holds a NaN, row 1 a +inf, row 2 a -inf, the rest finite: torch's NaN / 0 / inf pattern."""
    x, *params = operands(kind, 5, cols, "float32", seed=5)
    x[0, cols // 2] = math.nan
    x[1, cols - 1] = math.inf
    x[2, 0] = -math.inf
    out = norm_kernel(kind, cols)(x, *params)
    torch.testing.assert_close(out, reference(kind, x, *params), rtol=1e-5, atol=ATOL[kind], equal_nan=True)
    assert torch.isnan(out[0]).all() and torch.isfinite(out[3:]).all()


def test_short_rows_race_free_without_threadgroup_memory_or_barriers():
    """One simdgroup per row: simd collectives only, nothing through threadgroup memory."""
    kernel = norm_kernel("rms_norm", 33)
    args = operands("rms_norm", 7, 33, "float32", seed=7)
    torch.testing.assert_close(racecheck(kernel, *args, seeds=(0, 1)), reference("rms_norm", *args), rtol=1e-5, atol=ATOL["rms_norm"])
    total = counters(kernel, *args).total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0, total
    assert "simd_sum(" in kernel.get_kernel_source()


def test_long_rows_race_free_with_one_barrier_per_statistic():
    """1000 columns: a threadgroup of 256 per row (250 runs of 4); the mean and the variance each
    cross its 8 simdgroups through threadgroup memory: one barrier each, none between them (the
    second statistic has its own 8 floats)."""
    kernel = norm_kernel("layer_norm", 1000)
    rows = 3
    args = operands("layer_norm", rows, 1000, "float32", seed=8)
    torch.testing.assert_close(racecheck(kernel, *args, seeds=(0, 1)), reference("layer_norm", *args), rtol=1e-5, atol=ATOL["layer_norm"])
    total = counters(kernel, *args).total
    assert total["threadgroup_barriers"] == 2 * rows, total
    assert total["threadgroup_store_bytes"] == 2 * 8 * 4 * rows, total
    assert total["device_load_instructions"] == 3 * rows * 1000 // 4 + rows * 2 * 1000 // 4 and total["narrow_device_loads"] == 0, total


def test_metal4_target_matches_plain_metal():
    kind = "layer_norm"
    args = operands(kind, 7, 100, "float32", seed=9)
    out = norm_kernel(kind, 100, metal4=True)(*args)
    torch.testing.assert_close(out, norm_kernel(kind, 100)(*args), rtol=0, atol=0)


def test_mlx_fast_norms_agree():
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build is the second reference")
    import numpy as np

    for kind in KINDS:
        x, *params = operands(kind, 7, 100, "float32", seed=11)
        arrays = [mx.array(t.numpy()) for t in (x, *params)]
        if kind == "rms_norm":
            expected = mx.fast.rms_norm(arrays[0], arrays[1], EPS)
        else:
            expected = mx.fast.layer_norm(arrays[0], arrays[1], arrays[2], EPS)
        out = norm_kernel(kind, 100)(x, *params)
        torch.testing.assert_close(out, torch.from_numpy(np.array(expected)), rtol=1e-5, atol=ATOL[kind])


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.rms_norm(0, 8, dtype="float32", eps=EPS), r"rms_norm needs rows >= 1 \(got 0\); pass rows=None"),
        (lambda: kernels.layer_norm(4, 0, dtype="float32", eps=EPS), r"layer_norm needs cols >= 1 \(got 0\)"),
        (lambda: kernels.rms_norm(4, 8, dtype="int8", eps=EPS), r"rms_norm dtype='int8' is not supported; use one of float16, bfloat16, float32"),
        (lambda: kernels.layer_norm(4, 8, dtype="float32", eps=-1.0), r"layer_norm eps=-1.0 must be a finite float >= 0"),
        (lambda: kernels.rms_norm(4, 8, dtype="float32", eps=math.nan), r"rms_norm eps=nan must be a finite float >= 0"),
        (lambda: kernels.rms_norm(4, 8, dtype="float32", eps=EPS, threads=48), r"rms_norm threads=48 must be a multiple of 32"),
        (lambda: kernels.layer_norm(4.5, 8, dtype="float32", eps=EPS), r"layer_norm rows=4.5 must be an integer \(a float was given\)"),
    ],
)
def test_bad_arguments_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as info:
        call()
    assert "\n" not in str(info.value)
