"""kernels.gemv_small_m for M = 1..8 (the `gemv` route of kernels.matmul for few rows): numerics
against torch at odd N and K in fp16 / bf16 / fp32, under the race checker, and its memory traffic
against a bound read off the problem: B (K x N) read once, A (M x K) once per simdgroup, every load
of a lane 16 bytes wide.

One kernel per (M, dtype) with N and K dynamic (module cache), each run at several shapes; the
other M of 1..8 in tests/slow/test_gemv_small_m_rows.py (M = 1, 3, 8 also through kernels.matmul in
test_matmul_dispatch.py)."""

from __future__ import annotations

import functools
import math

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels
from tilelang_metal.codegen.artifact import artifact_of
from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.performance.register_budget import REGISTER_BUDGET, kernel_occupancy, kernel_registers

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOLERANCE = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-4}
# one compile each: a lane loading A for itself and one other (M = 2), a group with a lane loading
# nothing (M = 3 of 4 lanes), lanes loading two rows of A (M = 8); the shapes: ragged N and K, K
# below one step of K
CASES = [(2, "bfloat16"), (3, "float32"), (8, "float16")]
SHAPES = [(133, 37), (67, 131), (29, 1), (1, 200)]


@functools.lru_cache(maxsize=None)
def gemv(M: int, dtype: str):
    func = kernels.gemv_small_m(M, T.dynamic("n"), T.dynamic("k"), dtype=dtype)
    return tilelang.compile(func, out_idx=[-1], target=kernels.plain_metal_target(), execution_backend="emulator")


def _inputs(M: int, N: int, K: int, dtype: str, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(M, K, generator=g).to(TORCH[dtype]), torch.randn(K, N, generator=g).to(TORCH[dtype])


def _check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: str) -> None:
    ref = a.float() @ b.float()
    tol = TOLERANCE[dtype]
    assert out.dtype == TORCH[dtype] and out.shape == ref.shape
    torch.testing.assert_close(out.float(), ref.to(TORCH[dtype]).float(), rtol=tol, atol=tol * max(1.0, math.sqrt(a.shape[1])))


@pytest.mark.parametrize("M, dtype", CASES)
def test_gemv_small_m_matches_torch(M, dtype):
    kernel = gemv(M, dtype)
    for N, K in SHAPES:
        a, b = _inputs(M, N, K, dtype)
        _check(kernel(a, b), a, b, dtype)


def test_gemv_small_m_under_racecheck():
    """The shuffles of A run in every lane (the sources are the lanes of one group along K, none
    inactive) and nothing else is shared: no race, the same bits in every schedule."""
    a, b = _inputs(8, 133, 131, "float16", seed=1)
    _check(racecheck(gemv(8, "float16"), a, b, seeds=(0, 1)), a, b, "float16")


def test_gemv_small_m_keeps_nan_in_its_row():
    M, N, K = 8, 67, 131
    a, b = _inputs(M, N, K, "float16", seed=2)
    a[5, 100] = math.nan  # row 5 of C all NaN, the others finite: a row of A reaches only its own row of C
    out = gemv(M, "float16")(a, b).float()
    assert torch.isnan(out[5]).all() and torch.isfinite(out[[0, 1, 2, 3, 4, 6, 7]]).all()


@pytest.mark.parametrize("M, dtype", [(2, "bfloat16"), (3, "float32")])
def test_gemv_small_m_reads_the_weights_once_in_16_byte_loads(M, dtype):
    """At N = 256, K = 512: B's bytes once, A's once per simdgroup of 32 columns (16 bytes of B per
    lane: 8 columns of 16 bits, 4 of 32 on 4 lanes), and one load instruction per 16 bytes. The
    kernel that loaded all of A in every lane read it once per 4 columns (1.41x / 1.78x MLX's device
    bytes at M = 2 / 4, 4096 x 4096) in 8-byte loads of B."""
    N, K = 256, 512
    a, b = _inputs(M, N, K, dtype)
    kernel = gemv(M, dtype)
    total = counters(kernel, a, b).total
    size = a.element_size()
    columns = 4 * 16 // size  # per simdgroup: 4 lanes of 16 bytes
    weights, activations = K * N * size, M * K * size * math.ceil(N / columns)
    assert total["device_load_bytes"] == weights + activations
    assert total["load_instructions"] == (weights + activations) // 16
    assert total.get("threadgroup_load_bytes", 0) == 0 and total.get("threadgroup_barriers", 0) == 0
    _check(kernel(a, b), a, b, dtype)


def test_gemv_small_m_fits_the_register_budget_at_8_rows():
    """8 rows of 8 fp32 accumulators per lane (64 registers) beside the rows of A and B: within the budget."""
    (record,) = artifact_of(gemv(8, "float16").get_kernel_source()).kernels
    assert kernel_registers(record).total <= REGISTER_BUDGET.registers


def test_gemv_small_m_keeps_8_threadgroups_per_core_at_4_rows():
    """MLX's steel split-K at M = 4 makes 8 threadgroups per core. The lanes take A's elements row of
    B by row of B (M of them held), not all M x 8 of a step at once (66 registers: 6 per core)."""
    source = tilelang.lower(kernels.gemv_small_m(4, 4096, 4096), target=kernels.plain_metal_target()).kernel_source
    (record,) = artifact_of(source).kernels
    registers, occupancy = kernel_occupancy(record)
    assert occupancy.threadgroups >= 8, registers


@pytest.mark.parametrize("N, K", [(T.dynamic("n"), T.dynamic("k")), (133, 37)], ids=["dynamic", "ragged"])
def test_gemv_small_m_lowers_without_serialized_vector_loops(N, K, capfd):
    """A lane's 16 bytes of A, B and C are a T.vectorized loop only where tilelang can prove them
    aligned (static strides, multiples of the run); elsewhere T.unroll. Before, dynamic or ragged N
    and K made tilelang warn "T.vectorized loop ... is lowered as a serial loop" for the A, B and C
    runs (3 warnings each; the numerics above are these kernels)."""
    capfd.readouterr()
    source = tilelang.lower(kernels.gemv_small_m(2, N, K), target=kernels.plain_metal_target()).kernel_source
    assert "simd_shuffle" in source
    assert "is lowered as a serial loop" not in capfd.readouterr().err
