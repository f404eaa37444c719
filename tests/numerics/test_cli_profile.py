"""`python -m tilelang_metal profile`: the emulator's counts of one launch, grouped by kind of
threadgroup, with a roofline estimate labelled as one."""

from __future__ import annotations

import re

from tilelang_metal.performance import cost_model, roofline
from tilelang_metal import kernels
from tilelang_metal.cli import main


def _profile(capsys, *argv):
    code = main(["profile", *argv])
    out, err = capsys.readouterr()
    assert code == 0, err
    total = {m[1]: int(m[2]) for m in re.finditer(r"^(\w+)\s+(\d+)$", out, re.M)}
    return out, total


def test_aligned_kernel_counts_and_estimate(capsys):
    """128x128x64 on the 64x128 direct-global tile (--path direct_global): 2 identical threadgroups, exactly
    M*N*K / (16*32*16) matmul2d runs, no threadgroup memory, no guards."""
    out, total = _profile(capsys, "--m", "128", "--n", "128", "--k", "64", "--chip", "M5", "--path", "direct_global")
    assert "GEMM on target metal4 (emulator)" in out  # M5: the metal4 key
    assert total["matmul2d_16x32x16"] == 128 * 128 * 64 // (16 * 32 * 16)
    assert total["threadgroup_store_bytes"] == 0 and total["predicated_device_loads"] == 0
    assert total["device_store_bytes"] == 128 * 128 * 2
    assert "// 2 threadgroups, 1 distinct per-threadgroup profile(s):" in out
    assert "//   2 like (0, 0, 0): " in out
    est = cost_model.roofline_estimate(total, roofline.chip("M5"))
    assert f"// ESTIMATE, not a measurement: {est.describe()}" in out


def test_auto_path_adds_the_cost_model_s_estimate_of_the_dispatch_s_kernel(capsys):
    """--path auto: the kernel matmul_config picks, and the cost model (tilelang_metal/performance/cost_model.py) of
    that kernel with the counted figures in place of its own."""
    out, total = _profile(capsys, "--m", "128", "--n", "128", "--k", "64", "--chip", "M5")
    chip = roofline.chip("M5")
    tiled = cost_model.estimate_choice(kernels.matmul_config(128, 128, 64, chip=chip), chip=chip)
    model = cost_model.estimate(cost_model.with_counted(tiled.counts, total), chip)
    assert model.counts.matrix_flops == 2 * 128 * 128 * 64
    assert f"// cost model ESTIMATE with these counts: {model.describe()}" in out


def test_chip_before_m5_profiles_the_kernel_that_chip_gets(capsys):
    """target="metal" on an M4 lowers without the metal4 key (the plugin's host policy): simdgroup
    matrices, no cooperative tensors; an explicit --target still wins."""
    out, total = _profile(capsys, "--m", "64", "--n", "128", "--k", "32", "--chip", "M4 Max")
    assert "GEMM on target metal (emulator)" in out
    assert total["matmul2d_16x32x16"] == 0 and total["simdgroup_multiply_accumulate_8x8x8"] == 64 * 128 * 32 // 512
    out, total = _profile(capsys, "--m", "64", "--n", "128", "--k", "32", "--chip", "M4 Max", "--target", "metal4")
    assert total["matmul2d_16x32x16"] == 64 * 128 * 32 // (16 * 32 * 16)


def test_ragged_kernel_shows_its_edge_threadgroups(capsys):
    out, total = _profile(capsys, "--m", "100", "--n", "200", "--k", "64", "--target", "metal", "--chip", "M2")
    assert total["simdgroup_multiply_accumulate_8x8x8"] > 0 and total["matmul2d_16x32x16"] == 0  # plain metal
    assert total["predicated_device_loads"] > 0
    choice = kernels.matmul_config(100, 200, 64, chip="M2", target="metal")  # the dispatch's tile: its grid
    grid = -(-100 // choice.block_m) * -(-200 // choice.block_n)
    kinds = re.search(rf"// {grid} threadgroups, (\d+) distinct", out)
    assert kinds and int(kinds[1]) >= 2, out
    assert "on M2 (3.6 TFLOP/s, 100 GB/s)" in out and "as stated by Apple" in out


def test_unknown_chip_is_one_line_usage_error(capsys):
    try:
        code = main(["profile", "--chip", "M9"])
    except SystemExit as exit_:
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2 and "invalid choice: 'M9'" in err and len(err.strip().splitlines()) == 1
