"""Ranking GEMM configurations without a GPU (tilelang_metal.autotune.rank_by_roofline: emulator counters
and the roofline estimate), and tilelang.autotune driving the space end to end in the emulator."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal import autotune, roofline
from tilelang_metal.autotune import DIRECT_GLOBAL, SHARED, GemmConfig

M, N, K = 128, 128, 64
CANDIDATES = (
    GemmConfig(DIRECT_GLOBAL, 32, 32, 128),
    GemmConfig(DIRECT_GLOBAL, 64, 64, 128),
    GemmConfig(SHARED, 64, 64, 128, 32, 0),
)


@pytest.fixture(scope="module", params=["M5", "M4"])
def ranked(request):
    chip = roofline.chip(request.param)
    return chip, autotune.rank_by_roofline(CANDIDATES, M, N, K, chip=chip)


def test_ranking_is_ordered_by_the_estimate_from_the_counts(ranked):
    chip, ranking = ranked
    assert {r.config for r in ranking} == set(CANDIDATES) and len(ranking) == len(CANDIDATES)
    times = [r.estimate.seconds for r in ranking]
    assert times == sorted(times)
    for r in ranking:  # the estimate is the documented function of the counts, nothing else
        again = roofline.estimate(r.counts, chip)
        assert again.seconds == r.estimate.seconds and r.estimate.chip is chip


def test_every_candidate_does_exactly_the_gemm_s_matrix_work(ranked):
    """Aligned tiles: the matrix operations counted are exactly 2*M*N*K FLOPs, whichever instruction
    did them: M4's target has no cooperative tensors (simdgroup 8x8 MMA only), M5's runs matmul2d
    where a simdgroup's share of the tile holds 16x32 fragments (not for 32x32 over 4 simdgroups)."""
    chip, ranking = ranked
    for r in ranking:
        assert r.estimate.matrix_flops == 2 * M * N * K
    matmul2d = {r.config: r.counts["matmul2d_16x32x16"] for r in ranking}
    if chip.name == "M4":
        assert not any(matmul2d.values())
    else:
        assert matmul2d[CANDIDATES[0]] == 0 and matmul2d[CANDIDATES[1]] == matmul2d[CANDIDATES[2]] == M * N * K // (16 * 32 * 16)


def test_small_tiles_reread_more_and_rank_last(ranked):
    _, ranking = ranked
    by_config = {r.config: r for r in ranking}
    small, large = by_config[CANDIDATES[0]], by_config[CANDIDATES[1]]
    # each 32x32 tile re-reads its A rows and B columns twice as often as a 64x64 tile
    assert small.counts["device_load_bytes"] > large.counts["device_load_bytes"]
    assert small.estimate.bound == "memory" and ranking[-1].config == CANDIDATES[0]
    assert small.issue_slots > large.issue_slots
    staged = by_config[CANDIDATES[2]]
    assert staged.counts["threadgroup_store_bytes"] > 0 and large.counts["threadgroup_store_bytes"] == 0


def test_tilelang_autotune_picks_a_checked_configuration_in_the_emulator(tmp_path, monkeypatch):
    """The space plugs into tilelang.autotune (the Mac path; here timed on the CPU, which only proves
    the wiring): the returned kernel is one of the candidates and computes the GEMM."""
    monkeypatch.chdir(tmp_path)  # tilelang's autotuner writes autotuner.log into the working directory
    space = [GemmConfig(DIRECT_GLOBAL, 32, 32, 128), GemmConfig(SHARED, 32, 32, 128, 32, 0)]
    with pytest.warns(RuntimeWarning, match="CPU wall time"):
        kernel = autotune.autotune_gemm(64, 64, 32, space=space, target=autotune.target_for(roofline.chip("M5")),
                                        execution_backend="emulator", warmup=1, rep=2)
    assert kernel.config in [c.as_kwargs() for c in space]
    torch.manual_seed(0)
    a, b = torch.randn(64, 32).half(), torch.randn(32, 64).half()
    torch.testing.assert_close(kernel(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)


def test_an_empty_space_is_a_clear_error():
    with pytest.raises(ValueError, match="no configuration of the space fits"):
        autotune.autotune_gemm(64, 64, 32, space=[], execution_backend="emulator")
