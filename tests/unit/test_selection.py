"""The selection table of spec section 2.1 (plus the documented fragment extension), as pure functions."""

import pytest

from tilelang_metal.target.capabilities import capabilities_with
from tilelang_metal.target.isa import COOPERATIVE_TENSOR_KIND, SIMDGROUP_KIND
from tilelang_metal.selection import (
    Partition,
    WarpPolicy,
    can_use_cooperative_tensor,
    choose_partition,
    cooperative_tensor_blockers,
    legal_partitions,
    select_inst,
)

SQ, ROW, COL = WarpPolicy.SQUARE, WarpPolicy.FULL_ROW, WarpPolicy.FULL_COL
METAL4, PLAIN = capabilities_with({"metal4"}), capabilities_with(())


@pytest.mark.parametrize("c_scope", ["metal.simdgroup", "local.fragment"])
@pytest.mark.parametrize("metal4", [True, False])
def test_register_accumulators_take_simdgroup_in_the_spec_table(c_scope, metal4):
    sel = select_inst(c_scope=c_scope, M=64, N=128, K=64, threads=128, policy=SQ, capabilities=METAL4 if metal4 else PLAIN)
    assert sel.kind == SIMDGROUP_KIND
    assert c_scope in sel.reason


def test_fragment_extension_routes_fragments_to_cooperative_tensors_on_metal4():
    sel = select_inst(c_scope="local.fragment", M=64, N=128, K=64, threads=128, policy=SQ, capabilities=METAL4,
                      fragment_ct=True)
    assert sel.kind == COOPERATIVE_TENSOR_KIND
    # an explicit simdgroup accumulator is never rerouted
    sel = select_inst(c_scope="metal.simdgroup", M=64, N=128, K=64, threads=128, policy=SQ, capabilities=METAL4,
                      fragment_ct=True)
    assert sel.kind == SIMDGROUP_KIND
    # and the extension still needs metal4
    sel = select_inst(c_scope="local.fragment", M=64, N=128, K=64, threads=128, policy=SQ, capabilities=PLAIN,
                      fragment_ct=True)
    assert sel.kind == SIMDGROUP_KIND


@pytest.mark.parametrize("c_scope", ["global", "shared", "shared.dyn"])
@pytest.mark.parametrize(
    "M,N,K,threads,expected",
    [
        (64, 128, 64, 128, COOPERATIVE_TENSOR_KIND),
        (16, 32, 16, 32, COOPERATIVE_TENSOR_KIND),
        (128, 128, 32, 256, COOPERATIVE_TENSOR_KIND),
        (64, 128, 72, 128, SIMDGROUP_KIND),  # K % 16
        (48, 128, 64, 128, COOPERATIVE_TENSOR_KIND),  # 1x4 split: each simdgroup 48x32
        (48, 96, 64, 128, SIMDGROUP_KIND),  # 3x3 fragments cannot be split over 4 simdgroups
        (16, 64, 64, 128, SIMDGROUP_KIND),  # 1x2 fragments, 4 simdgroups
        (8, 128, 64, 128, SIMDGROUP_KIND),  # M % 16
        (64, 40, 64, 128, SIMDGROUP_KIND),  # N % 32
        (64, 128, 64, 96, SIMDGROUP_KIND),  # 3 warps: 4x4 fragments cannot split 3 ways
    ],
)
def test_memory_accumulators_on_metal4(c_scope, M, N, K, threads, expected):
    sel = select_inst(c_scope=c_scope, M=M, N=N, K=K, threads=threads, policy=SQ, capabilities=METAL4)
    assert sel.kind == expected, sel.reason
    if expected == COOPERATIVE_TENSOR_KIND:
        p = sel.partition
        assert p.m_warp * p.n_warp == threads // 32
        assert M % (p.m_warp * 16) == 0 and N % (p.n_warp * 32) == 0
    else:
        assert "simdgroup fallback" in sel.reason


