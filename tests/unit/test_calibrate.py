"""benchmark/calibrate.py --dry-run: published GEMM throughput on real Macs against the cost model's
prediction from the same kernel's counts (docs/performance.md, "Cost model")."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmark"))

import calibrate  # noqa: E402


def test_dry_run_predicts_every_countable_row_within_the_tolerance(tmp_path):
    lines: list[str] = []
    assert calibrate.main(["--dry-run", "--out", str(tmp_path)], log=lines.append) == 0
    with (tmp_path / "calibration.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == calibrate.COLUMNS
    predicted = [r for r in rows if r["predicted_tflops"]]
    assert {r["implementation"] for r in rows if not r["predicted_tflops"]} == {calibrate.MPS}  # context only
    assert all(r["source"] for r in rows)
    # issue 33: the spec's M5 table plus published results on at least three other chips
    assert len({r["chip"].split(" (")[0] for r in predicted} - {"M5"}) >= 3
    for r in predicted:
        error = float(r["predicted_tflops"]) / float(r["published_tflops"]) - 1
        assert abs(error - float(r["model_error"])) < 1e-2
        assert abs(error) <= calibrate.TOLERANCE and not r["note"].startswith("outside"), r  # issue 33: every row within 25%
    assert lines[-1].startswith(f"wrote {tmp_path / 'calibration.csv'}")


def test_mlx_size_class_is_the_chips_architecture_letter():
    """MLX's dispatch reads the last letter of MTLDevice.architecture.name; the M1, M2, M4 and M5 Pro
    report 's' and the M3 Pro 'p' (roofline.ARCHITECTURES), not the base chip's 'g'."""
    from tilelang_metal.performance import roofline

    for chip in roofline.CHIPS.values():
        assert calibrate.mlx_size_class(chip) == roofline.ARCHITECTURES[chip.name].name[-1], chip.name
