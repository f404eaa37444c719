"""T.reduce_max / T.reduce_min with NaN inputs: Metal's max / min return the non-NaN operand, so a
reduction ignores NaNs wherever they sit in the row (first, middle, last element; lanes of a
butterfly or of a simd_max across a simdgroup) and equals torch's NaN-ignoring fmax / fmin fold; a
line of only NaNs gives NaN in every layout."""

from __future__ import annotations

import functools
import math

import pytest
import torch

from tests.numerics import reduction_kernels as rk

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16}
MAX, MIN = rk.KINDS.index("max"), rk.KINDS.index("min")


def fmax_fold(a: torch.Tensor, dim: int, kind: str) -> torch.Tensor:
    """torch's NaN-ignoring reduction: a fold of torch.fmax / torch.fmin along `dim`."""
    combine = torch.fmax if kind == "max" else torch.fmin
    return functools.reduce(combine, a.unbind(dim))


def row_with_nans(values: torch.Tensor, positions: tuple[int, ...]) -> torch.Tensor:
    """`values` with NaN inserted at `positions` (of the result): the other elements keep their order."""
    n = values.numel() + len(positions)
    row = torch.full((n,), math.nan)
    keep = [j for j in range(n) if j not in positions]
    row[keep] = values
    return row


# Configurations of test_reductions.py (builds shared through the emulator's cache): a butterfly in
# one simdgroup (8x16 / 32), rows of a whole simdgroup: simd_max / simd_min plus threadgroup memory
# (4x64 / 128), threads outside the layout (3x5 / 32), fp16 folded into initial values (16x16 / 64).
CONFIGS = [
    (8, 16, 32, "float32", True),
    pytest.param(4, 64, 128, "float32", True, marks=pytest.mark.slow),  # ~3.4 s warm
    (3, 5, 32, "float32", True),
    pytest.param(16, 16, 64, "float16", False, marks=pytest.mark.slow),  # ~3.3 s warm
]


