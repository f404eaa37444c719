"""Pure helpers of the reduction lowering and of the shuffle legalization."""

from __future__ import annotations

import pytest

from tilelang_metal.legalize import segmented_shuffles as simd
from tilelang_metal.ops.reduce import complement_digits, peer_offsets, xor_masks


def test_complement_digits_fill_the_gaps_between_thread_digits():
    # r in [0, 64): thread holds (r // 4) % 4, the rest (r % 4 and r // 16) is walked locally
    assert complement_digits([(4, 4)], 64) == [(1, 4), (16, 4)]
    assert complement_digits([], 7) == [(1, 7)]
    assert complement_digits([(1, 8)], 8) == []


def test_complement_digits_refuse_overlaps_and_non_dividing_spans():
    with pytest.raises(ValueError):
        complement_digits([(1, 4), (2, 4)], 16)
    with pytest.raises(ValueError):
        complement_digits([(1, 4)], 6)


def test_xor_masks_are_the_bits_of_power_of_two_digits():
    assert xor_masks([(1, 4)]) == [1, 2]
    assert xor_masks([(2, 64)]) == [2, 4, 8, 16, 32, 64]
    assert xor_masks([(1, 5)]) is None  # not a bit field: gather instead
    assert xor_masks([(3, 2)]) is None


def test_peer_offsets_enumerate_a_group_in_one_order():
    assert peer_offsets([(1, 5)]) == [0, 1, 2, 3, 4]
    assert peer_offsets([(32, 2), (64, 2)]) == [0, 32, 64, 96]


def test_shuffle_width_must_be_a_power_of_two_up_to_32():
    for width in (1, 2, 8, 32):
        simd.check_width(width)
    for width in (0, 3, 12, 64):
        with pytest.raises(ValueError):
            simd.check_width(width)


def test_warp_reductions_are_simd_collectives():
    from tilelang_metal.codegen.simd_collectives import warp_reduce

    assert warp_reduce("bitor", "x") == "simd_or(x)"


def test_reducer_butterfly_masks_run_from_half_the_threads_down_to_the_stride():
    from tilelang_metal.ops.reducer import butterfly_masks

    assert butterfly_masks(128, 1) == [1, 2, 4, 8, 16, 32, 64]
    assert butterfly_masks(64, 4) == [4, 8, 16, 32]
    with pytest.raises(Exception, match="power-of-two"):
        butterfly_masks(96, 1)
