"""Shape-aware GEMM dispatch (kernels.matmul): the route, tile and split each shape and chip gets
(decisions only for the issue's large shapes, nothing launched), then each route's kernel in the
emulator against torch at small odd shapes (M = 1, 3; N = 1, 3; prime K; NaN / inf) and under the
race checker, and the CLI's `--path auto` with `--explain`.

Kernels are compiled once per choice (lru_cache); the routed split-K and GEMM kernels on metal4
(256 and 512 threads, K >= 512) run in tests/slow/test_matmul_dispatch_slow.py."""

from __future__ import annotations

import dataclasses
import functools
import math

import pytest
import torch

from tilelang_metal import kernels
from tilelang_metal.cli import main
from tilelang_metal.codegen.artifact import artifact_of
from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.kernels.matmul import GEMM, GEMV, MIN_SLICE_K, SPLIT_K, STAGES, compile_choice, matmul_config
from tilelang_metal.performance.register_budget import kernel_registers
from tilelang_metal.performance.roofline import chip as chip_named

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


# ----------------------------------------------------------------------------- decisions


@pytest.mark.parametrize("chip", ["M5", "M5 Max", "M4"])
def test_decode_shapes_route_to_gemv(chip):
    row = matmul_config(1, 4096, 4096, chip=chip)
    col = matmul_config(4096, 1, 4096, chip=chip)
    assert (row.route, row.gemv_variant) == (GEMV, "small_m")
    assert (col.route, col.gemv_variant) == (GEMV, "small_n")
    assert any("M=1 <= 8" in r for r in row.reasons) and any("N=1 <= 8" in r for r in col.reasons)
    assert matmul_config(8, 4096, 4096, chip=chip).route == GEMV
    assert matmul_config(9, 4096, 4096, chip=chip).route != GEMV


