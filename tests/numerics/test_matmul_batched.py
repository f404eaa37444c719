"""kernels.matmul with `batch=` (the grid's z axis) and fused epilogues (kernels.gemm_batched):
the route and its reasons, one-line refusals, and the kernels in the emulator against torch
(torch.baddbmm / addmm semantics) on both targets at odd shapes: B batched and shared, NaN in C
with beta != 0 (propagates) and beta = 0 (C not read), once under the race checker.

Four kernels are compiled (two per target, lru_cache); the elementwise activations run in
tests/slow/test_matmul_batched_slow.py."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.cli import main
from tilelang_metal.emulator import racecheck
from tilelang_metal.kernels.matmul import GEMM, GEMV, SPLIT_K, compile_choice, matmul_config

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOL = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}


@functools.lru_cache(maxsize=None)
def batched_kernel(M, N, K, chip, dtype="float16", **options):
    choice = matmul_config(M, N, K, dtype, chip=chip, **options)
    return choice, compile_choice(choice, "emulator")


def reference(a, b, epilogue="none", extra=None, alpha=1.0, beta=1.0):
    """torch's result in float32: baddbmm / addmm semantics (beta = 0 ignores C, NaN included)."""
    product = torch.matmul(a.float(), b.float())
    if epilogue == "alpha_beta":
        return torch.baddbmm(extra.float(), a.float(), b.float().expand(a.shape[0], *b.shape[-2:]), alpha=alpha, beta=beta) \
            if a.dim() == 3 else torch.addmm(extra.float(), a.float(), b.float(), alpha=alpha, beta=beta)
    return {
        "none": lambda p: p,
        "bias": lambda p: p + extra.float(),
        "residual": lambda p: p + extra.float(),
        "scale": lambda p: alpha * p,
        "relu": torch.relu,
        "gelu_tanh": lambda p: torch.nn.functional.gelu(p, approximate="tanh"),
        "silu": torch.nn.functional.silu,
    }[epilogue](product)


def operands(batch, M, N, K, dtype, shared_B=False, extra_shape=None, seed=0):
    torch.manual_seed(seed)
    lead = (batch,) if batch else ()
    a = torch.randn(*lead, M, K).to(TORCH[dtype])
    b = torch.randn(*(() if shared_B else lead), K, N).to(TORCH[dtype])
    extra = torch.randn(*extra_shape).to(TORCH[dtype]) if extra_shape else None
    return a, b, extra


def check(out, ref, dtype, K):
    assert out.dtype == TORCH[dtype] and out.shape == ref.shape
    tol = TOL[dtype]
    torch.testing.assert_close(out.float(), ref.to(TORCH[dtype]).float(), rtol=tol, atol=tol * max(1.0, math.sqrt(K)), equal_nan=True)


# ----------------------------------------------------------------------------- decisions


@pytest.mark.parametrize("shape, unbatched", [((1, 4096, 4096), GEMV), ((64, 4096, 4096), SPLIT_K), ((4096, 4096, 4096), GEMM)])
@pytest.mark.parametrize("chip", ["M5", "M4"])
def test_batched_and_epilogued_problems_take_the_tiled_route_with_a_reason(shape, unbatched, chip):
    assert matmul_config(*shape, chip=chip).route == unbatched
    for options, named in (({"batch": 4}, "batch=4"), ({"epilogue": "bias"}, "epilogue bias"),
                           ({"batch": 2, "shared_B": True, "epilogue": "alpha_beta", "alpha": 2, "beta": 0}, "batch=2 and epilogue alpha_beta")):
        choice = matmul_config(*shape, chip=chip, **options)
        assert (choice.route, choice.splits, choice.swizzle, choice.run_copies) == (GEMM, 1, 0, ())
        assert any(r.startswith(f"{named}: the GEMV and split-K kernels take neither") for r in choice.reasons), choice.reasons
        program = kernels.matmul_program(choice)  # the batched kernel: A (batch, M, K), a third input for bias / C
        a_shape = [int(d) for d in program.buffer_map[program.params[0]].shape]
        assert a_shape == ([options["batch"]] if "batch" in options else []) + [shape[0], shape[2]]
        assert len(program.params) == (4 if "epilogue" in options else 3)
    summary = matmul_config(*shape, chip=chip, batch=2, shared_B=True, epilogue="alpha_beta", alpha=2, beta=0).summary()
    assert summary.startswith(f"matmul 2x{shape[0]}x{shape[1]}x{shape[2]} float16->float16") and \
        ", B shared by the batch, epilogue alpha_beta(alpha=2, beta=0): gemm " in summary


