"""Register staging and K-prefetch only where the register estimate with them fits the budget
(tilelang_metal.performance.register_budget); `force` turns them on anyway; the decision is recorded for --explain.
Over budget the kernel is the one without the feature: same numbers as torch, no race."""

from __future__ import annotations

import functools

import pytest
import tilelang
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck
from tilelang_metal.cli import lowered_decisions
from tilelang_metal.host import resolve_target
from tilelang_metal.host.passes import pass_context

M, N, K = 64, 128, 40  # one 64x128 tile, K ragged over 16-deep steps


def _lower(func, which, setting, value):
    target = resolve_target(E.metal4_target() if which == "metal4" else E.plain_metal_target())
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(setting, value)
        with pass_context(), target:
            artifact = tilelang.lower(func, target=target)
    return artifact.kernel_source, [d for d in lowered_decisions(artifact) if " off for registers: " in d]  # on the IR (--explain)


def _staged(dtype, block_k=16):
    return E.gemm_staged(M, N, K, 64, 128, block_k, dtype=dtype, out_dtype="float32", threads=128, num_stages=2, keep_staging=True)


@functools.lru_cache(maxsize=None)
def _compiled(value):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TILELANG_METAL_REGISTER_STAGING", value)
        return tilelang.compile(_staged("float32"), out_idx=[-1], target=E.metal4_target(), execution_backend="emulator")


def test_staging_over_budget_is_off_and_named():
    """fp32 operands on metal4, 64x128 on 128 threads: 64 accumulator + 48 operand + 24 staging
    registers and addresses pass 128; without staging it fits."""
    source, decisions = _lower(_staged("float32"), "metal4", "TILELANG_METAL_REGISTER_STAGING", "1")
    assert "staged_" not in source
    (decision,) = decisions
    text = decision
    assert text.startswith("register staging off for registers") and "about 149 of 128" in text and "=force" in text
    forced, none = _lower(_staged("float32"), "metal4", "TILELANG_METAL_REGISTER_STAGING", "force")
    assert "staged_float32" in forced and not none
    # neighbours: fp16 operands and plain metal's smaller operand fragments fit, so staging stays
    assert "staged_float16" in _lower(_staged("float16"), "metal4", "TILELANG_METAL_REGISTER_STAGING", "1")[0]
    assert "staged_float32" in _lower(_staged("float32"), "metal", "TILELANG_METAL_REGISTER_STAGING", "1")[0]


def test_default_code_is_unchanged_where_staging_fits():
    fits = _staged("float16", 32)
    assert _lower(fits, "metal4", "TILELANG_METAL_REGISTER_STAGING", "1")[0] == _lower(fits, "metal4", "TILELANG_METAL_REGISTER_STAGING", "force")[0]


def test_over_budget_kernel_matches_torch_without_a_race():
    torch.manual_seed(5)
    a, b = torch.randn(M, K), torch.randn(K, N)
    a[3, 7], b[11, 2] = float("inf"), float("nan")  # row 3 and column 2 of C turn non-finite
    out = racecheck(_compiled("1"), a, b)
    torch.testing.assert_close(out, a @ b, rtol=1e-3, atol=1e-3, equal_nan=True)


def test_k_prefetch_over_budget_is_off_and_named():
    """Direct-global 64x128 on 128 threads: fp16 operands fit a second set (122 registers); fp32
    operands do not (170), so TILELANG_METAL_K_PREFETCH=1 leaves them out and says why."""
    def direct(dtype):
        return E.gemm_direct_global(M, N, 64, 64, 128, dtype=dtype, out_dtype="float32", threads=128)

    source, decisions = _lower(direct("float32"), "metal4", "TILELANG_METAL_K_PREFETCH", "1")
    assert "_next" not in source and len(decisions) == 1
    assert decisions[0].startswith("K-prefetch off for registers") and "about 170 of 128" in decisions[0]
    assert "_next" in _lower(direct("float32"), "metal4", "TILELANG_METAL_K_PREFETCH", "force")[0]
    assert "_next" in _lower(direct("float16"), "metal4", "TILELANG_METAL_K_PREFETCH", "1")[0]
