"""matmul2d precision: float32 GEMMs exact by default, relaxed only when asked (pass config or
TILELANG_METAL_RELAXED_PRECISION), and the emulator's model of relaxed precision (inputs rounded to
10 mantissa bits) inside the bound docs/kernel_vocabulary.md states."""

from __future__ import annotations

import functools

import pytest
import tilelang
import torch
from gemm_support import lower_source

from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import ConfigError
from tilelang_metal.config import PRECISE_MATH, RELAXED_PRECISION

M, N, K = 37, 70, 48  # ragged: neither M nor N fills a tile (cooperative tensors need K % 16 == 0)
EXACT_RTOL = 1e-5  # float32 GEMM tolerance, relative to sum_k |a_ik| |b_kj|
RELAXED_BOUND = 2.0**-10 + K * 2.0**-24  # documented: input rounding (2 * 2^-11) + float32 accumulation


def _descriptor_flags(source: str) -> list[str]:
    lines = [line for line in source.splitlines() if "matmul2d_descriptor(" in line]
    return [line.split("false, false, ")[1].split(",")[0] for line in lines]


@functools.lru_cache(maxsize=None)
def fp32_gemm(relaxed: bool | None):
    configs = None if relaxed is None else {RELAXED_PRECISION: relaxed}
    func = E.gemm_direct_global(M, N, K, dtype="float32", out_dtype="float32")
    return tilelang.compile(func, out_idx=[-1], target=E.metal4_target(), execution_backend="emulator", pass_configs=configs)


def _operands(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)


def _scaled_error(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|c - a b| / (|a| |b|), the reference in float64."""
    exact = a.double() @ b.double()
    return (c.double() - exact).abs() / (a.double().abs() @ b.double().abs())


def test_fp32_gemm_is_exact_by_default():
    kernel = fp32_gemm(None)
    assert _descriptor_flags(kernel.get_kernel_source()) == ["false"]
    a, b = _operands()
    c = kernel(a, b)
    torch.testing.assert_close(c, a @ b, rtol=EXACT_RTOL, atol=EXACT_RTOL)
    assert _scaled_error(c, a, b).max().item() <= EXACT_RTOL


def test_relaxed_fp32_gemm_differs_from_exact_within_the_documented_bound():
    # the exact side is the default kernel (shared with the test above; the same MSL as an explicit
    # False, which test_pass_config_overrides_the_setting checks on a kernel relaxed by default)
    exact, relaxed = fp32_gemm(None), fp32_gemm(True)
    assert _descriptor_flags(exact.get_kernel_source()) == ["false"]
    assert _descriptor_flags(relaxed.get_kernel_source()) == ["true"]
    a, b = _operands(1)
    c_exact, c_relaxed = exact(a, b), relaxed(a, b)
    err_exact, err_relaxed = _scaled_error(c_exact, a, b).max().item(), _scaled_error(c_relaxed, a, b).max().item()
    assert err_exact <= EXACT_RTOL
    assert EXACT_RTOL * 10 < err_relaxed <= RELAXED_BOUND, (err_exact, err_relaxed)
    racecheck(relaxed, a, b)


def test_relaxed_inputs_keep_inf_nan_and_the_largest_floats():
    """The rounding model passes inf / NaN through and never turns a finite input into inf."""
    kernel = fp32_gemm(True)
    a, b = _operands(2)
    a[3, 5] = float("inf")
    a[7, 0] = float("nan")
    b[:, 9] = 0.0
    b[1, 11] = torch.finfo(torch.float32).max  # mantissa all ones: rounding to nearest would give inf
    a[:, 1] = 0.5
    c, want = kernel(a, b), a @ b
    assert torch.equal(torch.isnan(c), torch.isnan(want)) and torch.equal(torch.isinf(c), torch.isinf(want))
    assert torch.isnan(c[3, 9]) and torch.isinf(c[3, 0]) and torch.isnan(c[7]).all()
    assert torch.isfinite(c[20, 11]) and abs(c[20, 11].item() / want[20, 11].item() - 1) <= 2.0**-10


@pytest.mark.slow  # three lowerings of the same GEMM (~4 s); the default is also checked by the fp32 tests
def test_16_bit_inputs_are_relaxed_by_default_and_settings_choose(monkeypatch):
    monkeypatch.delenv("TILELANG_METAL_RELAXED_PRECISION", raising=False)
    half = E.gemm_direct_global(64, 64, 32)
    single = E.gemm_direct_global(64, 64, 32, dtype="float32", out_dtype="float32")
    target = E.metal4_target()
    assert _descriptor_flags(lower_source(half, target)) == ["true"]
    assert _descriptor_flags(lower_source(single, target)) == ["false"]
    monkeypatch.setenv("TILELANG_METAL_RELAXED_PRECISION", "1")
    assert _descriptor_flags(lower_source(single, target)) == ["true"]
    monkeypatch.setenv("TILELANG_METAL_RELAXED_PRECISION", "0")
    assert _descriptor_flags(lower_source(half, target)) == ["false"]
    monkeypatch.setenv("TILELANG_METAL_RELAXED_PRECISION", "sometimes")
    with pytest.raises(ConfigError, match="TILELANG_METAL_RELAXED_PRECISION='sometimes' is not valid: use auto, 0 or 1"):
        lower_source(single, target)


def test_pass_config_overrides_the_setting(monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_RELAXED_PRECISION", "1")
    func = E.gemm_direct_global(64, 64, 32)
    kernel = tilelang.compile(func, out_idx=[-1], target=E.metal4_target(), execution_backend="emulator",
                              pass_configs={RELAXED_PRECISION: False})
    assert _descriptor_flags(kernel.get_kernel_source()) == ["false"]


@pytest.mark.parametrize(
    "configs,message",
    [
        ({"tilelang_metal.relaxed": True}, "'tilelang_metal.relaxed' is not a tilelang_metal option: use one of tilelang_metal.relaxed_precision, tilelang_metal.precise_math"),
        ({RELAXED_PRECISION: "sometimes"}, "is not valid: use True, False or 'auto'"),
        ({PRECISE_MATH: "yes please"}, "is not valid: use True or False"),
    ],
)
def test_bad_plugin_pass_configs_are_refused_in_one_line(configs, message):
    func = E.gemm_direct_global(64, 64, 32)
    with pytest.raises(ConfigError, match=message) as info:
        tilelang.compile(func, out_idx=[-1], target=E.metal4_target(), execution_backend="emulator", pass_configs=configs)
    assert "\n" not in str(info.value)
