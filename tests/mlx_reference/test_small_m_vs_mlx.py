"""A small M above the GEMV's 8 against MLX (issue 35 item 2), through compare_mlx.py's own
machinery at a reduced size: M = 33, where MLX's steel split-K pads to three 16-row tiles and the
plugin's small-M tile to one of 48 (the 64-row chip tile made 1.33x MLX's matrix operations)."""

from __future__ import annotations

import csv
import importlib

from bench_support import load_benchmark


def test_small_m_matrix_operations_per_flop_at_most_mlx(mlx_include, tmp_path, monkeypatch):
    compare = load_benchmark("compare_mlx")
    common = importlib.import_module("compare_common")  # the module compare_mlx imported (benchmark/ on sys.path)
    problem = common._gemm("gemm-nn-fp16-small-m33", 33, 128, 512)
    monkeypatch.setattr(compare, "PROBLEMS", (problem,))
    assert compare.main(["--dry-run", "--out", str(tmp_path), "--only", problem.name, "--classes", "steel"]) == 0
    with open(tmp_path / "compare_mlx.csv", newline="") as f:
        rows = {r["implementation"]: r for r in csv.DictReader(f)}
    assert rows["mlx"]["config"].startswith("steel_gemm_splitk bm16"), rows["mlx"]
    assert "48x64x16 tile" in rows["plugin"]["config"], rows["plugin"]
    assert all(r["verified"] == "True" for r in rows.values()), rows
    assert float(rows["plugin"]["matrix_ops_vs_mlx"]) <= 1.1, rows["plugin"]
