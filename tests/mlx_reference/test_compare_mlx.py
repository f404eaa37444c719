"""benchmark/compare_mlx.py --dry-run on a few problems: both implementations verified against torch,
one CSV row each, ratios on the plugin rows where both counted, and a failure is a row and exit 1."""

from __future__ import annotations

import csv
import importlib

import pytest
import torch

from bench_support import load_benchmark

from tilelang_metal.emulator.foreign import memory_counts_unavailable

PROBLEMS = "softmax-4096,row-sum-4096,decode-d128-4k"


def _rows(out) -> list[dict[str, str]]:
    with open(out / "compare_mlx.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_dry_run_verifies_both_implementations(mlx_include, tmp_path):
    compare = load_benchmark("compare_mlx")
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", PROBLEMS]) == 0
    rows = _rows(tmp_path)
    assert sorted((r["problem"], r["implementation"]) for r in rows) == sorted(
        (p, impl) for p in PROBLEMS.split(",") for impl in ("plugin", "mlx"))
    for r in rows:
        assert r["verified"] == "True" and float(r["max_rel_err"]) < 1e-2, r
        assert float(r["flops"]) > 0 and r["barriers"] not in ("", "n/a")
    plugin = {r["problem"]: r for r in rows if r["implementation"] == "plugin"}
    assert all(float(plugin[p]["device_load_ops"]) > 0 for p in plugin)  # the plugin's memory counters are there
    assert "| decode-d128-4k | steel | mlx | yes |" in (tmp_path / "compare_mlx.md").read_text()
    mlx = [r for r in rows if r["implementation"] == "mlx"]
    gpu_level = compare.GPU_LEVEL
    for r in plugin.values():  # the GPU-level columns, counted on every plugin row
        assert all(r[c] not in ("", "n/a") for c in gpu_level), r
        assert float(r["load_instructions"]) > 0 and float(r["device_transactions"]) > 0, r
    for r in rows:  # the occupancy estimates, on both sides (the plugin's from its records, MLX's per family)
        assert int(r["registers_estimate"]) > 2 and int(r["threadgroups_per_core"]) >= 1, r
    for r in plugin.values():
        mine = next(m for m in mlx if m["problem"] == r["problem"])
        assert float(r["registers_estimate_vs_mlx"]) == pytest.approx(int(r["registers_estimate"]) / int(mine["registers_estimate"]), rel=1e-2)
        assert float(r["threadgroups_per_core_vs_mlx"]) > 0, r
    assert "| registers_estimate | threadgroups_per_core |" in (tmp_path / "compare_mlx.md").read_text()
    if memory_counts_unavailable() is None:  # MLX's memory traffic traced (clang): every ratio computed
        assert all(float(r[c]) > 0 for r in mlx for c in ("device_bytes", "device_load_ops", "device_store_ops"))
        assert all(float(r[c]) > 0 for r in mlx for c in ("load_instructions", "device_transactions"))
        for r in plugin.values():
            assert float(r["device_load_ops_vs_mlx"]) > 0 and float(r["device_bytes_vs_mlx"]) > 0, r
            assert float(r["load_instructions_vs_mlx"]) > 0 and float(r["device_transactions_vs_mlx"]) > 0, r
    else:
        assert all(r["device_load_ops"] == "n/a" for r in mlx)
        assert all(r["device_load_ops_vs_mlx"] == "" for r in plugin.values())


def test_a_failing_implementation_is_a_row_and_the_exit_status(mlx_include, tmp_path, monkeypatch):
    compare = load_benchmark("compare_mlx")

    def broken(p, klass):
        raise RuntimeError("simulated lowering failure")

    monkeypatch.setitem(compare.PLUGIN, "softmax", broken)
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", "softmax-4096"]) == 1
    rows = {r["implementation"]: r for r in _rows(tmp_path)}
    assert rows["plugin"]["verified"] == "False" and "simulated lowering failure" in rows["plugin"]["config"]
    assert rows["mlx"]["verified"] == "True"


def test_mlx_steel_gemm_estimate_is_the_plugin_rule_on_the_same_tile():
    """The family estimate of MLX's steel GEMM counts what the plugin's plan estimate counts for the same
    tile on plain metal (8x8 simdgroup fragments, a shared path over 2x2 simdgroups, no staging): the
    same registers; and its threadgroup memory (padded tiles) is what limits occupancy when it is large."""
    from tilelang_metal.tuning.autotune import SHARED, GemmConfig
    from tilelang_metal.target.capabilities import capabilities_with
    from tilelang_metal.performance.register_budget import estimate_registers

    families = load_benchmark("mlx_registers")
    steel = families.steel_gemm(64, 64, 16, 2, 2, "float16")
    plugin = estimate_registers(GemmConfig(SHARED, 64, 64, 128, 16, 2), target=capabilities_with(()), staging=False)
    assert steel.registers == plugin.total
    assert steel.threadgroup_bytes == (64 * (16 + 8) + 16 * (64 + 8)) * 2 and steel.threads == 128
    fp32 = families.steel_gemm(64, 32, 32, 2, 2, "float32")  # MLX's fp32 tile: 13.5 KB of padded tiles, 41 registers
    assert fp32.threadgroup_bytes == (64 * 36 + 32 * 36) * 4 and fp32.registers == 16 + 12 + 11 + 2
    assert (fp32.occupancy().threadgroups, fp32.occupancy().limited_by) == (60 * 1024 // fp32.threadgroup_bytes, "threadgroup memory")


def test_dry_run_counts_quantized_products(mlx_include, tmp_path, monkeypatch):
    """The qmv and qmm rows at reduced sizes (same kernels and routes as the full problems: qmv_fast for
    1 x 512 x 1024, the unsplit affine_qmm_t for 64 x 128 x 64 against the plugin's tiled kernel from
    proxies), both sides verified; where MLX's traffic is traced, the vector kernel's device bytes per
    FLOP are at most MLX's and its load instructions at most 1.05x (issue #36: the quantized proof)."""
    compare = load_benchmark("compare_mlx")
    common = importlib.import_module("compare_common")  # the module compare_mlx imported (benchmark/ on sys.path)
    problems = (common.quantized_problem("qmv", 1, 512, 1024, 4), common.quantized_problem("qmm", 64, 128, 64, 4))
    monkeypatch.setattr(compare, "PROBLEMS", problems)
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", ",".join(p.name for p in problems)]) == 0
    rows = {(r["problem"].split("-")[0], r["implementation"]): r for r in _rows(tmp_path)}
    assert sorted(rows) == sorted((k, impl) for k in ("qmv", "qmm") for impl in ("plugin", "mlx"))
    assert rows["qmv", "mlx"]["config"].startswith("affine_qmv_fast") and rows["qmm", "mlx"]["config"].startswith("affine_qmm_t")
    for r in rows.values():
        assert r["verified"] == "True" and float(r["max_rel_err"]) < 1e-2, r
        assert int(r["registers_estimate"]) > 2 and int(r["threadgroups_per_core"]) >= 1, r
    assert float(rows["qmm", "plugin"]["matrix_ops"]) > 0 and float(rows["qmm", "mlx"]["barriers"]) > 0
    if memory_counts_unavailable() is None:
        qmv = rows["qmv", "plugin"]
        assert float(qmv["device_bytes_vs_mlx"]) <= 1 and float(qmv["load_instructions_vs_mlx"]) <= 1.05, qmv
        assert float(rows["qmm", "plugin"]["load_instructions_vs_mlx"]) > 0


@pytest.mark.slow  # 12 implementations verified and counted: about 30 s of CPU
def test_dry_run_counts_batched_and_bias_products(mlx_include, tmp_path, monkeypatch):
    """The batched and bias rows (issue 35 item 5) at a reduced size on both chip classes: the plugin's
    kernels.matmul with batch= / epilogue="bias" against MLX's GEMM with the batch on the grid's z
    axis / AddMM's output source, both verified against torch; a batch of 3 is counted from a proxy
    of 2 (each product the same work), so its counts are 3x the one-product row's. 40 x 48 fits one
    tile of every kernel on both sides (one proxy each)."""
    compare = load_benchmark("compare_mlx")
    common = importlib.import_module("compare_common")  # the module compare_mlx imported (benchmark/ on sys.path)
    problems = (common._gemm("gemm-one-40", 40, 48, 64), common._gemm("gemm-batch3-40", 40, 48, 64, batch=3),
                common._gemm("gemm-bias-40", 40, 48, 64, epilogue="bias"))
    monkeypatch.setattr(compare, "PROBLEMS", problems)
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", ",".join(p.name for p in problems)]) == 0
    rows = {(r["problem"], r["chip_class"], r["implementation"]): r for r in _rows(tmp_path)}
    assert len(rows) == 12 and all(r["verified"] == "True" for r in rows.values()), rows
    for klass in ("nax", "steel"):
        assert "batch 3 on the grid's z axis" in rows["gemm-batch3-40", klass, "mlx"]["config"]
        assert "addmm: the bias as output source" in rows["gemm-bias-40", klass, "mlx"]["config"]
        for impl in ("plugin", "mlx"):
            one, three = rows["gemm-one-40", klass, impl], rows["gemm-batch3-40", klass, impl]
            assert float(three["flops"]) == 3 * float(one["flops"])
            assert int(three["matrix_ops"]) == 3 * int(one["matrix_ops"]) > 0, (klass, impl)
            assert int(three["store_instructions"]) == 3 * int(one["store_instructions"]) > 0, (klass, impl)


def test_per_class_gemm_problem_shows_each_steel_tile():
    """The steel GEMM row per chip class (issue 35 item 5): on its problem MLX's host logic, given each
    M3 class's architecture, picks three different tiles (base and Pro 64x64 on 1x2 simdgroups, Max
    64x64 on 2x2, Ultra 32x64 on 1x2); the plugin's dispatch on that chip takes MLX's, except on the
    Max, where the cost model ranks the small class's 64x64 on 2 simdgroups (same device loads, more
    threadgroups per core) ahead (issue 35 item 1)."""
    import mlx_gemm as mg

    from tilelang_metal.kernels.matmul import matmul_config

    load_benchmark("compare_mlx")  # puts benchmark/ on sys.path
    common = importlib.import_module("compare_common")
    side = importlib.import_module("compare_mlx_side")
    (problem,) = [p for p in common.PROBLEMS if p.classes == common.STEEL_CLASSES]
    d = problem.dims
    tiles = {}
    for klass in common.STEEL_CLASSES:
        device = mg.Device(side.STEEL_DEVICE[klass])
        assert mg.route(d["M"], d["N"], d["K"], torch.float16, False, False, device) == "gemm"
        tiles[klass] = mg.gemm_tile(d["M"], d["N"], d["K"], torch.float16, False, False, device)
        choice = matmul_config(d["M"], d["N"], d["K"], problem.dtype, chip=common.CLASSES[klass][1], target="metal")
        bm, bn, bk, wm, wn = tiles[klass] if klass != "steel-max" else tiles["steel"]
        assert (choice.block_m, choice.block_n, choice.block_k, choice.threads) == (bm, bn, bk, 32 * wm * wn), klass
        assert any("faster than MLX's tile" in r for r in choice.reasons) == (klass == "steel-max"), choice.describe()
    assert tiles["steel"] == tiles["steel-pro"] == (64, 64, 16, 1, 2)
    assert tiles["steel-max"] == (64, 64, 16, 2, 2) and tiles["steel-ultra"] == (32, 64, 16, 1, 2)


@pytest.mark.slow  # 4 implementations on a 64x64x64 GEMM: about 20 s of CPU
def test_dry_run_counts_steel_gemm_per_chip_class(mlx_include, tmp_path, monkeypatch):
    """The Max and Ultra classes at a reduced size: MLX's kernel launched with the tile its host logic
    picks for that chip's architecture (Max: 2x2 simdgroups, the plugin's 128 threads; Ultra under
    2^20 outputs: 64x64 on 1x2), both verified, every ratio filled on the plugin rows, threadgroups per
    core at least MLX's."""
    compare = load_benchmark("compare_mlx")
    common = importlib.import_module("compare_common")
    problem = common._gemm("gemm-per-class-64", 64, 64, 64, classes=("steel-max", "steel-ultra"))
    monkeypatch.setattr(compare, "PROBLEMS", (problem,))
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", problem.name]) == 0
    rows = {(r["chip_class"], r["implementation"]): r for r in _rows(tmp_path)}
    assert sorted(rows) == sorted((k, i) for k in ("steel-max", "steel-ultra") for i in ("plugin", "mlx"))
    assert all(r["verified"] == "True" for r in rows.values()), rows
    assert rows["steel-max", "mlx"]["config"].startswith("steel_gemm_fused bm64 bn64 bk16 wm2 wn2 (M3 Max)")
    assert rows["steel-ultra", "mlx"]["config"].startswith("steel_gemm_fused bm64 bn64 bk16 wm1 wn2 (M3 Ultra)")
    # Max: the cost model's 64x64x16 on 2 simdgroups over MLX's 4 (issue 35 item 1); Ultra: MLX's tile
    assert "64 threads" in rows["steel-max", "plugin"]["config"] and "64 threads" in rows["steel-ultra", "plugin"]["config"]
    ratios = [f"{c}_vs_mlx" for c in ("barriers", "matrix_ops", "threadgroup_bytes", *compare.OCCUPANCY_COLUMNS)]
    if memory_counts_unavailable() is None:
        ratios += [f"{c}_vs_mlx" for c in ("device_bytes", "device_load_ops", "load_instructions", "device_transactions")]
    for klass in ("steel-max", "steel-ultra"):
        plugin = rows[klass, "plugin"]
        assert all(plugin[c] not in ("", "n/a") for c in ratios), plugin
        assert float(plugin["matrix_ops_vs_mlx"]) == 1.0, plugin  # the same 64x64 tile: the same matrix instructions
        assert float(plugin["threadgroups_per_core_vs_mlx"]) >= 1.0, plugin


@pytest.mark.slow  # a masked attention problem on both sides: about 20 s of CPU (two plugin kernels)
def test_dry_run_counts_masked_attention(mlx_include, tmp_path, monkeypatch):
    """A bool mask (issue 35 item 5) at a reduced size: the plugin's flash attention with mask="bool"
    against MLX's steel attention with has_mask, each checked against torch with the same mask (a
    kernel ignoring it is off by far more than the tolerance: checked here), every ratio filled."""
    import torch.nn.functional as F

    compare = load_benchmark("compare_mlx")
    common = importlib.import_module("compare_common")
    problem = common.Problem("attention-d64-mask-bool-256", "attention", ("steel",),
                             {"heads": 2, "seq": 256, "head_dim": 64, "causal": False, "mask": "bool", "dtype": "float16"})
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 1, 64, 64, generator=g) for _ in range(3))
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=common.attention_mask("bool", 64, "float16"))
    assert (masked - F.scaled_dot_product_attention(q, k, v)).abs().max() > 10 * common.TOLERANCE["float16"] * masked.abs().max()
    monkeypatch.setattr(compare, "PROBLEMS", (problem,))
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", problem.name]) == 0
    rows = {r["implementation"]: r for r in _rows(tmp_path)}
    assert all(r["verified"] == "True" and float(r["max_rel_err"]) < 1e-2 for r in rows.values()), rows
    assert rows["plugin"]["config"].endswith("bool mask") and "has_mask (bool mask)" in rows["mlx"]["config"]
    ratios = [f"{c}_vs_mlx" for c in ("barriers", "matrix_ops", "threadgroup_bytes", *compare.OCCUPANCY_COLUMNS)]
    if memory_counts_unavailable() is None:
        ratios += [f"{c}_vs_mlx" for c in ("device_bytes", "narrow_device_loads", "load_instructions", "device_transactions")]
    assert all(rows["plugin"][c] not in ("", "n/a") for c in ratios), rows["plugin"]