@pytest.mark.parametrize("M,N,threads,dtype,clear", CONFIGS, ids=lambda v: str(v))
def test_nan_position_in_a_row_does_not_change_max_or_min(M, N, threads, dtype, clear):
    kernel = rk.fragment_reductions(M, N, threads, dtype, clear)
    tdt = TORCH_DTYPES[dtype]
    torch.manual_seed(M * 100 + N)
    base = torch.randn(M, N - 2)  # each row: N - 2 numbers and two NaN slots' worth of room
    placements = [(0,), (N // 2,), (N - 1,), (0, N - 1), (N // 2, N // 2 + 1)]
    init1, init0 = torch.randn(5, M).to(tdt), torch.randn(5, N).to(tdt)
    results = []
    for positions in placements:
        # one extra number fills the row when only one NaN is inserted, the same in every placement
        filler = base[:, :1] if len(positions) == 1 else base[:, :0]
        # row 0 stays NaN-free, so no column is all NaN (test_line_of_only_nans_reduces_to_nan_in_every_layout)
        rows = [torch.cat([base[0], base[0, :2]])]
        rows += [row_with_nans(torch.cat([base[i], filler[i]]), positions) for i in range(1, M)]
        a = torch.stack(rows).to(tdt)
        r1, r0 = torch.empty(5, M, dtype=tdt), torch.empty(5, N, dtype=tdt)
        kernel(a, init1, init0, r1, r0)
        for k, kind in ((MAX, "max"), (MIN, "min")):
            for dim, got, init in ((1, r1[k], init1[k]), (0, r0[k], init0[k])):
                want = fmax_fold(a.float(), dim, kind)
                if not clear:
                    want = fmax_fold(torch.stack([init.float(), want]), 0, kind)
                where = f"{kind} dim={dim} NaN at {positions}"
                torch.testing.assert_close(got.float(), want.to(tdt).float(), rtol=0, atol=0, equal_nan=True, msg=where)
        if len(positions) == 1:
            results.append((r1[MAX].clone(), r1[MIN].clone()))
    # the same numbers with the NaN first, in the middle or last: identical row results
    for mx, mn in results[1:]:
        assert torch.equal(mx, results[0][0]) and torch.equal(mn, results[0][1])
    assert not results[0][0].isnan().any() and not results[0][1].isnan().any()


# Layouts of an all-NaN line: a butterfly in one simdgroup (8x16 / 32), threads outside the source
# layout (3x5 / 32: 15 elements on 32 threads), and the latter folded into initial values.
# The first two share their builds with CONFIGS; the clear=False one is a build of its own (~9 s).
ALL_NAN_CONFIGS = [
    (8, 16, 32, "float32", True),
    (3, 5, 32, "float32", True),
    pytest.param(3, 5, 32, "float32", False, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("M,N,threads,dtype,clear", ALL_NAN_CONFIGS, ids=lambda v: str(v))
def test_line_of_only_nans_reduces_to_nan_in_every_layout(M, N, threads, dtype, clear):
    """max / min / absmax of a row (or column) of only NaNs is NaN, torch's fmax / fmin fold, in every
    layout (it used to be -inf / +inf when threads outside the source layout hold the identity, and 0
    for absmax, which started from 0); with clear=False the initial value wins over the NaN."""
    kernel = rk.fragment_reductions(M, N, threads, dtype, clear)
    tdt = TORCH_DTYPES[dtype]
    torch.manual_seed(M * 10 + N)
    a = torch.randn(M, N)
    a[1, :] = math.nan  # an all-NaN row
    a[:, N - 1] = math.nan  # an all-NaN column (row 1 then has no number at all)
    a = a.to(tdt)
    init1, init0 = torch.randn(5, M).to(tdt), torch.randn(5, N).to(tdt)
    r1, r0 = torch.empty(5, M, dtype=tdt), torch.empty(5, N, dtype=tdt)
    kernel(a, init1, init0, r1, r0)
    for k, kind in enumerate(rk.KINDS):
        if kind not in ("max", "min", "absmax"):
            continue
        source = a.float().abs() if kind == "absmax" else a.float()
        fold = "max" if kind == "absmax" else kind
        for dim, got, init in ((1, r1[k], init1[k]), (0, r0[k], init0[k])):
            want = fmax_fold(source, dim, fold)
            if not clear:
                want = fmax_fold(torch.stack([init.float(), want]), 0, fold)
            torch.testing.assert_close(got.float(), want.to(tdt).float(), rtol=0, atol=0, equal_nan=True, msg=f"{kind} dim={dim}")
    if clear:
        assert r1[:, 1][[2, 3, 4]].isnan().all() and r0[:, N - 1][[2, 3, 4]].isnan().all()


@functools.lru_cache(maxsize=None)
def thread_local_max_min_absmax(rows: int, width: int):
    """R[k, t] = max / min / absmax over i of A[t, i], reduced in a thread-private `local` buffer."""
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((rows, width), "float32"), R: T.Tensor((3, rows), "float32")):
        with T.Kernel(1, threads=rows):
            tx = T.get_thread_binding()
            a = T.alloc_local((width,), "float32")
            for i in T.serial(width):
                a[i] = A[tx, i]
            for k, kind in enumerate(("max", "min", "absmax")):
                s = T.alloc_local((1,), "float32")
                T.reduce(a, s, kind, 0, True)
                R[k, tx] = s[0]

    return rk.compile_emulated(main)


@pytest.mark.parametrize("width", [1, 5])
def test_thread_local_line_of_only_nans_reduces_to_nan(width):
    """The thread-local lowering (local -> local) follows the same rule: an all-NaN line is NaN (it
    was -inf / +inf / 0 from the identity), NaNs among numbers are ignored."""
    a = torch.randn(32, width)
    a[1, :] = math.nan
    a[2, width // 2] = math.nan
    a[3, :] = -math.inf
    r = torch.empty(3, 32)
    thread_local_max_min_absmax(32, width)(a, r)
    for k, (kind, source) in enumerate((("max", a), ("min", a), ("max", a.abs()))):
        torch.testing.assert_close(r[k], fmax_fold(source, 1, kind), rtol=0, atol=0, equal_nan=True, msg=f"kind {k}")
    assert r[:, 1].isnan().all()


def test_cummax_follows_the_nan_rule_from_the_first_element():
    """T.cummax is the prefix fold of fmax: NaNs are ignored, and positions before the first number of
    a line are NaN (they were -inf: the scan started from the identity). torch.cummax propagates
    NaN instead, so the reference is the fold."""
    kernel = rk.scans(8, 16, 64, "float32")
    torch.manual_seed(5)
    a = torch.randn(8, 16)
    a[0, :3] = math.nan  # leading NaNs
    a[1, 7] = math.nan  # one in the middle
    a[2, :] = math.nan  # only NaNs
    a[3, 0] = math.nan
    a[3, 1] = -math.inf  # a NaN, then -inf
    c1, c0, x = (torch.empty(8, 16) for _ in range(3))
    kernel(a, c1, c0, x)
    want = torch.stack([functools.reduce(torch.fmax, a[:, : j + 1].unbind(1)) for j in range(16)], 1)
    torch.testing.assert_close(x, want, rtol=0, atol=0, equal_nan=True)
    assert x[0, :3].isnan().all() and x[2].isnan().all() and x[3, 1] == -math.inf
