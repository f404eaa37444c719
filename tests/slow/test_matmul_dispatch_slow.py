"""kernels.matmul's routes at the tiles and threads the router gives metal4 chips (256 and 512
threads, K long enough to split): each 5-15 s in the emulator with the race checker."""

import pytest

from tests.numerics import test_matmul_dispatch as dispatch  # a module: its test functions are not collected here
from tests.numerics.test_matmul_dispatch import GEMM, SPLIT_K, _check, _inputs, routed


@pytest.mark.slow
def test_split_k_kernel_on_metal4_matches_torch_under_racecheck():
    """Cooperative tensors, staging bypassed; prime K in slices of 3, 3 and 1 K steps."""
    dispatch.test_split_k_kernel_matches_torch_under_racecheck(20, 70, 101, 3, "metal4", "float16")


@pytest.mark.slow
@pytest.mark.parametrize(
    "M, N, K, dtype, chip",
    [
        (16, 40, 601, "float16", "M5"),  # prime K; cooperative tensors on 8 simdgroups, staging bypassed
        (12, 70, 613, "float32", "M4"),
        (9, 130, 577, "bfloat16", "M5 Max"),  # two tiles along N, the second ragged
    ],
)
def test_routed_split_k_matches_torch_under_racecheck(M, N, K, dtype, chip):
    choice, kernel = routed(M, N, K, dtype, chip)
    assert choice.route == SPLIT_K
    _check(kernel, *_inputs(M, N, K, dtype), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, chip, tile", [(70, 300, 33, "M5", (128, 128, 512)), (37, 140, 29, "M5 Max", (64, 128, 256))])
def test_routed_gemm_with_the_chip_class_tile_matches_torch(M, N, K, chip, tile):
    choice, kernel = routed(M, N, K, "float16", chip)
    assert choice.route == GEMM and (choice.block_m, choice.block_n, choice.threads) == tile
    _check(kernel, *_inputs(M, N, K, "float16"), "float16")
