"""Interior/edge split (issue 10, item 2): on a ragged launch, interior threadgroups do exactly what a
threadgroup of the aligned kernel does (emulator counters), edge threadgroups stay correct and in
bounds (the emulator bounds-checks every device access; outputs start as NaN), and a ragged K costs
the last K step only.

Proportional small shapes: 200x200 with 64x128 tiles has interior, edge-row, edge-column and corner
threadgroups, like 1000x1000 has; 256x256 is the aligned kernel with the same K.
"""

import functools

import pytest
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters

RAGGED, ALIGNED, K = 200, 256, 128


@functools.lru_cache(maxsize=None)
def _kernel(path: str, m: int, n: int, k: int, bypass: str = "1"):  # bypass: the STAGING_BYPASS value set by the caller
    import tilelang

    target = E.metal4_target() if path == "metal4" else E.plain_metal_target()
    if path == "shared":
        func = E.gemm_shared(m, n, k, 64, 64, 32, out_dtype="float16")
        target = E.metal4_target()
    else:
        func = E.gemm_direct_global(m, n, k)
    return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")


def _inputs(path: str, m: int, n: int, k: int) -> list:
    torch.manual_seed(m * 7 + n * 3 + k)
    a = torch.randn(m, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    return [a, b, torch.randn(n)] if path == "shared" else [a, b]


# Segments per simdgroup access depend on where rows start: at the ragged pitch (200 halves, 400
# bytes, not a multiple of the 128-byte segment) rows straddle more segments than at 256. The same
# work is every other count; the segments may only grow.
PITCH_DEPENDENT = "device_transactions"


def _same_work(interior: dict, aligned: dict) -> None:
    assert {k: v for k, v in interior.items() if k != PITCH_DEPENDENT} == {k: v for k, v in aligned.items() if k != PITCH_DEPENDENT}
    assert interior[PITCH_DEPENDENT] >= aligned[PITCH_DEPENDENT]


def _checked_counts(path: str, m: int, n: int, k: int, bypass: str = "1"):
    kern = _kernel(path, m, n, k, bypass)
    args = _inputs(path, m, n, k)
    out = kern(*args)
    ref = args[0].float() @ args[1].float()
    torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-2)  # NaN anywhere (an unwritten edge) fails
    return counters(kern, *args).threadgroups


# Direct-global on metal4 (cooperative tensors) and on plain metal (simdgroup matrices).
@pytest.mark.parametrize("path", ["metal4", "metal"])
def test_interior_threadgroup_counts_equal_aligned_kernel(path):
    ragged = _checked_counts(path, RAGGED, RAGGED, K)
    aligned = _checked_counts(path, ALIGNED, ALIGNED, K)
    # 200 = 3 whole 64-row tiles + 8 rows; 1 whole 128-column tile + 72 columns
    assert sorted(ragged) == [(x, y, 0) for x in range(2) for y in range(4)]
    interior = [pos for pos in ragged if pos[0] < 1 and pos[1] < 3]
    for pos in interior:
        _same_work(ragged[pos], aligned[(0, 0, 0)])
    assert aligned[(0, 0, 0)]["predicated_device_loads"] == 0
    # edge threadgroups still guard their accesses (they cross the buffer edge)
    for pos in ((1, 0, 0), (0, 3, 0), (1, 3, 0)):
        assert ragged[pos]["predicated_device_stores"] > 0, pos
    matrix = "matmul2d_16x32x16" if path == "metal4" else "simdgroup_multiply_accumulate_8x8x8"
    # an edge threadgroup runs the K loop on the simdgroups whose block of C starts inside the matrix,
    # not on those past row 200 at (1, 3); on metal4 (2 x 2 blocks of 32 x 64) all of them at (1, 0),
    # whose columns 128..199 reach both column blocks
    assert 0 < ragged[(1, 3, 0)][matrix] < aligned[(0, 0, 0)][matrix]
    if path == "metal4":
        assert ragged[(1, 0, 0)][matrix] == aligned[(0, 0, 0)][matrix]
        assert ragged[(1, 3, 0)][matrix] * 2 == aligned[(0, 0, 0)][matrix]


