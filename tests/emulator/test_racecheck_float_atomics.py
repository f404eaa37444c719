"""racecheck's comparison of float atomic sums between schedules: the tolerance scales with the
magnitudes of the summed terms (not with the result, which cancellation can make tiny), and a result
that really depends on the schedule is still reported."""

from __future__ import annotations

import functools

import pytest
import torch
from test_errors import BLOCK_IDX, THREAD_IDX, kernel

from tilelang_metal.emulator import EmulatorRaceError, launch_racecheck, racecheck
from tilelang_metal.emulator.instrument import CLOSE, _compare_schedules

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@functools.lru_cache(maxsize=None)
def column_sum(rows_per_group: int, cols: int, groups: int, dtype: str):
    """S[j] += A[i, j] by T.atomic_add, each of `groups` threadgroups adding its block of rows."""
    import tilelang
    import tilelang.language as T

    @T.prim_func
    def colsum(A: T.Tensor((groups * rows_per_group, cols), dtype), S: T.Tensor((cols,), dtype)):
        with T.Kernel(groups, threads=64) as bx:
            a = T.alloc_fragment((rows_per_group, cols), dtype)
            T.copy(A[bx * rows_per_group : (bx + 1) * rows_per_group, :], a)
            for i, j in T.Parallel(rows_per_group, cols):
                T.atomic_add(S[j], a[i, j])

    return tilelang.compile(colsum, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_cancelling_float_atomic_column_sums_are_not_reported(dtype):
    """Centered columns (mean 0) of large values: the sums are near zero, their rounding is not."""
    rows, cols, groups = 32, 14, 4  # 14 columns: not a multiple of 4-wide vectors (16-bit atomics need an even count)
    kernel_ = column_sum(rows, cols, groups, dtype)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(groups * rows, cols, generator=g) * (1000 if dtype == "float32" else 30)
    x = (x - x.mean(0, keepdim=True)).to(TORCH_DTYPES[dtype])
    s = torch.zeros(cols, dtype=TORCH_DTYPES[dtype])
    racecheck(kernel_, x, s, seeds=(0, 1, 2))
    exact = x.double().sum(0)
    # every partial sum is rounded once: within (n adds) * u * sum |x| of the exact sum
    u = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]
    bound = groups * rows * u * x.double().abs().sum(0) + u * exact.abs()
    assert bool(((s.double() - exact).abs() <= bound).all()), (s, exact, bound)


def test_tolerance_follows_the_summed_magnitudes_not_the_result():
    def run(values, magnitude):
        return lambda seed: ([torch.tensor([values[seed]])], [CLOSE], [torch.tensor([magnitude], dtype=torch.float64)])

    # sums near 1e-3 of terms whose magnitudes add up to 1e4: rounding allows ~2.4e-3 (2 u (M + M))
    _compare_schedules(run([1.0e-3, 2.0e-3], 1.0e4), "launch tensor", (0, 1))
    # the same difference with magnitudes of 10 is beyond rounding
    with pytest.raises(EmulatorRaceError, match=r"beyond float-atomic rounding: launch tensor 0 element 0"):
        _compare_schedules(run([1.0e-3, 2.0e-3], 10.0), "launch tensor", (0, 1))
    # without magnitudes (a value computed from atomic sums) the old rule: rtol of the largest value
    with pytest.raises(EmulatorRaceError, match=r"beyond float-atomic rounding"):
        _compare_schedules(lambda seed: ([torch.tensor([1.0e-3 * (1 + seed)])], [CLOSE]), "launch tensor", (0, 1))


def exchange_resets_sum() -> str:
    """Every thread adds its cancelling term to S[0]; thread 0 of each threadgroup first exchanges
    S[0] for 0: atomics never race with each other, but what survives depends on the schedule."""
    tid = "((int)threadIdx.x)"
    return kernel(
        "exchange_resets_sum",
        ["const device float* __restrict A [[ buffer(0) ]]", "device float* __restrict S [[ buffer(1) ]]", BLOCK_IDX, THREAD_IDX],
        f"  if (({tid} == 0)) {{\n"
        "    atomic_exchange_explicit((device atomic_float*)(S + 0), 0.000000e+00f, memory_order_relaxed);\n"
        "  }\n"
        f"  atomic_fetch_add_explicit((device atomic_float*)(S + 0), A[((((int)blockIdx.x) * 64) + {tid})], memory_order_relaxed);\n",
        max_threads=64,
    )


def test_schedule_dependent_float_atomic_result_is_still_reported():
    g = torch.Generator().manual_seed(2)
    a = torch.randn(256, generator=g) * 1000
    a = a - a.mean()  # the full sum cancels, partial sums do not
    with pytest.raises(EmulatorRaceError, match=r"outputs depend on the schedule beyond float-atomic rounding: launch tensor 1 element 0"):
        launch_racecheck(exchange_resets_sum(), [a, torch.zeros(1)], (4, 1, 1), (64, 1, 1), seeds=(0, 1, 2))