def _plain_split_times(choice):
    """Predicted seconds of the plain dispatch's tile unsplit and in each allowed count of K slices."""
    from tilelang_metal.performance import cost_model
    from tilelang_metal.kernels.split_k import effective_splits

    on, K = chip_named(choice.chip), choice.K
    counts = {1} | {effective_splits(K, s, choice.block_k) for s in (2, 4, 8, 16) if K // s >= MIN_SLICE_K}
    return {s: cost_model.predict_choice(dataclasses.replace(choice, route=SPLIT_K if s > 1 else GEMM, splits=s,
                                                             swizzle=0 if s > 1 else choice.swizzle), chip=on)
            for s in counts}


@pytest.mark.parametrize("shape, chip", [((64, 2048, 4096), "M4"), ((64, 2048, 4096), "M1 Max"), ((1024, 1024, 1024), "M2 Ultra"),
                                         ((1024, 1024, 1024), "M3 Ultra"), ((256, 256, 4096), "M4")])
def test_plain_metal_split_count_is_the_cost_model_s_first(shape, chip):
    """Plain metal: the steel tile unsplit and in each allowed count of K slices, ranked by the cost model
    (the combine kernel and its launch count against a split). 1024^3 on the Ultra chips was split in 2
    by a tile-count rule (< 4 tiles per core) where the model predicts the unsplit kernel faster."""
    from tilelang_metal.performance import cost_model

    choice = matmul_config(*shape, chip=chip)
    times = _plain_split_times(choice)
    assert choice.target == "metal" and choice.splits in times
    assert min(times.values()) >= times[choice.splits] * (1 - cost_model.NEAR_TIE), (choice.summary(), times)
    assert any(r.startswith("the cost model ranks the tile unsplit and in") for r in choice.reasons)
    if shape == (1024, 1024, 1024):
        assert choice.route == GEMM and times[2] > times[1]


@pytest.mark.parametrize("chip, tile", [("M4 Max", (64, 64, 64)), ("M1", (64, 64, 64))])  # M4 Max: the model's pick over MLX's 4 simdgroups
def test_square_shape_gets_the_chip_class_tile_and_swizzle(chip, tile):
    choice = matmul_config(4096, 4096, 4096, chip=chip)
    assert choice.route == GEMM and (choice.block_m, choice.block_n, choice.threads) == tile
    assert choice.simdgroups == tile[2] // 32 and choice.swizzle == 8
    assert choice.target == "metal"


def test_explicit_plain_metal_target_on_m5_takes_the_steel_tile_of_its_class():
    choice = matmul_config(4096, 4096, 4096, chip="M5", target="metal")  # a base chip: MLX's small-device tile
    assert (choice.target, choice.block_m, choice.block_n, choice.block_k, choice.threads) == ("metal", 64, 64, 16, 64)


@pytest.mark.parametrize("shape, chip", [
    ((4096, 4096, 4096), "M5"), ((4096, 4096, 4096), "M5 Max"), ((1024, 1024, 1024), "M5 Max"),  # tiled; split 2 on 40 cores
    ((64, 4096, 4096), "M5"),  # 32 tiles, but reading B (32 MiB) bounds it: slices do not help
    ((1024, 1024, 3072), "M5"), ((16, 16, 600), "M5 Ultra"), ((16, 40, 300), "M5"),
])
def test_metal4_tile_and_split_are_the_cost_model_s_first(shape, chip):
    """metal4: the cost model ranks every kernel the dispatch ships (each METAL4_TILES tile, unsplit and
    in each allowed count of K slices) and the dispatch takes the first, with its predicted time."""
    from tilelang_metal.performance import cost_model
    from tilelang_metal.kernels.matmul import METAL4_TILES, MIN_SLICE_K
    from tilelang_metal.kernels.small_m import small_side_tile

    choice = matmul_config(*shape, chip=chip)
    on = chip_named(chip)
    small = small_side_tile(shape[0], shape[1], *METAL4_TILES[0][:2], "metal4")  # ranked too where it applies
    assert choice.target == "metal4" and (choice.block_m, choice.block_n, choice.threads) in METAL4_TILES + ((small[:3],) if small else ())
    predicted = cost_model.predict_choice(choice, chip=on)
    assert any(r.startswith("the cost model's first of") and f"predicted {predicted * 1e6:.1f} us on {chip}" in r for r in choice.reasons)
    K = shape[2]
    for block_m, block_n, threads in METAL4_TILES:  # no kernel the dispatch ships is predicted faster
        for splits in [1] + [s for s in (2, 4, 8, 16) if K // s >= MIN_SLICE_K]:
            other = dataclasses.replace(choice, route=SPLIT_K if splits > 1 else GEMM, block_m=block_m, block_n=block_n,
                                        threads=threads, splits=splits, block_k=32 if splits > 1 else 0)
            assert cost_model.predict_choice(other, chip=on) >= predicted * (1 - cost_model.NEAR_TIE)
    if K < 512:
        assert choice.route == GEMM and any("too short to split" in r for r in choice.reasons)


@pytest.mark.parametrize("chip", ["M4", "M5"])
def test_short_k_is_not_split_and_says_why(chip):
    choice = matmul_config(16, 40, 300, chip=chip)
    assert choice.route == GEMM and any("too short to split" in r for r in choice.reasons)


@pytest.mark.parametrize("chip", ["M1 Ultra", "M5 Ultra"])
def test_split_count_is_capped_by_slice_length(chip):
    """16x16x600: one tile, but K allows at most 2 slices of >= 256: only unsplit and 2 slices are ranked."""
    choice = matmul_config(16, 16, 600, chip=chip)
    assert choice.splits in (1, 2)
    if choice.target == "metal":
        assert any("unsplit and in 2 K slices (" in r for r in choice.reasons), choice.reasons
    else:
        assert any("first of 14 candidates" in r for r in choice.reasons), choice.reasons  # 7 tiles, unsplit and 2 slices


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: matmul_config(4, 4, 0), r"matmul needs K >= 1 \(got K=0\); C = A @ B over an empty K is all zeros: use torch.zeros"),
        (lambda: matmul_config(0, 4, 4), r"matmul needs M >= 1 \(got M=0\)"),
        # a float or bool size is refused as such (a float was told "needs M >= 1 (got M=64.0)")
        (lambda: matmul_config(64.0, 4, 4), r"matmul M=64.0 must be an integer \(a float was given\); pass int\(M\)"),
        (lambda: matmul_config(4, True, 4), r"matmul N=True must be an integer"),
        # was an OverflowError traceback (the CLI's exit status 1, which means a wrong result there)
        (lambda: matmul_config(4, 10**20, 4), r"matmul N=100000000000000000000 is over 2147483647"),
        (lambda: matmul_config(4, 4, 4, "int8"), r"matmul dtype='int8' is not supported; use one of float16, bfloat16, float32"),
        (lambda: matmul_config(4, 4, 4, chip="M9"), r"unknown Apple chip 'M9'"),
        (lambda: matmul_config(4, 4, 4, target="cuda"), r"matmul target='cuda' is not supported"),
        (lambda: kernels.gemv_small_m(9, 4, 4), r"GEMV needs 1 <= M <= 8 \(got M=9\)"),
        (lambda: kernels.gemm_split_k(4, 4, 4, 2, block_k=12), r"block_k=12 must be a positive multiple of 8"),
    ],
)
def test_bad_requests_are_one_line_errors(call, message):
    with pytest.raises(ValueError, match=message) as err:
        call()
    assert "\n" not in str(err.value)