@pytest.mark.parametrize("bypass", ["0", "1"])
def test_shared_staging_interior_threadgroups_match_aligned_kernel(bypass, monkeypatch):
    """The shared path: tilelang's T.copy staging and the fragment's copy to C lose their edge guards
    in interior threadgroups (transform/interior_split.py). With the staging bypass (the default on
    metal4) the same kernel is a direct-global GEMM into a fragment: the same property holds."""
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", bypass)
    ragged = _checked_counts("shared", RAGGED, RAGGED, K, bypass)
    aligned = _checked_counts("shared", ALIGNED, ALIGNED, K, bypass)
    assert len(ragged) == 16  # 64x64 tiles: 3 whole + 8 rows / columns
    for x in range(3):
        for y in range(3):
            _same_work(ragged[(x, y, 0)], aligned[(0, 0, 0)])
    assert aligned[(0, 0, 0)]["predicated_device_loads"] == 0
    assert (aligned[(0, 0, 0)]["threadgroup_barriers"] > 0) == (bypass == "0")
    for pos in ((3, 0, 0), (0, 3, 0), (3, 3, 0)):
        assert ragged[pos]["predicated_device_stores"] > 0, pos


def test_ragged_k_costs_only_the_last_step():
    # plain metal: 8x8x8 steps; K=100 is 12 whole steps and one step of 4
    whole = _checked_counts("metal", RAGGED, RAGGED, 96)[(0, 0, 0)]
    ragged = _checked_counts("metal", RAGGED, RAGGED, 100)[(0, 0, 0)]
    assert whole["predicated_device_loads"] == 0
    assert ragged["predicated_device_loads"] > 0
    # the 12 whole steps load exactly what the K=96 kernel loads, unguarded
    assert ragged["device_load_instructions"] - ragged["predicated_device_loads"] == whole["device_load_instructions"]
    assert ragged["simdgroup_multiply_accumulate_8x8x8"] == whole["simdgroup_multiply_accumulate_8x8x8"] * 13 // 12
    assert ragged["predicated_device_stores"] == whole["predicated_device_stores"] == 0  # C stays unguarded


@pytest.mark.parametrize("path, m, n, k", [("metal4", 1, 200, 16), pytest.param("metal", 67, 129, 44, marks=pytest.mark.slow)])
def test_odd_shapes_stay_correct(path, m, n, k):
    kern = _kernel(path, m, n, k)
    a, b = _inputs(path, m, n, k)
    torch.testing.assert_close(kern(a, b).float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)


def _triangular_gemm(m: int, n: int, k: int, bm: int = 64, bn: int = 64, bk: int = 32):
    """Row block `by` sums the first `by + 1` K blocks only: a K loop whose extent depends on the
    threadgroup (the shape of a causal attention loop), on a ragged M so the kernel is split."""
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((m, k), "float16"), B: T.Tensor((k, n), "float16"), C: T.Tensor((m, n), "float32")):
        with T.Kernel(T.ceildiv(n, bn), T.ceildiv(m, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk), "float16")
            B_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for ko in T.serial(by + 1):
                T.copy(A[by * bm, ko * bk], A_s)
                T.copy(B[ko * bk, bx * bn], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * bm, bx * bn])

    return main


@pytest.mark.parametrize("path", ["metal4", "metal"])
def test_loop_with_threadgroup_dependent_extent_in_both_copies(path):
    """The interior and edge copies each define the K loop's variable once (TVM's analyzers refuse
    one variable bound to two ranges: the interior copy gets fresh variables)."""
    import tilelang

    m, n, k, bm, bk = 150, 64, 96, 64, 32
    target = E.metal4_target() if path == "metal4" else E.plain_metal_target()
    kern = tilelang.compile(_triangular_gemm(m, n, k), out_idx=[-1], target=target, execution_backend="emulator")
    torch.manual_seed(5)
    a, b = torch.randn(m, k, dtype=torch.float16), torch.randn(k, n, dtype=torch.float16)
    ref = torch.empty(m, n)
    for row0 in range(0, m, bm):
        depth = min(k, (row0 // bm + 1) * bk)
        ref[row0:row0 + bm] = a[row0:row0 + bm, :depth].float() @ b[:depth].float()
    torch.testing.assert_close(kern(a, b), ref, rtol=1e-2, atol=1e-2)
    assert any(row["predicated_device_loads"] == 0 for row in counters(kern, a, b).threadgroups.values())
