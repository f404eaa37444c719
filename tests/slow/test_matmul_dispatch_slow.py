"""kernels.matmul's routes on metal4: split-K as routed (K long enough to split) and every tile the
metal4 dispatch can ship (METAL4_TILES, 64 to 512 threads), and the plain-metal gemm route's threadgroup-staged kernel in
every layout (NN, NT, TN) at ragged, prime and odd shapes, NaN / inf: each 5-30 s in the emulator
with the race checker."""

import functools
import math
from dataclasses import replace

import pytest
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.kernels.matmul import METAL4_TILES, STAGES, compile_choice, matmul_config
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
        (16, 40, 2053, "float16", "M5"),  # prime K; cooperative tensors, staging bypassed
        (12, 70, 1213, "float32", "M4"),  # prime K (K around 600 is no longer split: the combine's launch costs more)
        (9, 130, 1177, "bfloat16", "M5 Max"),  # two tiles along N, the second ragged
    ],
)
def test_routed_split_k_matches_torch_under_racecheck(M, N, K, dtype, chip):
    choice, kernel = routed(M, N, K, dtype, chip)
    assert choice.route == SPLIT_K
    _check(kernel, *_inputs(M, N, K, dtype), dtype)


@pytest.mark.slow
@pytest.mark.parametrize("tile", METAL4_TILES)
def test_every_metal4_tile_matches_torch(tile):
    """The cost model may pick any of them (kernels.matmul: `_metal4_candidates`): each at a ragged shape."""
    M, N, K = 70, 300, 33
    block_m, block_n, threads = tile
    choice = replace(matmul_config(M, N, K, chip="M5"), block_m=block_m, block_n=block_n, threads=threads)
    assert choice.route == GEMM and choice.target == "metal4"
    _check(compile_choice(choice, "emulator"), *_inputs(M, N, K, "float16"), "float16")


# ----------------------------------------------------------------------------- plain metal: the threadgroup-staged gemm route


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_plain_metal_transposed_gemm_reads_rows_in_16_byte_loads(layout):
    """A transposed operand is staged in its storage order (16-byte loads of its rows) and read
    transposed from threadgroup memory: the same load count as NN, no narrow load. The direct-global
    kernel read NT's B and TN's A with scalar strided loads."""
    choice, source, total = dispatch.staged_counts(layout, K=128)
    loads, steps = dispatch.staged_model(choice, 64, 128, 128)
    assert total["device_load_instructions"] == loads and total["narrow_device_loads"] == 0
    assert 0 < total["threadgroup_barriers"] <= 2 * steps  # MLX's loop: two per K step
    assert ", true);" in source  # simdgroup_load(..., transpose=true) from threadgroup memory


STAGED_CASES = [  # M, N, K, dtype, layout: tiles that do not divide, prime and odd sizes, K shorter than one step
    (37, 131, 29, "float16", "nn"),
    (70, 150, 67, "bfloat16", "nt"),
    (45, 133, 53, "float32", "tn"),
    (65, 129, 97, "float16", "tn"),  # one row and one column past a whole tile, odd pitches
    (1, 1, 1, "float16", "nt"),  # smaller than everything; GEMV would take it from the router, the kernel must too
]


@functools.lru_cache(maxsize=None)
def staged_kernel(M, N, K, dtype, layout):
    # the staged gemm route's kernel (chosen at an aligned shape) at any shape, odd pitches included
    choice = replace(matmul_config(64, 128, 64, dtype, chip="M4"), M=M, N=N, K=K)
    assert choice.stages == STAGES
    return compile_choice(choice, "emulator", trans_A=layout == "tn", trans_B=layout == "nt")


def _stored(a, b, layout):
    return (a.t().contiguous() if layout == "tn" else a), (b.t().contiguous() if layout == "nt" else b)


@pytest.mark.slow
@pytest.mark.parametrize("M, N, K, dtype, layout", STAGED_CASES)
def test_plain_metal_staged_gemm_matches_torch_under_racecheck(M, N, K, dtype, layout):
    a, b = _inputs(M, N, K, dtype)
    kernel = staged_kernel(M, N, K, dtype, layout)
    ref = a.float() @ b.float()
    out = racecheck(kernel, *_stored(a, b, layout), seeds=(0, 1))
    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    assert out.dtype == dispatch.TORCH[dtype] and out.shape == (M, N)
    torch.testing.assert_close(out.float(), ref.to(dispatch.TORCH[dtype]).float(), rtol=tol, atol=tol * math.sqrt(K))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nn", "nt", "tn"])
def test_plain_metal_staged_gemm_propagates_nan_and_inf(layout):
    M, N, K = 70, 150, 67
    a, b = _inputs(M, N, K, "bfloat16", seed=4)
    a[3, 66] = math.nan  # the last (ragged) K step: row 3 of C all NaN
    b[0, 140] = math.inf  # column 140 (second tile): inf, or NaN where a product with it cancels
    b[40, 2] = -math.inf
    out = staged_kernel(M, N, K, "bfloat16", layout)(*_stored(a, b, layout))
    ref = a.float() @ b.float()
    assert torch.isnan(out[3]).all()
    torch.testing.assert_close(out.float(), ref.to(torch.bfloat16).float(), rtol=1e-2, atol=1e-2 * math.sqrt(K), equal_nan=True)


@pytest.mark.slow
@pytest.mark.parametrize("chip, tile_m, ms, layout, dtype", [("M4", 48, (33,), "tn", "float32"), ("M5", 32, (31, 32), "tn", "float16")])
def test_small_m_tiles_match_torch_other_classes(chip, tile_m, ms, layout, dtype):
    """The small-M tile classes tests/numerics/test_matmul_small_m.py leaves to this tier."""
    from tests.numerics import test_matmul_small_m as small_m

    small_m.test_small_m_tiles_match_torch(chip, tile_m, ms, layout, dtype)


@pytest.mark.slow
def test_small_m_ends_on_metal4_match_torch():
    from tests.numerics import test_matmul_small_m as small_m

    small_m.test_m_2_and_63_keep_their_routes_and_match_torch("M5")