def test_batch_counts_its_tiles_and_odd_pitches_are_staged_by_t_copy():
    choice = matmul_config(4095, 4097, 4096, chip="M3", batch=2)
    assert choice.run_copies == () and any("copy_runs reads 2-D operands only" in r for r in choice.reasons)
    # 32 tiles of 64x128 per batch: one batch is too few for M4's 40 threadgroups, two are not
    assert any("32 output tiles < 40 threadgroups" in r for r in matmul_config(64, 4096, 600, chip="M4", batch=1).reasons)
    assert not any("output tiles <" in r for r in matmul_config(64, 4096, 600, chip="M4", batch=2).reasons)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"batch": 0}, r"matmul needs 1 <= batch <= 2147483647 \(got batch=0\); pass batch=None"),
        ({"batch": 2.0}, r"matmul batch=2.0 must be an integer \(a float was given\); pass int\(batch\)"),
        ({"shared_B": True}, r"matmul shared_B=True needs batch=: it says B \(K, N\) is shared"),
        ({"batch": 2, "shared_B": 1}, r"matmul shared_B=1 must be True or False"),
        ({"epilogue": "gelu"}, r"matmul epilogue='gelu' is not supported; use one of none, relu, bias, scale, alpha_beta, gelu_tanh, silu, residual"),
        ({"epilogue": "bias", "alpha": 2.0}, r"matmul alpha= applies to epilogue='scale' or 'alpha_beta' only \(got epilogue='bias'\); drop alpha="),
        ({"epilogue": "scale", "beta": 0.5, "alpha": 1.0}, r"matmul beta= applies to epilogue='alpha_beta' only"),
        ({"epilogue": "scale"}, r"matmul epilogue='scale' needs alpha= \(out = alpha \* \(A @ B\)\)"),
        ({"epilogue": "alpha_beta", "beta": math.nan}, r"matmul beta=nan must be a finite real number"),
        ({"epilogue": "alpha_beta", "alpha": True}, r"matmul alpha=True must be a finite real number"),
        ({"batch": 2, "trans_B": True}, r"matmul: B stored transposed with batch= or an epilogue is not supported yet; transpose"),
    ],
)
def test_bad_batch_and_epilogue_arguments_are_one_line_errors(options, message):
    with pytest.raises(ValueError, match=message) as err:
        matmul_config(16, 16, 16, **options)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- numerics (emulator)

# plain metal (M4: threadgroup-staged, 64x128x32) and metal4 (M5: T.gemm on device tiles, 64x128 on
# 8 simdgroups): odd M, N, K, a ragged second tile column (N = 133), a prime K not a multiple of block_k
ADDMM = {"epilogue": "alpha_beta", "alpha": 1.5, "beta": -0.5}
CASES = {
    "metal_batched_addmm": (37, 133, 45, "M4", {"batch": 3, **ADDMM}),
    "metal_shared_B_beta0": (37, 70, 45, "M4", {"batch": 2, "shared_B": True, "epilogue": "alpha_beta", "alpha": 2.0, "beta": 0}),
    "metal4_shared_B_bias": (29, 133, 37, "M5", {"batch": 3, "shared_B": True, "epilogue": "bias"}),
    "metal4_residual": (37, 70, 45, "M5", {"epilogue": "residual"}),
}


def run_case(name, seed=0, nan_in_c=False, race=False):
    M, N, K, chip, options = CASES[name]
    choice, kernel = batched_kernel(M, N, K, chip, **options)
    batch, epilogue = choice.batch, choice.epilogue
    extra_shape = (N,) if epilogue == "bias" else ((batch,) if batch else ()) + (M, N)
    a, b, extra = operands(batch, M, N, K, "float16", choice.shared_B, extra_shape, seed)
    if nan_in_c:
        extra[(0,) * (extra.dim() - 2) + (M - 1, N - 1)] = math.nan
        extra[(-1,) * (extra.dim() - 2) + (0, 3)] = math.inf
    out = racecheck(kernel, a, b, extra, seeds=(0, 1)) if race else kernel(a, b, extra)
    check(out, reference(a, b, epilogue, extra, choice.alpha, choice.beta), "float16", K)
    return choice, out


def test_batched_addmm_matches_torch_baddbmm_under_racecheck():
    choice, out = run_case("metal_batched_addmm", race=True)
    assert choice.target == "metal" and choice.stages == 2 and out.shape == (3, 37, 133)


def test_batched_addmm_propagates_nan_and_inf_of_c():
    _, out = run_case("metal_batched_addmm", seed=1, nan_in_c=True)
    assert torch.isnan(out[0, 36, 132]) and torch.isinf(out[2, 0, 3]) and out[2, 0, 3] < 0  # beta = -0.5: -inf
    assert torch.isfinite(out).sum() == out.numel() - 2


def test_beta_zero_does_not_read_c_with_shared_b():
    """torch.baddbmm(beta=0) ignores C, NaN and inf included; B (K, N) is shared by the batch."""
    _, out = run_case("metal_shared_B_beta0", nan_in_c=True)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["metal4_shared_B_bias", "metal4_residual"])
def test_metal4_epilogues_match_torch(name):
    choice, _ = run_case(name)
    assert choice.target == "metal4" and choice.stages == 0


def test_batched_matmul_with_b_shared_equals_the_unbatched_rows():
    """Each batch of a shared-B product is the 2-D product of its rows: the z axis selects A and the
    output only."""
    _, kernel = batched_kernel(*CASES["metal4_shared_B_bias"][:4], **CASES["metal4_shared_B_bias"][4])
    a, b, bias = operands(3, 29, 133, 37, "float16", True, (133,), seed=4)
    out = kernel(a, b, bias)
    for z in range(3):
        check(out[z], reference(a[z], b, "bias", bias), "float16", 37)


def test_cli_explains_and_runs_a_batched_addmm(capsys):
    """`lower --explain` names the batch and the epilogue; `run` checks the kernel against torch
    (the same kernel as metal_batched_addmm: emulator cache)."""
    M, N, K, _, _ = CASES["metal_batched_addmm"]
    argv = ["--m", str(M), "--n", str(N), "--k", str(K), "--chip", "M4", "--batch", "3", "--epilogue", "alpha_beta",
            "--alpha", "1.5", "--beta", "-0.5", "--explain"]
    assert main(["lower", *argv]) == 0
    out = capsys.readouterr().out
    assert f"// matmul 3x{M}x{N}x{K} float16->float16 on M4 (metal), B batched, epilogue alpha_beta(alpha=1.5, beta=-0.5): gemm threadgroup-staged" in out
    assert "//   because batch=3 and epilogue alpha_beta: the GEMV and split-K kernels take neither" in out
    assert main(["run", *argv, "--backend", "emulator"]) == 0
    assert "OK" in capsys.readouterr().out
