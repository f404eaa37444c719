"""compare_mlx.py judges issue 35's count bounds on every plugin row it compares with MLX's, and with
--check-bounds (CI's dry run over the problem set) its exit status fails on a row that misses one."""

from __future__ import annotations

import pytest

from bench_support import load_benchmark

compare = load_benchmark("compare_mlx")


def _row(problem: str, klass: str = "steel", **ratios: str) -> dict[str, object]:
    row: dict[str, object] = {"problem": problem, "chip_class": klass, "implementation": "plugin", "config": "k", "verified": True,
                              "registers_estimate": 96, "threadgroups_per_core_vs_mlx": "1"}
    for column in ("load_instructions", "device_transactions", "threadgroup_replays", "matrix_ops", "threadgroup_bytes",
                   "memory_barriers"):
        row[f"{column}_vs_mlx"] = "0.5"
    row.update({f"{k}_vs_mlx" if k != "registers_estimate" else k: v for k, v in ratios.items()})
    return row


def test_rows_within_the_bounds_pass():
    rows = [_row("gemm-nt-fp16-4096"), _row("gemm-nn-fp16-skinny-m16", threadgroup_replays=""), _row("attention-d128-4k"),
            _row("gemm-nn-fp16-4096", "nax", load_instructions="4.8")]  # metal4 GEMM: no steel bound
    assert compare.count_bounds_missed(rows) == []


@pytest.mark.parametrize("problem, change, named", [
    ("gemm-nt-fp16-4096", {"load_instructions": "1.2"}, "load_instructions per FLOP"),
    ("gemm-nn-fp32-4096", {"device_transactions": "1.01"}, "device_transactions per FLOP"),
    ("gemm-nn-fp16-ragged-4000", {"threadgroup_replays": "inf"}, "threadgroup_replays per FLOP"),
    ("gemm-nn-fp16-4096", {"threadgroups_per_core": "0.75"}, "threadgroups per core"),
    ("gemm-nn-fp16-skinny-m16", {"matrix_ops": "4"}, "matrix operations"),
    ("gemm-nn-fp16-batch8-1024", {"matrix_ops": "1.2"}, "matrix operations"),
    ("attention-d128-4k", {"registers_estimate": 140}, "registers within the budget of 128"),
    ("attention-d64-4k", {"memory_barriers": "1.5"}, "memory_barriers per FLOP"),
    ("attention-d64-mask-bool-4k", {"threadgroup_bytes": "1.1"}, "threadgroup_bytes per FLOP"),
])
def test_a_row_over_a_bound_is_named(problem, change, named):
    missed = compare.count_bounds_missed([_row(problem, **change)])
    assert len(missed) == 1 and missed[0].startswith(f"{problem} [steel]: ") and named in missed[0], missed


def test_a_missed_bound_is_the_exit_status_with_check_bounds(monkeypatch, tmp_path, capsys):
    """CI's run (--check-bounds) fails on a miss; without it (reduced problems in tests) the miss is printed."""
    rows = [_row("gemm-nt-fp16-4096", load_instructions="1.5")]
    monkeypatch.setattr(compare, "run", lambda problems, classes, out: rows)
    args = ["--out", str(tmp_path), "--dry-run", "--only", "gemm-nt-fp16-4096", "--classes", "steel"]
    assert compare.main([*args, "--check-bounds"]) == 1
    assert "COUNT BOUND MISSED: gemm-nt-fp16-4096 [steel]: load_instructions" in capsys.readouterr().err
    assert compare.main(args) == 0
    assert "COUNT BOUND MISSED" in capsys.readouterr().err
    rows[0]["load_instructions_vs_mlx"] = "0.5"
    assert compare.main([*args, "--check-bounds"]) == 0
