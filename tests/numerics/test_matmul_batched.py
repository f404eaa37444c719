"""kernels.matmul with `batch=` (the grid's z axis, GEMV and tiled routes) and fused epilogues
(kernels.gemm_batched, the tiled route; split-K and GEMV take the batch too): the route and its reasons, one-line refusals, and the
kernels in the emulator against torch (torch.baddbmm / addmm semantics) on both targets at odd
shapes: B batched and shared, NaN in C with beta != 0 (propagates) and beta = 0 (C not read), NaN in
A staying in its batch and row, under the race checker once per route.

Seven kernels are compiled (lru_cache); the elementwise activations run in
tests/slow/test_matmul_batched_slow.py."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.cli import main
from tilelang_metal.emulator import racecheck
from tilelang_metal.kernels.matmul import GEMM, GEMV, SPLIT_K, STAGES, compile_choice, matmul_config

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


ROUTES = [  # shape, chip, options, route, the reason that says why
    ((1, 4096, 4096), "M5", {"batch": 4}, GEMV, "batch=4 on the grid's z axis (B (batch, K, N))"),
    ((4096, 1, 4096), "M4", {"batch": 2, "shared_B": True}, GEMV, "batch=2 on the grid's z axis (one B (K, N) for every batch)"),
    ((1, 4096, 4096), "M4", {"epilogue": "bias"}, GEMM, "epilogue bias on the float32 accumulator before the one store: the tiled GEMM"),
    ((16, 40, 2048), "M5 Max", {"batch": 2}, SPLIT_K, "batch=2 on the grid's z axis (B (batch, K, N))"),  # the cost model's split
    ((64, 2048, 4096), "M4", {"epilogue": "silu"}, GEMM, "epilogue silu: split-K applies no epilogue yet"),
    ((4096, 4096, 4096), "M5", {"batch": 2, "shared_B": True, "epilogue": "alpha_beta", "alpha": 2, "beta": 0}, GEMM,
     "epilogue alpha_beta on the float32 accumulator"),
]


@pytest.mark.parametrize("shape, chip, options, route, reason", ROUTES)
def test_batched_and_epilogued_routes_say_why(shape, chip, options, route, reason):
    """Batches run on every route (the grid's z axis); epilogues on the tiled GEMM only (GEMV and
    split-K shapes take it, with the reason)."""
    choice = matmul_config(*shape, chip=chip, **options)
    assert choice.route == route and (choice.splits > 1) == (route == SPLIT_K) and any(reason in r for r in choice.reasons), choice.describe()
    program = kernels.matmul_program(choice)  # A (batch, M, K), a third input for bias / C
    a_shape = [int(d) for d in program.buffer_map[program.params[0]].shape]
    b_shape = [int(d) for d in program.buffer_map[program.params[1]].shape]
    lead = [options["batch"]] if "batch" in options else []
    assert a_shape == lead + [shape[0], shape[2]] and b_shape == ([] if options.get("shared_B") else lead) + [shape[2], shape[1]]
    assert len(program.params) == (4 if options.get("epilogue") in ("bias", "alpha_beta", "residual") else 3)


def test_summary_names_the_batch_and_the_epilogue():
    choice = matmul_config(4096, 4096, 4096, chip="M5", batch=2, shared_B=True, epilogue="alpha_beta", alpha=2, beta=0)
    tile = f"{choice.block_m}x{choice.block_n} tile, {choice.threads} threads ({choice.simdgroups} simdgroups)"  # the cost model's
    assert choice.summary() == ("matmul 2x4096x4096x4096 float16->float16 on M5 (metal4), B shared by the batch, epilogue "
                                f"alpha_beta(alpha=2, beta=0): gemm direct-global, {tile}, swizzle off")
    assert matmul_config(1, 64, 64, chip="M5", batch=3).summary().startswith("matmul 3x1x64x64 float16->float16 on M5 (metal4), B batched: gemv small_m")


def test_batch_counts_its_tiles_and_odd_pitches_are_staged_by_t_copy():
    choice = matmul_config(4095, 4097, 4096, chip="M3", batch=2)
    assert choice.run_copies == () and any("copy_runs reads 2-D operands only" in r for r in choice.reasons)
    # 32 tiles of 64x64 per batch: the cost model shares K out over fewer slices when two batches fill the GPU
    one, two = (matmul_config(64, 2048, 4096, chip="M4", batch=b) for b in (1, 2))
    assert one.route == SPLIT_K and one.splits > two.splits


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

# plain metal (M4: threadgroup-staged, 64x64x16) and metal4 (M5: T.gemm on device tiles, 64x128 on
# 8 simdgroups): odd M, N, K, a ragged third tile column (N = 133), a prime K not a multiple of block_k
ADDMM = {"epilogue": "alpha_beta", "alpha": 1.5, "beta": -0.5}
CASES = {
    "metal_batched_addmm": (37, 133, 45, "M4", {"batch": 3, **ADDMM}),
    "metal_shared_B_beta0": (37, 70, 45, "M4", {"batch": 2, "shared_B": True, "epilogue": "alpha_beta", "alpha": 2.0, "beta": 0}),
    "metal4_shared_B_bias": (29, 133, 37, "M5", {"batch": 3, "shared_B": True, "epilogue": "bias"}),
    "metal4_residual": (37, 70, 45, "M5", {"batch": 2, "epilogue": "residual"}),  # B batched: T.gemm on 3-D device tiles
    # the GEMV route: few rows of A (small_m) or columns of B (small_n), ragged N and prime K
    "gemv_small_m_batched": (3, 133, 37, "M4", {"batch": 3}),
    "gemv_small_n_shared_B": (13, 3, 131, "M5", {"batch": 2, "shared_B": True}),
    # split-K: one 64x128 tile per batch, K = 600 in 2 slices (the second ragged)
    "split_k_batched": (16, 40, 2048, "M4", {"batch": 2}),
}


def run_case(name, seed=0, nan_in_c=False, race=False, nan_in_a=False):
    M, N, K, chip, options = CASES[name]
    choice, kernel = batched_kernel(M, N, K, chip, **options)
    batch, epilogue = choice.batch, choice.epilogue
    extra_shape = None if epilogue == "none" else (N,) if epilogue == "bias" else ((batch,) if batch else ()) + (M, N)
    a, b, extra = operands(batch, M, N, K, "float16", choice.shared_B, extra_shape, seed)
    if nan_in_c:
        extra[(0,) * (extra.dim() - 2) + (M - 1, N - 1)] = math.nan
        extra[(-1,) * (extra.dim() - 2) + (0, 3)] = math.inf
    if nan_in_a:
        a[-1, M - 1, K - 1] = math.nan  # the last row of the last batch only
    inputs = (a, b) if extra is None else (a, b, extra)
    out = racecheck(kernel, *inputs, seeds=(0, 1)) if race else kernel(*inputs)
    check(out, reference(a, b, epilogue, extra, choice.alpha, choice.beta), "float16", K)
    return choice, out


def test_batched_addmm_matches_torch_baddbmm_under_racecheck():
    choice, out = run_case("metal_batched_addmm", race=True)
    assert choice.target == "metal" and choice.stages == STAGES and out.shape == (3, 37, 133)


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
    assert "//   because batch=3 on the grid's z axis (B (batch, K, N))" in out
    assert "//   because epilogue alpha_beta on the float32 accumulator before the one store: the tiled GEMM" in out
    assert main(["run", *argv, "--backend", "emulator"]) == 0
    assert "OK" in capsys.readouterr().out


def test_batched_split_k_matches_torch_under_racecheck():
    """Each batch's slices go to their own rows of the workspace (z * splits + slice) and are summed
    for that batch only."""
    choice, out = run_case("split_k_batched", race=True)
    assert choice.route == SPLIT_K and choice.splits > 1 and out.shape == (2, 16, 40)
    _, out = run_case("split_k_batched", seed=3, nan_in_a=True)
    assert torch.isnan(out[-1, -1]).all() and torch.isfinite(out[:-1]).all() and torch.isfinite(out[-1, :-1]).all()


def test_batched_gemv_small_m_matches_torch_under_racecheck():
    choice, out = run_case("gemv_small_m_batched", race=True)
    assert (choice.route, choice.gemv_variant) == (GEMV, "small_m") and out.shape == (3, 3, 133)


@pytest.mark.parametrize("name", ["gemv_small_m_batched", "gemv_small_n_shared_B"])
def test_batched_gemv_keeps_nan_in_its_batch_and_row(name):
    choice, out = run_case(name, seed=2, nan_in_a=True)
    assert choice.route == GEMV and torch.isnan(out[-1, -1]).all()
    assert torch.isfinite(out[:-1]).all() and torch.isfinite(out[-1, :-1]).all()


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: kernels.gemv_small_m(2, 64, 64, batch=-1), r"GEMV needs 1 <= batch <= 2147483647 \(got batch=-1\)"),
        (lambda: kernels.gemv_small_n(64, 2, 64, shared_B=True), r"GEMV shared_B=True needs batch="),
        (lambda: kernels.gemm_batched(64, 64, 64, batch=2.5), r"gemm_batched batch=2.5 must be an integer"),
        (lambda: kernels.gemm_batched(64, 64, 64, epilogue="tanh"), r"gemm_batched epilogue='tanh' is not one of none, relu"),
        (lambda: kernels.gemm_split_k(64, 64, 64, 2, batch=0), r"split-K needs 1 <= batch <= 2147483647 \(got batch=0\)"),
        (lambda: kernels.gemm_split_k(64, 64, 64, 2, batch=2, copy_in_runs=("A",)), r"split-K copy_in_runs reads 2-D operands only"),
    ],
)
def test_builders_check_their_batch_arguments(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)