def test_integer_sizes_of_any_integer_type_are_taken_by_value():
    """numpy integers (shapes read from arrays) and 0-d integer tensors choose what the int would; they
    were refused with the misleading "matmul needs M >= 1 (got M=3)"."""
    import numpy as np

    want = matmul_config(3, 200, 72, chip="M4")
    assert matmul_config(np.int64(3), np.int32(200), torch.tensor(72), chip="M4") == want
    assert type(matmul_config(np.int64(3), 200, 72, chip="M4").M) is int


# ----------------------------------------------------------------------------- numerics per route


@functools.lru_cache(maxsize=None)
def routed(M, N, K, dtype="float16", chip="M4", out_dtype=None):
    choice = matmul_config(M, N, K, dtype, out_dtype, chip=chip)
    return choice, compile_choice(choice, "emulator")


def _inputs(M, N, K, dtype, seed=0):
    torch.manual_seed(seed)
    return torch.randn(M, K).to(TORCH[dtype]), torch.randn(K, N).to(TORCH[dtype])


def _check(kernel, a, b, out_dtype, race=True):
    ref = a.float() @ b.float()
    out = racecheck(kernel, a, b, seeds=(0, 1)) if race else kernel(a, b)
    assert out.dtype == TORCH[out_dtype] and out.shape == ref.shape
    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[out_dtype]
    torch.testing.assert_close(out.float(), ref.to(TORCH[out_dtype]).float(), rtol=tol, atol=tol * max(1.0, math.sqrt(a.shape[1])), equal_nan=True)
    return out


GEMV_CASES = [  # M, N, K, dtype, chip: ragged N and K (not multiples of the 4-lane vectors), prime K
    (1, 133, 37, "float16", "M4"),
    (3, 70, 131, "bfloat16", "M5"),
    (8, 29, 64, "float32", "M4"),
    (13, 1, 131, "float16", "M5"),
    (21, 3, 37, "float32", "M4"),
    (1, 1, 61, "bfloat16", "M4"),
    (2, 67, 1, "float16", "M5"),  # K = 1: 31 of a column's 32 K lanes read nothing
]


@pytest.mark.parametrize("M, N, K, dtype, chip", GEMV_CASES)
def test_gemv_route_matches_torch(M, N, K, dtype, chip):
    choice, kernel = routed(M, N, K, dtype, chip)
    assert choice.route == GEMV
    _check(kernel, *_inputs(M, N, K, dtype), dtype)


def test_gemv_aligned_shape_uses_vector_loads():
    """The vector loads the docstring promises: half4 along N of B (small M), along K of A (small N)."""
    _, row = routed(1, 256, 64)
    _, col = routed(64, 1, 256)
    assert "*(const device half4*)(B + " in row.get_kernel_source()
    assert "*(const device half4*)(A + " in col.get_kernel_source()
    for kernel, shape in ((row, (1, 256, 64)), (col, (64, 1, 256))):
        _check(kernel, *_inputs(*shape, "float16"), "float16", race=False)


def test_gemv_small_m_adds_its_partials_in_the_simdgroup():
    """The lanes of a column split K and add their sums with simd shuffles (MLX's gemv_t does the
    same at 1x4096x4096): no threadgroup memory, no barrier; one vector load of B per row of K per lane,
    A's 8 elements of a step loaded by one lane of the 4 that share them (two half4) and shuffled."""
    M, N, K = 1, 256, 64
    _, kernel = routed(M, N, K)
    a, b = _inputs(M, N, K, "float16")
    total = counters(kernel, a, b).total
    assert total.get("threadgroup_load_bytes", 0) == total.get("threadgroup_store_bytes", 0) == 0
    assert total.get("threadgroup_barriers", 0) == 0 and total["simd_collectives"] > 0
    lanes, steps = N // 4 * 8, K // 64  # 4 columns per lane, 8 lanes along K per column; 8 rows of K per lane and step
    assert total["device_load_instructions"] == lanes * steps * 8 + lanes // 4 * steps * 2
    _check(kernel, a, b, "float16", race=False)


