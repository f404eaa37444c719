"""docs/performance.md's per-problem table is printed from a compare_mlx.csv by
`compare_mlx.py --doc-table`: each cell a per-FLOP ratio, or both counts where a ratio would hide
that one side has none."""

from __future__ import annotations

import csv

from bench_support import load_benchmark


def _rows() -> list[dict[str, str]]:
    plugin = {"problem": "p", "chip_class": "steel", "implementation": "plugin", "config": "gemm threadgroup-staged, 64x64x16 tile, 1 stage",
              "load_instructions": "50", "load_instructions_vs_mlx": "0.5", "device_transactions": "10", "device_transactions_vs_mlx": "1",
              "unique_device_load_bytes": "8", "unique_device_load_bytes_vs_mlx": "1", "threadgroup_replays": "7",
              "threadgroup_replays_vs_mlx": "inf", "memory_barriers": "0", "memory_barriers_vs_mlx": "0", "lockstep_barriers": "0",
              "lockstep_barriers_vs_mlx": "", "matrix_ops": "4", "matrix_ops_vs_mlx": "1", "registers_estimate": "89",
              "threadgroups_per_core": "9"}
    mlx = {"problem": "p", "chip_class": "steel", "implementation": "mlx", "config": "steel", "load_instructions": "100",
           "device_transactions": "10", "unique_device_load_bytes": "8", "threadgroup_replays": "0", "memory_barriers": "2048",
           "lockstep_barriers": "0", "matrix_ops": "4", "registers_estimate": "89", "threadgroups_per_core": "8"}
    return [plugin, mlx]


def test_doc_table_gives_ratios_and_both_counts_where_one_side_has_none():
    table = load_benchmark("compare_mlx").doc_table(_rows()).splitlines()
    assert len(table) == 3  # header, rule, the one plugin row
    cells = [c.strip() for c in table[2].strip("|").split("|")]
    assert cells == ["p", "steel", "gemm threadgroup-staged, 64x64x16", "0.5", "1", "1", "7 / 0", "0 / 2 048", "none", "1",
                     "89 vs 89", "9 vs 8"]


def test_doc_table_option_reads_the_csv(tmp_path, capsys):
    path = tmp_path / "compare_mlx.csv"
    rows = _rows()
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in rows for k in r}))
        writer.writeheader()
        writer.writerows(rows)
    assert load_benchmark("compare_mlx").main(["--out", str(tmp_path), "--doc-table", str(path)]) == 0
    assert "| p | steel | gemm threadgroup-staged, 64x64x16 | 0.5 |" in capsys.readouterr().out
