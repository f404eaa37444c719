"""T.reduce_* / T.cumsum / T.cummax on Metal, run in the emulator and compared with torch on CPU.

Each configuration is one kernel doing all five reduction kinds along both axes (see
reduction_kernels.py). The configurations cover: one simdgroup with a butterfly inside it
(8x16 / 32 threads), a whole-simdgroup collective plus threadgroup memory across simdgroups
(64x8 / 128), rows of a whole simdgroup (4x64 / 128), a replicated source (4x8 / 128, slow), a group
that is not a power of two and threads outside the layout (3x5 / 32), two simdgroups (16x16 / 64),
and fp16 / bf16 inputs accumulating in fp32.
"""

from __future__ import annotations

import pytest
import torch

from tests.numerics import reduction_kernels as rk

TORCH_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def reference(kind: str, a: torch.Tensor, dim: int) -> torch.Tensor:
    return {
        "sum": lambda: a.sum(dim),
        "abssum": lambda: a.abs().sum(dim),
        "max": lambda: a.amax(dim),
        "min": lambda: a.amin(dim),
        "absmax": lambda: a.abs().amax(dim),
    }[kind]()


def fold(kind: str, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    if kind in ("sum", "abssum"):
        return old + new
    return torch.maximum(old, new) if kind in ("max", "absmax") else torch.minimum(old, new)


CONFIGS = [
    (8, 16, 32, "float32", True),
    (3, 5, 32, "float32", True),
    (16, 16, 64, "float16", False),
]
SLOW_CONFIGS = [  # more of the same coverage; tests/slow tier
    (4, 64, 128, "float32", True),
    (64, 8, 128, "float32", False),
    (8, 16, 32, "float32", False),
    (4, 8, 128, "float32", False),
    (16, 32, 64, "bfloat16", True),
]


@pytest.mark.parametrize(
    "M,N,threads,dtype,clear", CONFIGS + [pytest.param(*c, marks=pytest.mark.slow) for c in SLOW_CONFIGS], ids=lambda v: str(v)
)
def test_every_kind_along_both_axes_matches_torch(M, N, threads, dtype, clear):
    kernel = rk.fragment_reductions(M, N, threads, dtype, clear)
    torch.manual_seed(M * 1000 + N)
    tdt = TORCH_DTYPES[dtype]
    a = torch.randn(M, N).to(tdt)
    i1, i0 = torch.randn(5, M).to(tdt), torch.randn(5, N).to(tdt)
    r1, r0 = torch.empty(5, M, dtype=tdt), torch.empty(5, N, dtype=tdt)
    kernel(a, i1, i0, r1, r0)
    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    for k, kind in enumerate(rk.KINDS):
        for dim, got, init in ((1, r1[k], i1[k]), (0, r0[k], i0[k])):
            want = reference(kind, a.float(), dim)
            if not clear:
                want = fold(kind, init.float(), want)
            # fp16 / bf16 results are rounded once, at the store (fp32 accumulation)
            torch.testing.assert_close(got.float(), want.to(tdt).float(), rtol=tol, atol=tol, msg=f"{kind} dim={dim}")


def test_fp16_sum_accumulates_in_fp32():
    """2048 ones plus one 2048: an fp16 accumulator would stall at 2048 (ulp 2); fp32 does not."""
    kernel = rk.fragment_reductions(16, 16, 64, "float16", False)
    a = torch.full((16, 16), 0.25, dtype=torch.float16)
    i1 = torch.full((5, 16), 2048.0, dtype=torch.float16)
    r1, r0 = torch.empty(5, 16, dtype=torch.float16), torch.empty(5, 16, dtype=torch.float16)
    kernel(a, i1, i1, r1, r0)
    assert r1[0].float().tolist() == [2052.0] * 16  # 2048 + 16 * 0.25


def test_reduction_in_a_loop_reuses_its_scratch_safely():
    kernel = rk.row_max_sum_in_loop(64, 8, 3, 128)
    a = torch.randn(3, 64, 8)
    out = torch.empty(8)
    kernel(a, out)
    torch.testing.assert_close(out, a.amax(1).sum(0))
    source = kernel.get_kernel_source()
    assert "threadgroup float col_red_scratch" in source  # rows span the 4 simdgroups
    assert source.count("threadgroup_barrier") == 2  # read-after-write and write-after-read, no more


def test_shared_tile_reductions():
    kernel = rk.shared_reductions(16, 16, 64)
    a, i1 = torch.randn(16, 16), torch.randn(16)
    s1, s0 = torch.empty(16), torch.empty(16)
    kernel(a, i1, s1, s0)
    torch.testing.assert_close(s1, i1 + a.sum(1))
    torch.testing.assert_close(s0, a.amin(0))


def test_single_simdgroup_reduction_uses_shuffles_not_threadgroup_memory():
    source = rk.fragment_reductions(8, 16, 32, "float32", True).get_kernel_source()
    assert "simd_shuffle_xor" in source
    assert "threadgroup " not in source and "threadgroup_barrier" not in source


def test_whole_simdgroup_groups_use_simd_collectives():
    source = rk.fragment_reductions(4, 64, 128, "float32", True).get_kernel_source()  # a row per simdgroup
    for collective in ("simd_sum(", "simd_max(", "simd_min("):
        assert collective in source


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_scans_match_torch(dtype):
    kernel = rk.scans(8, 16, 64, dtype)
    tdt = TORCH_DTYPES[dtype]
    a = torch.randn(8, 16).to(tdt)
    c1, c0, x = (torch.empty(8, 16, dtype=tdt) for _ in range(3))
    kernel(a, c1, c0, x)
    af = a.float()
    tol = 1e-5 if dtype == "float32" else 4e-3
    torch.testing.assert_close(c1.float(), af.cumsum(1).to(tdt).float(), rtol=tol, atol=tol)
    torch.testing.assert_close(c0.float(), af.flip(0).cumsum(0).flip(0).to(tdt).float(), rtol=tol, atol=tol)
    torch.testing.assert_close(x.float(), af.cummax(1).values.to(tdt).float())


def test_reducer_v2_with_start_value():
    kernel = rk.reducer_column_max(64, 32, 128, 1.5)
    a = torch.randn(64, 32)
    out = torch.empty(32)
    kernel(a, out)
    torch.testing.assert_close(out, torch.clamp(a.amax(0), min=1.5))


def test_legacy_reducer_all_reduces_over_every_thread():
    kernel = rk.legacy_reducer_column_sum(64, 32, 128)
    a = torch.randn(64, 32)
    out = torch.empty(32)
    kernel(a, out)
    torch.testing.assert_close(out, a.sum(0))
    assert "simd_sum(" in kernel.get_kernel_source()  # 128 replicas: simd collective, then threadgroup memory


def test_bitwise_reductions_on_integers():
    kernel = rk.bitwise_row_reductions(8, 64, 128)
    a = torch.randint(0, 1 << 20, (8, 64), dtype=torch.int32) | 0x30  # bit 4 and 5 set everywhere
    r = torch.empty(3, 8, dtype=torch.int32)
    kernel(a, r)
    for i in range(8):
        row = a[i].tolist()
        band, bor, bxor = -1, 0, 0
        for x in row:
            band, bor, bxor = band & x, bor | x, bxor ^ x
        assert r[:, i].tolist() == [band, bor, bxor]


def test_thread_local_reduction():
    kernel = rk.thread_local_row_sum(32, 6)
    a = torch.randn(32, 6).half()
    b = torch.empty(32, dtype=torch.float16)
    kernel(a, b)
    torch.testing.assert_close(b.float(), a.float().sum(1).half().float(), rtol=2e-3, atol=2e-3)


def test_fragment_without_a_thread_layout_is_refused_clearly():
    """A 7x13 fragment has no layout over 32 threads: a one-line error, not tilelang's bare check."""
    import tilelang
    import tilelang.language as T

    from tilelang_metal.errors import MetalLoweringError

    @T.prim_func
    def main(A: T.Tensor((7, 13), "float32"), S: T.Tensor((7,), "float32")):
        with T.Kernel(1, threads=32):
            a = T.alloc_fragment((7, 13), "float32")
            s = T.alloc_fragment((7,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, s, dim=1)
            T.copy(s, S)

    with pytest.raises(MetalLoweringError, match=r"no thread layout for fragment a \(7x13 float32\) on 32 threads: .* launch with threads=\d+ or threads=\d+"):
        tilelang.compile(main, out_idx=[-1], target="metal", execution_backend="emulator")


def test_reduced_row_that_does_not_tile_the_threads_is_refused_clearly():
    """A 4x96 fragment splits evenly over 32 threads, but a row (24 threads of 4-wide vectors) does
    not tile them, and tilelang's layout inference finds no layout for the row reduction (the same
    on target cuda). The message names this case and a thread count that works."""
    import tilelang
    import tilelang.language as T

    from tilelang_metal.errors import MetalLoweringError

    @T.prim_func
    def main(A: T.Tensor((4, 96), "float32"), S: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=32):
            a = T.alloc_fragment((4, 96), "float32")
            s = T.alloc_fragment((4,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, s, dim=1)
            T.copy(s, S)

    with pytest.raises(MetalLoweringError, match=r"no thread layout for fragment a \(4x96 float32\) on 32 threads: .*reduced rows.* threads=48 or threads=96"):
        tilelang.lower(main, target="metal")


def test_destination_laid_out_by_the_copy_after_it_matches_torch():
    """2x256 fp32 on 64 threads: the T.copy to R gives r the layout `rep * 2 + i` (row i on half the
    threads) while every thread holds part of both rows. The partials live in the layout that puts each
    result on every thread of its row, and r's owners store from it (once refused with "reduce into a
    fresh fragment")."""
    from tilelang_metal.emulator import racecheck

    kernel = rk.row_max_then_copy(2, 256, 64)
    g = torch.Generator().manual_seed(3)
    a = torch.randn(2, 256, generator=g)
    a[1, 200] = float("inf")
    a[0, 7] = float("-inf")  # never the maximum
    r = torch.empty(2)
    racecheck(kernel, a, r)
    torch.testing.assert_close(r, a.amax(1))


@pytest.mark.parametrize("M,N,threads", [(2, 256, 64), (3, 5, 32), pytest.param(4, 64, 128, marks=pytest.mark.slow)])
def test_destinations_laid_out_by_their_copies_match_torch(M, N, threads):
    """Neighbouring cases: a clear=False sum whose destination is first written by a T.copy (its layout
    from that copy), a max and a column min next to it, on layouts with and without replication."""
    kernel = rk.reductions_laid_out_by_their_copies(M, N, threads)
    g = torch.Generator().manual_seed(M * 100 + N)
    a, init = torch.randn(M, N, generator=g), torch.randn(M, generator=g)
    row_max, row_sum, col_min = torch.empty(M), torch.empty(M), torch.empty(N)
    kernel(a, init, row_max, row_sum, col_min)
    torch.testing.assert_close(row_max, a.amax(1))
    torch.testing.assert_close(row_sum, init + a.sum(1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(col_min, a.amin(0))


def test_reducer_scratch_holds_one_value_per_simdgroup_and_element():
    """A column max over 32x64 fp32 at 256 threads: the default reducer is replicated over all 256
    threads, each holding the 64 columns. After simd_max the 32 lanes of a simdgroup agree, so the
    exchange across simdgroups needs 64 x 8 values (2 KiB), not 64 x 256 (64 KiB, over Metal's 32)."""
    import re

    from tilelang_metal.emulator import racecheck

    kernel = rk.reducer_column_max(32, 64, 256, float("-inf"))
    declared = re.findall(r"threadgroup (?:float|uchar) (\w+)\[(\d+)\]", kernel.get_kernel_source())
    assert declared == [("acc_red_scratch", "512")]
    g = torch.Generator().manual_seed(7)
    a = torch.randn(32, 64, generator=g)
    a[5, 3], a[31, 63] = float("inf"), float("-inf")
    a[:, 10] = float("-inf")  # a column of -inf stays -inf
    out = torch.empty(64)
    racecheck(kernel, a, out)
    torch.testing.assert_close(out, a.amax(0))


def test_reducer_scratch_over_two_simdgroups():
    """The legacy reducer replicated over 64 threads: simd_sum, then 8 columns x 2 simdgroup slots
    (the partial simd steps with slots that keep low lane bits, masks 4..16 and 2..16, are the
    16x16 / 64 and 64x8 / 128 configurations of test_every_kind_along_both_axes_matches_torch)."""
    kernel = rk.legacy_reducer_column_sum(16, 8, 64)
    assert "threadgroup float o_red_scratch[16];" in kernel.get_kernel_source()
    g = torch.Generator().manual_seed(8)
    a = torch.randn(16, 8, generator=g)
    out = torch.empty(8)
    kernel(a, out)
    torch.testing.assert_close(out, a.sum(0), rtol=1e-5, atol=1e-5)
