"""benchmark/harness.py: ABBA interleaving, per-launch times, statistics, launch calibration."""

from __future__ import annotations

import pytest
from bench_support import load_benchmark

harness = load_benchmark("harness")


def _recording(names):
    calls = []
    runners = [harness.Runner(n, (lambda n=n: calls.append(n)), lambda: calls.append("sync")) for n in names]
    return runners, calls


def test_trials_run_abba_and_rotate_the_first_backend():
    runners, calls = _recording(["A", "B", "C"])
    times = harness.time_interleaved(runners, trials=2, launches=2, warmup=0)
    assert set(times) == {"A", "B", "C"} and all(len(v) == 2 for v in times.values())
    launches = [c for c in calls if c != "sync"]
    first, second = launches[:12], launches[12:]
    assert first == ["A", "A", "B", "B", "C", "C", "C", "C", "B", "B", "A", "A"]
    assert second == ["B", "B", "C", "C", "A", "A", "A", "A", "C", "C", "B", "B"]


def test_each_measurement_is_bracketed_by_device_syncs():
    runners, calls = _recording(["A"])
    harness.time_interleaved(runners, trials=1, launches=3, warmup=0)
    assert calls == ["sync"] + ["sync", "A", "A", "A", "sync"] * 2  # (the first: after warm-up)


def test_statistics_and_row_metrics():
    assert harness.percentile([3, 1, 2, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert harness.percentile([2.0], 90) == 2.0
    with pytest.raises(ValueError):
        harness.percentile([], 50)
    row = harness.record_times(harness.Row({"label": "x"}, "plugin", harness.OK, flops=2e12, peak_tflops=10.0), [1.0, 0.5, 2.0, 0.5, 0.5], 4)
    assert row.median_s == 0.5 and row.p90_s == pytest.approx(1.6) and row.trials == 5 and row.launches == 4
    assert row.tflops == pytest.approx(4.0) and row.pct_peak == pytest.approx(40.0)
    with pytest.raises(ValueError):
        harness.time_interleaved([], trials=0, launches=1)


def test_calibration_bounds_launches():
    runners, _ = _recording(["A"])
    assert harness.calibrate_launches(runners, 1e-12, 3, 50) == 3
    assert harness.calibrate_launches(runners, 1e6, 3, 50) == 50


def test_relative_error_flags_nan_and_shape_mismatch():
    import torch

    ref = torch.ones(2, 2)
    assert harness.relative_error(ref * 1.01, ref) == pytest.approx(0.01, rel=1e-4)
    assert harness.relative_error(torch.full((2, 2), float("nan")), ref) == float("inf")
    with pytest.raises(ValueError, match="shape"):
        harness.relative_error(torch.ones(2, 3), ref)


def _case(outputs):
    """measure_case over backends 'good' (right answer) and 'bad' (wrong answer); counts launches."""
    launched = {"good": 0, "bad": 0}

    def make_runner(backend):
        def launch():
            launched[backend] += 1
            return outputs[backend]

        return harness.Runner(backend, launch)

    rows = harness.measure_case(
        {"label": "p"}, ["good", "bad"], 1e9, None, make_runner, lambda b, out: (abs(out - 1.0), 1e-3, ""),
        dry_run=True, trials=5, target_ms=1.0, max_launches=3,
    )
    return {r.backend: r for r in rows}, launched


def test_a_wrong_result_is_reported_and_never_launched_again():
    rows, launched = _case({"good": 1.0, "bad": 2.0})
    assert rows["good"].status == harness.OK and rows["good"].median_s is not None
    assert rows["bad"].status == harness.WRONG and rows["bad"].median_s is None and "not timed" in rows["bad"].note
    assert launched["bad"] == 1 and launched["good"] > 1  # the check launch only


def test_progress_csv_holds_the_rows_so_far(tmp_path):
    rows, _ = _case({"good": 1.0, "bad": 2.0})
    path = harness.write_progress(list(rows.values()), tmp_path / "out", "gemm")
    text = path.read_text().splitlines()
    assert len(text) == 3 and text[1].split(",")[1:3] == ["good", "ok"] and text[2].split(",")[1:3] == ["bad", "wrong"]


def test_missing_matplotlib_skips_the_chart_with_one_line(tmp_path, monkeypatch, capsys):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ModuleNotFoundError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    rows, _ = _case({"good": 1.0, "bad": 1.0})
    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    files = harness.write_all(list(rows.values()), {}, tmp_path, "gemm", title="t", backends=["good", "bad"],
                              case_columns=[], ratio_of="good", ratio_to=["bad"], peak_tflops=None)
    assert set(files) == {"csv", "md"} and files["md"].exists()
    err = capsys.readouterr().err.strip()
    assert err.startswith("chart skipped:") and "matplotlib" in err and "\n" not in err