@pytest.mark.parametrize("M, N, K", [(1, 133, 37), (13, 1, 131)])
def test_gemv_propagates_nan_and_inf(M, N, K):
    _, kernel = routed(M, N, K)
    a, b = _inputs(M, N, K, "float16", seed=1)
    a[0, 5] = math.nan  # row 0 of C all NaN
    b[7, 0] = math.inf  # column 0: inf (or NaN where the other products cancel it)
    b[9, N - 1] = -math.inf
    out = _check(kernel, a, b, "float16", race=False)
    assert torch.isnan(out[0]).all()


@functools.lru_cache(maxsize=None)
def split_k_kernel(M, N, K, splits, target, dtype="float16"):
    """The split-K module itself at a K too short for the router to split (fast in the emulator)."""
    import tilelang

    func = kernels.gemm_split_k(M, N, K, splits, 32, 64, 16, dtype=dtype, threads=128)
    return tilelang.compile(func, out_idx=[-1], target=kernels.metal4_target() if target == "metal4" else kernels.plain_metal_target(),
                            execution_backend="emulator")


@pytest.mark.parametrize(
    "M, N, K, splits, target, dtype",
    [
        (20, 70, 101, 3, "metal", "float16"),  # prime K, 7 K steps in slices of 3, 3, 1 (the last one ragged)
        (9, 40, 100, 8, "metal", "float32"),  # 8 slices asked, 7 hold K (slices of 16): no empty slice is launched
        (33, 16, 37, 2, "metal", "bfloat16"),
    ],
)
def test_split_k_kernel_matches_torch_under_racecheck(M, N, K, splits, target, dtype):
    kernel = split_k_kernel(M, N, K, splits, target, dtype)
    a, b = _inputs(M, N, K, dtype)
    ref = a.float() @ b.float()
    tol = {"float32": 1e-4, "float16": 2e-3, "bfloat16": 1e-2}[dtype]
    out = racecheck(kernel, a, b, seeds=(0, 1))
    torch.testing.assert_close(out.float(), ref.to(TORCH[dtype]).float(), rtol=tol, atol=tol * math.sqrt(K))


def test_split_k_skips_empty_slices():
    assert kernels.split_k.effective_splits(100, 8, 16) == 7 and kernels.split_k.slice_k(100, 8, 16) == 16
    assert kernels.split_k.effective_splits(4096, 2, 32) == 2 and kernels.split_k.slice_k(4096, 2, 32) == 2048


def test_split_k_route_matches_torch():
    """The router's split-K on plain metal (16x40x1024 on M4: the cost model's 4 slices of 256)."""
    choice, kernel = routed(16, 40, 1024, "float16", "M4")
    assert choice.route == SPLIT_K and choice.splits > 1
    _check(kernel, *_inputs(16, 40, 1024, "float16"), "float16", race=False)


def test_split_k_propagates_nan_and_inf():
    _, kernel = routed(16, 40, 1024, "float16", "M4")
    a, b = _inputs(16, 40, 1024, "float16", seed=2)
    a[2, 590] = math.nan  # in a later slice: the sum of the slices keeps it
    b[10, 3] = math.inf
    out = _check(kernel, a, b, "float16", race=False)
    assert torch.isnan(out[2]).all()


def test_split_k_is_bitwise_deterministic():
    _, kernel = routed(16, 40, 1024, "float16", "M4")
    a, b = _inputs(16, 40, 1024, "float16", seed=3)
    assert torch.equal(kernel(a, b), kernel(a, b))


def test_gemm_route_matches_torch():
    """Plain metal (M4): the threadgroup-staged kernel, two K steps of 16 plus a ragged one (K = 40),
    the third tile column ragged (N = 152)."""
    choice, kernel = routed(20, 152, 40, "float16", "M4")
    assert choice.route == GEMM and choice.stages == STAGES
    _check(kernel, *_inputs(20, 152, 40, "float16"), "float16")


def test_odd_row_pitch_copies_that_operand_in_runs_on_plain_metal():
    """A row pitch that is no multiple of 16 bytes (N = 4097 halves): T.copy would stage B one element
    per thread; the staged kernel stays, with B copied in 16-byte runs per thread, and the reason."""
    choice = matmul_config(4095, 4097, 4096, chip="M3")
    assert (choice.route, choice.stages, choice.run_copies) == (GEMM, STAGES, ("B",))
    assert "threadgroup-staged" in choice.summary() and "B copied in 16-byte runs" in choice.summary()
    assert any("row pitch N=4097 (float16) is not a multiple of 16 bytes" in r and "copy_runs" in r for r in choice.reasons)
    assert matmul_config(4095, 4100, 4096, "float32", chip="M3").run_copies == ()  # 4100 floats: 16400 bytes
    assert matmul_config(4096, 4096, 4100, chip="M3").run_copies == ("A",)  # K = 4100 halves: A's pitch
    assert matmul_config(4095, 4097, 4096, chip="M5").run_copies == ()  # metal4: direct-global, packed vectors


