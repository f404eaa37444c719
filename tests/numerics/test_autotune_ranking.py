"""Ranking GEMM configurations without a GPU (tilelang_metal.tuning.autotune.rank_by_roofline: emulator counters
and the roofline estimate), and tilelang.autotune driving the space end to end in the emulator."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal.tuning import autotune
from tilelang_metal.performance import cost_model, roofline
from tilelang_metal.tuning.autotune import DIRECT_GLOBAL, SHARED, GemmConfig

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


def test_ranking_is_ordered_by_the_model_estimate_from_the_counts(ranked):
    chip, ranking = ranked
    assert {r.config for r in ranking} == set(CANDIDATES) and len(ranking) == len(CANDIDATES)
    times = [r.model.seconds for r in ranking]
    assert times == sorted(times)
    for r in ranking:  # both estimates are the documented functions of the counts and the tiling, nothing else
        again = cost_model.roofline_estimate(r.counts, chip)
        assert again.seconds == r.estimate.seconds and r.estimate.chip is chip
        traffic = autotune.traffic_model(r.config, M, N, K, chip=chip)
        assert cost_model.estimate(cost_model.with_counted(traffic, r.counts), chip) == r.model


def test_the_traffic_model_counts_what_the_emulator_counts(ranked):
    """Aligned tiles: the model's core loads are the emulator's device load bytes, its matrix work the
    counted FLOPs, so `rank_by_model` (no kernel run) and `rank_by_roofline` see the same kernels."""
    chip, ranking = ranked
    for r in ranking:
        traffic = autotune.traffic_model(r.config, M, N, K, chip=chip)
        assert traffic.core_load_bytes == r.counts["device_load_bytes"]
        assert traffic.matrix_flops == r.estimate.matrix_flops
        assert traffic.dram_bytes == (M * K + K * N) * 2 + M * N * 2  # the whole grid is one wave: each panel read once


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


def test_small_tiles_reread_more_but_spread_over_more_cores(ranked):
    chip, ranking = ranked
    by_config = {r.config: r for r in ranking}
    small, large = by_config[CANDIDATES[0]], by_config[CANDIDATES[1]]
    # each 32x32 tile re-reads its A rows and B columns twice as often as a 64x64 tile
    assert small.counts["device_load_bytes"] > large.counts["device_load_bytes"]
    assert small.estimate.bound == "memory" and small.estimate.seconds > large.estimate.seconds  # cache-blind
    assert small.issue_slots > large.issue_slots
    # with the caches the grid is one wave and reads each panel once; 16 small tiles then spread over
    # more cores than 4 large ones, so the busiest core does half the work, but their simdgroups read
    # twice the device fragment rows per matrix FLOP through L1 (one pass per cache line): that is their
    # bound; on M4 it is still below the large tile's compute (the small tiles go first), on M5, with
    # 4x the matrix rate, above it (last)
    assert small.model.counts.dram_bytes == large.model.counts.dram_bytes
    assert 2 * small.model.counts.busiest_core_flops == large.model.counts.busiest_core_flops
    assert small.model.bound == "on-core traffic"
    if chip.name == "M4":
        assert ranking[0].config == CANDIDATES[0] and large.model.bound == "compute"
    else:
        assert ranking[-1].config == CANDIDATES[0]
    staged = by_config[CANDIDATES[2]]
    assert staged.counts["threadgroup_store_bytes"] > 0 and large.counts["threadgroup_store_bytes"] == 0


def test_tilelang_autotune_picks_a_checked_configuration_in_the_emulator(tmp_path, monkeypatch):
    """The space plugs into tilelang.autotune (the Mac path; here timed on the CPU, which only proves
    the wiring): the returned kernel is one of the candidates and computes the GEMM."""
    from tilelang_metal.execution import profiling

    monkeypatch.chdir(tmp_path)  # tilelang's autotuner writes autotuner.log into the working directory
    # the warning comes once per process: an earlier test's autotune in this process must not hide it
    monkeypatch.setattr(profiling.PluginProfiler, "_warned_about_emulator_timing", False)
    space = [GemmConfig(DIRECT_GLOBAL, 32, 32, 128), GemmConfig(SHARED, 32, 32, 128, 32, 0)]
    with pytest.warns(RuntimeWarning, match="CPU wall time"):
        kernel = autotune.autotune_gemm(64, 64, 32, space=space, target=autotune.target_for(roofline.chip("M5")),
                                        execution_backend="emulator", warmup=1, rep=2)
    assert kernel.config in [c.as_kwargs() for c in space]
    torch.manual_seed(0)
    a, b = torch.randn(64, 32).half(), torch.randn(32, 64).half()
    torch.testing.assert_close(kernel(a, b).float(), a.float() @ b.float(), rtol=1e-2, atol=1e-2)


def test_top_times_only_the_model_s_shortlist(tmp_path, monkeypatch):
    """`top=N` tunes the model's first N configurations for the given chip (on a Mac: its own)."""
    from tilelang_metal.execution import profiling

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(profiling.PluginProfiler, "_warned_about_emulator_timing", False)
    chip = roofline.chip("M5")
    target = autotune.target_for(chip)
    listed = autotune.shortlist(64, 64, 32, 2, chip=chip, target=target)
    ranked = autotune.rank_by_model(autotune.config_space(64, 64, 32, target=target), 64, 64, 32, chip=chip, target=target)
    assert listed == [r.config for r in ranked[:2]]
    with pytest.warns(RuntimeWarning, match="CPU wall time"):
        kernel = autotune.autotune_gemm(64, 64, 32, top=2, chip=chip, target=target, execution_backend="emulator", warmup=1, rep=2)
    assert kernel.config in [c.as_kwargs() for c in listed]


def test_shortlist_refusals():
    with pytest.raises(ValueError, match="takes space= or top=, not both"):
        autotune.autotune_gemm(64, 64, 32, space=[GemmConfig(DIRECT_GLOBAL, 32, 32, 128)], top=2, execution_backend="emulator")
    with pytest.raises(ValueError, match="count=0 must be at least 1"):
        autotune.shortlist(64, 64, 32, 0, chip=roofline.chip("M4"))
    if roofline.detect_chip() is None:  # Linux, or a Mac the chip table does not know
        with pytest.raises(ValueError, match=r"pass chip=roofline.chip\('M4 Pro'\)"):
            autotune.shortlist(64, 64, 32, 4)


def test_an_empty_space_is_a_clear_error():
    with pytest.raises(ValueError, match="no configuration of the space fits"):
        autotune.autotune_gemm(64, 64, 32, space=[], execution_backend="emulator")