def test_no_metal4_key_means_simdgroup_with_reason():
    sel = select_inst(c_scope="global", M=64, N=128, K=64, threads=128, policy=SQ, capabilities=PLAIN)
    assert sel.kind == SIMDGROUP_KIND and "metal4" in sel.reason


def test_threads_not_multiple_of_32_fall_back_with_reason():
    sel = select_inst(c_scope="global", M=64, N=128, K=64, threads=100, policy=SQ, capabilities=METAL4)
    assert sel.kind == SIMDGROUP_KIND and "multiple of 32" in sel.reason


def test_blockers_name_each_failed_condition():
    assert cooperative_tensor_blockers(SQ, 64, 128, 64, 4) == []
    reasons = cooperative_tensor_blockers(SQ, 40, 100, 24, 4)
    assert any("M=40" in r for r in reasons)
    assert any("N=100" in r for r in reasons)
    assert any("K=24" in r for r in reasons)
    assert "cannot split" in cooperative_tensor_blockers(ROW, 16, 64, 16, 4)[0] or can_use_cooperative_tensor(ROW, 16, 64, 16, 4)


@pytest.mark.parametrize("policy", [SQ, ROW, COL])
@pytest.mark.parametrize("warps", [1, 2, 4, 8])
@pytest.mark.parametrize("M,N", [(64, 128), (128, 128), (32, 256), (256, 64), (16, 32)])
def test_chosen_partitions_are_legal(policy, warps, M, N):
    part = choose_partition(policy, M, N, warps, 16, 32)
    legal = legal_partitions(M, N, warps, 16, 32)
    if part is None:
        assert legal == []
        assert not can_use_cooperative_tensor(policy, M, N, 16, warps)
    else:
        assert part in legal
        assert can_use_cooperative_tensor(policy, M, N, 16, warps)


def test_policies_prefer_their_axis():
    assert choose_partition(ROW, 128, 128, 4, 16, 32) == Partition(4, 1)
    assert choose_partition(COL, 128, 128, 4, 16, 32) == Partition(1, 4)
    # full-row falls back to the most rows that still fit
    assert choose_partition(ROW, 32, 128, 4, 16, 32) == Partition(2, 2)


def test_square_prefers_balanced_fragment_grid():
    # 64x128 tile, 4 simdgroups: 2x2 gives each simdgroup 2x2 fragments of 16x32 (the spec's example)
    assert choose_partition(SQ, 64, 128, 4, 16, 32) == Partition(2, 2)
    # 8 simdgroups on 64x128 (MLX-style): each simdgroup 32x32 -> 2x1 fragments
    part = choose_partition(SQ, 64, 128, 8, 16, 32)
    assert part.m_warp * part.n_warp == 8 and part in legal_partitions(64, 128, 8, 16, 32)


@pytest.mark.parametrize(
    "M, N, warps, split_n, expected",
    [
        (64, 64, 4, True, (4, 1, 1)),  # enough rows: every simdgroup along M (the FullRow split)
        (16, 32, 4, True, (2, 2, 1)),  # 2 row tiles: the other simdgroups split N
        (16, 32, 4, False, (2, 1, 2)),  # whole rows (a register A's producer): they replicate
        (8, 24, 8, True, (1, 1, 8)),  # 3 column tiles do not split over 2, 4 or 8 simdgroups
        (24, 40, 4, True, (1, 1, 4)),  # 3 row tiles, 5 column tiles: nothing splits 4 ways
        (12, 32, 4, True, None),  # not whole 8-row tiles
    ],
)
def test_row_partition_splits_rows_then_columns_then_replicates(M, N, warps, split_n, expected):
    from tilelang_metal.selection import row_partition

    part = row_partition(M, N, warps, 8, 8, split_n=split_n)
    assert (None if part is None else (part.m_warp, part.n_warp, part.replicas)) == expected
    if part is not None:
        assert part.simdgroups == warps and M % (part.m_warp * 8) == 0 and N % (part.n_warp * 8) == 0