@pytest.mark.parametrize("M, N, K, route", [(65, 131, 97, GEMM), (37, 131, 1031, SPLIT_K)])
def test_odd_pitch_staged_kernel_matches_torch_with_one_move_per_run(M, N, K, route):
    """Both pitches odd (A's rows of K, B's of 131 halves), on M4, the gemm route and split-K's
    slices: NaN / inf at the ragged corners reach C where torch puts them, under the race checker;
    each 16-byte run inside the matrix is one packed move (before: 8 element loads per run), so at
    most a quarter of the device loads are narrow (the runs the edges cut)."""
    choice = matmul_config(M, N, K, chip="M4")
    assert (choice.route, choice.stages, choice.run_copies) == (route, STAGES, ("A", "B")), choice.describe()
    assert any("are not multiples of 16 bytes" in r for r in choice.reasons)
    kernel = compile_choice(choice, "emulator")
    assert "tlm_run16<half>" in kernel.get_kernel_source()
    a, b = _inputs(M, N, K, "float16", seed=5)
    a[M - 1, K - 1], b[K - 1, N - 1], b[0, 0] = math.nan, math.inf, -math.inf
    ref = a.float() @ b.float()
    out = racecheck(kernel, a, b, seeds=(0, 1)).float()
    torch.testing.assert_close(out, ref.half().float(), rtol=2e-3, atol=2e-3 * math.sqrt(K), equal_nan=True)
    total = counters(kernel, a, b).total
    assert total["narrow_device_loads"] * 4 < total["device_load_instructions"], total


@pytest.mark.parametrize("layout, runs", [("nt", ("A", "B")), ("tn", ("B",))])
def test_run_copies_cut_by_an_edge_store_without_bank_replays(layout, runs):
    """MLX's steel tile on an M1 at 200x300x100, a stored operand's pitch no multiple of 16 bytes: where
    an edge cuts the runs, a simdgroup's lanes split between the 16-byte move and the element copy,
    each storing its part of the rows with its own instruction; those partial stores met in banks
    (24 replays NT, 200 TN). Each lane now fills 16 bytes of registers either way and all lanes store
    them with one instruction: no replay, under the race checker, and the same device loads."""
    M, N, K = 200, 300, 100
    trans_A, trans_B = layout == "tn", layout == "nt"
    choice = matmul_config(M, N, K, chip="M1", trans_A=trans_A, trans_B=trans_B)
    assert (choice.route, choice.run_copies) == (GEMM, runs), choice.describe()
    kernel = compile_choice(choice, "emulator", trans_A=trans_A, trans_B=trans_B)
    a, b = _inputs(M, N, K, "float16", seed=3)
    a_s = a.t().contiguous() if trans_A else a
    b_s = b.t().contiguous() if trans_B else b
    out = racecheck(kernel, a_s, b_s, seeds=(0,)) if layout == "tn" else kernel(a_s, b_s)
    torch.testing.assert_close(out.float(), (a.float() @ b.float()).half().float(), rtol=2e-3, atol=2e-3 * math.sqrt(K))
    total = counters(kernel, a_s, b_s).total
    assert total["threadgroup_replays"] == 0, total
    assert total["narrow_device_loads"] * 4 <= total["device_load_instructions"], total  # K's last step: 1 of 4 runs cut
    record = artifact_of(kernel.get_kernel_source()).kernels[0]
    peak = {t.name: t.elem_type for t in record.thread_arrays if t.name in kernel_registers(record).peak}
    assert all(t.startswith("simdgroup_") for t in peak.values()), peak  # the run registers add to no peak


# ----------------------------------------------------------------------------- plain metal: staged through threadgroup memory


@pytest.mark.parametrize("dtype, chip, mlx_tile, tile", [
    ("float16", "M3", (64, 64, 16, 64), (64, 64, 16, 64)), ("bfloat16", "M3 Pro", (64, 64, 16, 64), (64, 64, 16, 64)),  # wm 1 wn 2
    # MLX's default tile (wm 2 wn 2); the model ranks the same tile on 2 simdgroups ahead (fewer fragment loads, at least
    # MLX's threadgroups per core: fp32 6 and 6, fp16 on M3 Max 9 and 7)
    ("float32", "M3", (64, 64, 16, 128), (64, 64, 16, 64)), ("float16", "M3 Max", (64, 64, 16, 128), (64, 64, 16, 64)),
])
def test_plain_metal_gemm_and_split_k_take_mlx_steel_tiles(dtype, chip, mlx_tile, tile):
    """M1-M4: one of MLX's steel tiles, ranked by the cost model against MLX's tile for the chip class
    (tests/mlx_reference/test_steel_tiles.py checks the whole table against MLX's host logic and the
    model), A and B staged in one padded buffer each; split-K slices take the same tile; metal4 keeps
    the direct-global kernel (no stages)."""
    for shape, routes in (((4096, 4096, 4096), (GEMM,)), ((64, 4096, 4096), (GEMM, SPLIT_K))):  # the model's split
        choice = matmul_config(*shape, dtype, chip=chip)
        assert choice.route in routes and (choice.target, choice.stages) == ("metal", STAGES)
        assert (choice.block_m, choice.block_n, choice.block_k, choice.threads) == tile
        assert any(f"MLX's steel tile {mlx_tile[0]}x{mlx_tile[1]}x{mlx_tile[2]} on {mlx_tile[3] // 32} simdgroups" in r for r in choice.reasons)
        assert any(r.startswith("the cost model ranks MLX's steel tiles") for r in choice.reasons), choice.describe()
        assert "threadgroup-staged" in choice.summary() or choice.route == SPLIT_K
    nax = matmul_config(4096, 4096, 4096, dtype, chip="M5")
    assert (nax.stages, nax.block_k) == (0, 0) and "direct-global" in nax.summary()


def test_transposes_only_on_the_gemm_route():
    with pytest.raises(ValueError, match=r"the split_k route takes A \(M, K\) and B \(K, N\) only; transpose the operands"):
        kernels.matmul_program(matmul_config(64, 2048, 4096, chip="M3"), trans_B=True)


@pytest.mark.parametrize("chip", ["M5", "M4"])
def test_transposed_problems_take_the_gemm_route_with_a_reason(chip):
    """A GEMV shape (M = 1) and a split-K shape (64x2048x4096), stored transposed: the tiled GEMM,
    with a reason naming the transposed operand; the untransposed problems keep their routes."""
    split_shape = (64, 2048, 4096) if chip == "M4" else (16, 40, 4096)  # split by the cost model on both
    for shape, untransposed in (((1, 4096, 4096), GEMV), (split_shape, SPLIT_K)):
        assert matmul_config(*shape, chip=chip).route == untransposed
        for flags in ({"trans_A": True}, {"trans_B": True}, {"trans_A": True, "trans_B": True}):
            choice = matmul_config(*shape, chip=chip, **flags)
            assert (choice.route, choice.splits, choice.trans_A, choice.trans_B) == (GEMM, 1, flags.get("trans_A", False), flags.get("trans_B", False))
            assert any("stored transposed" in r and "GEMV and split-K" in r for r in choice.reasons), choice.reasons
            assert not any("too short to split" in r for r in choice.reasons)
            layout = ("T" if choice.trans_A else "N") + ("T" if choice.trans_B else "N")
            assert f"{shape[0]}x{shape[1]}x{shape[2]} {layout} " in choice.summary()
    with pytest.raises(ValueError, match=r"matmul trans_B=1 must be True or False"):
        matmul_config(64, 64, 64, chip=chip, trans_B=1)


@pytest.mark.parametrize("M, N, K, flags, runs", [
    (4095, 4096, 4096, {}, ()),  # NN: the pitches are K and N; M is no pitch
    (4095, 4096, 4096, {"trans_A": True}, ("A",)),  # A^T (K, M): rows of M = 4095 elements
    (4096, 4096, 4095, {}, ("A",)),  # NN: A's rows of K = 4095
    (4096, 4095, 4096, {"trans_B": True}, ()),  # B^T (N, K): rows of K; N is no pitch
    (4096, 4096, 4095, {"trans_B": True}, ("A", "B")),  # A's rows and B^T's rows of K = 4095
])
def test_odd_pitch_rule_reads_the_pitches_as_stored(M, N, K, flags, runs):
    choice = matmul_config(M, N, K, chip="M4", **flags)
    assert (choice.route, choice.stages, choice.run_copies) == (GEMM, STAGES, runs), choice.describe()
    assert any("is not a multiple of 16 bytes" in r for r in choice.reasons) == bool(runs)


@pytest.mark.parametrize("M, N, K, layout, chip", [(1, 40, 24, "nt", "M5"), (3, 72, 40, "tn", "M4"), (37, 8, 53, "tt", "M4")])
def test_transposed_matmul_matches_torch_under_racecheck(M, N, K, layout, chip):
    """GEMV-sized problems stored transposed run the tiled GEMM (partial tiles, prime K) and match
    torch, with NaN and inf in A propagating to their rows only."""
    trans_A, trans_B = layout[0] == "t", layout[1] == "t"
    kernel = kernels.matmul(M, N, K, chip=chip, execution_backend="emulator", trans_A=trans_A, trans_B=trans_B)
    torch.manual_seed(M + N + K)
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    a[0, 1] = float("nan")
    if M > 2:
        a[2, 0] = float("inf")
    a_s = a.t().contiguous() if trans_A else a
    b_s = b.t().contiguous() if trans_B else b
    ref = (a.float() @ b.float()).half()
    out = racecheck(kernel, a_s, b_s, seeds=(0, 1))
    torch.testing.assert_close(out.float(), ref.float(), rtol=2e-3, atol=2e-3 * math.sqrt(K), equal_nan=True)


@pytest.mark.parametrize("M, N, K, layout, dtype, tile", [
    (67, 45, 53, "nt", "bfloat16", (64, 32, 32, 128)),  # MLX's small-device NT tile
    (77, 71, 41, "tn", "float32", (64, 64, 16, 64)),  # fp32: the model's tile (M above the small-side tile's 48)
    (70, 131, 45, "nn", "float16", (64, 64, 16, 64)),  # 16-bit NN on 2 simdgroups
])
def test_steel_tiles_match_torch_on_ragged_shapes_under_racecheck(M, N, K, layout, dtype, tile):
    """The plain-metal steel tiles (padded rows, one buffer per operand, two barriers per K step) on
    partial tiles in both directions and a K that is no multiple of block_k, under the race checker."""
    trans_A, trans_B = layout[0] == "t", layout[1] == "t"
    choice = matmul_config(M, N, K, dtype, chip="M3", trans_A=trans_A, trans_B=trans_B)
    assert (choice.route, choice.block_m, choice.block_n, choice.block_k, choice.threads) == (GEMM, *tile), choice.describe()
    kernel = compile_choice(choice, "emulator")
    a, b = _inputs(M, N, K, dtype, seed=M)
    a_s = a.t().contiguous() if trans_A else a
    b_s = b.t().contiguous() if trans_B else b
    out = racecheck(kernel, a_s, b_s, seeds=(0, 1))
    ref = (a.float() @ b.float()).to(TORCH[dtype]).float()
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * math.sqrt(K))


@pytest.mark.parametrize("M, N, K, layout, dtype, chip, tile", [
    (65, 130, 47, "nn", "float16", "M2 Max", (64, 64, 16, 64)),  # MLX: 64x64x16 on 4
    (70, 131, 45, "nn", "bfloat16", "M1 Pro", (64, 64, 16, 64)),  # MLX: 64x64x16 on 4
    (136, 200, 47, "tn", "bfloat16", "M3 Max", (64, 64, 16, 64)),  # MLX: 64x64x16 on 4
    (130, 260, 70, "nt", "float16", "M3", (64, 64, 16, 64)),  # MLX: 64x32x32 on 4; B (N, K) rows of 140 bytes, in 16-byte runs
    (70, 129, 47, "nn", "float32", "M1", (64, 64, 16, 64)),  # MLX: 64x64x16 on 4 (fp32: 101 registers, 6 threadgroups per core, both)
    (137, 200, 47, "tn", "bfloat16", "M2 Max", (64, 64, 16, 64)),  # A (K, M) rows of 274 bytes: copied in 16-byte runs
])
def test_tiles_the_model_picks_over_mlx_s_match_torch_under_racecheck(M, N, K, layout, dtype, chip, tile):
    """The steel tile the cost model ranks ahead of MLX's for the chip (issue 35 item 1: 64x64x16 on 2
    simdgroups, for every dtype and layout), ragged in M and N, K no multiple of block_k, no bank
    replayed (a transposed operand, and one at an odd pitch copied in 16-byte runs, too)."""
    trans_A, trans_B = layout[0] == "t", layout[1] == "t"
    choice = matmul_config(M, N, K, dtype, chip=chip, trans_A=trans_A, trans_B=trans_B)
    assert (choice.route, choice.block_m, choice.block_n, choice.block_k, choice.threads) == (GEMM, *tile), choice.describe()
    assert any("faster than MLX's tile" in r for r in choice.reasons), choice.describe()
    kernel = compile_choice(choice, "emulator")
    a, b = _inputs(M, N, K, dtype, seed=N)
    a_s = a.t().contiguous() if trans_A else a
    b_s = b.t().contiguous() if trans_B else b
    out = racecheck(kernel, a_s, b_s, seeds=(0,))
    ref = (a.float() @ b.float()).to(TORCH[dtype]).float()
    tol = 1e-4 if dtype == "float32" else 2e-2
    torch.testing.assert_close(out.float(), ref, rtol=tol, atol=tol * math.sqrt(K))
    assert counters(kernel, a_s, b_s).total["threadgroup_replays"] == 0
    if trans_A and M * 2 % 16:
        assert any("runs of 16 bytes" in r for r in choice.reasons), choice.describe()


def staged_counts(layout, M=64, N=128, K=64, dtype="float16"):
    """The plain-metal gemm route's kernel for `layout` ("nn", "nt": B stored (N, K), "tn": A stored
    (K, M)), its MSL, its output against torch and its counters."""
    choice = matmul_config(M, N, K, dtype, chip="M4")
    kernel = compile_choice(choice, "emulator", trans_A=layout == "tn", trans_B=layout == "nt")
    a, b = _inputs(M, N, K, dtype)
    a_s = a.t().contiguous() if layout == "tn" else a
    b_s = b.t().contiguous() if layout == "nt" else b
    ref = a.float() @ b.float()
    out = kernel(a_s, b_s)
    torch.testing.assert_close(out.float(), ref.to(TORCH[dtype]).float(), rtol=2e-3, atol=2e-3 * math.sqrt(K))
    return choice, kernel.get_kernel_source(), counters(kernel, a_s, b_s).total


def staged_model(choice, M, N, K, dtype="float16"):
    """(device load operations, tile K steps) of an aligned problem: per tile and K step, the A and
    B tiles once, in 16-byte loads."""
    tiles, steps = (M // choice.block_m) * (N // choice.block_n), K // choice.block_k
    loads = (choice.block_m + choice.block_n) * choice.block_k * TORCH[dtype].itemsize // 16
    return tiles * steps * loads, tiles * steps


def test_plain_metal_gemm_reads_each_tile_once_in_16_byte_loads():
    """The structure MLX's steel GEMM has (issue #21): device load operations per FLOP, no narrow
    loads, at most two barriers per K step (MLX's loop: one buffer per operand). The direct-global
    kernel this route used before read 6x the load operations (simdgroup_load from device memory, 4
    bytes per lane)."""
    choice, source, total = staged_counts("nn", K=128)
    loads, steps = staged_model(choice, 64, 128, 128)
    assert total["device_load_instructions"] == loads and total["narrow_device_loads"] == 0
    assert 0 < total["threadgroup_barriers"] <= 2 * steps
    assert "simdgroup_load(A_sg[0], (A +" not in source and "*(const device uint4*)(B + " in source


# ----------------------------------------------------------------------------- CLI


def test_lower_explain_prints_the_route_and_its_reasons(capsys):
    choice = matmul_config(16, 40, 2048, chip="M5 Max")  # the small-M tile among the ranked ones
    assert choice.route == SPLIT_K
    assert main(["lower", "--m", "16", "--n", "40", "--k", "2048", "--chip", "M5 Max", "--explain"]) == 0
    out = capsys.readouterr().out
    assert f"// {choice.summary()}" in out
    assert "//   because the cost model's first of 28 candidates the metal4 dispatch ships (direct-global tiles 16x128/4," in out
    assert f"{choice.block_m}x{choice.block_n} on {choice.simdgroups} simdgroups, {choice.splits} K slices, predicted" in out
    assert "main_kernel, main_kernel_1" in out  # the partial-products kernel and the reduction kernel
    assert main(["lower", "--m", "1", "--n", "64", "--k", "32", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "gemv small_m" in out and "because M=1 <= 8" in out


def test_run_auto_path_checks_each_route(capsys):
    for argv, route in ((["--m", "1", "--n", "40", "--k", "24"], "gemv"), (["--m", "16", "--n", "40", "--k", "1024", "--chip", "M4"], "split_k")):
        assert main(["run", *argv, "--backend", "emulator", "--explain"]) == 0
        out = capsys.readouterr().out
        assert f": {route}" in out and "OK" in out
