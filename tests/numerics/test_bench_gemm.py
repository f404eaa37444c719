"""benchmark/bench_gemm.py --dry-run: the whole harness at small sizes, the plugin in the emulator.

Checks the three files it writes, that every plugin row was verified against the fp32 reference,
that the GPU baselines are reported n/a (not silently dropped), and that a wrong plugin result
makes the run fail."""

from __future__ import annotations

import csv

import pytest
from bench_support import load_benchmark


@pytest.fixture(scope="module")
def bench_gemm():
    return load_benchmark("bench_gemm")


@pytest.fixture(scope="module")
def dry_run(bench_gemm, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench_gemm")
    code = bench_gemm.main(["--dry-run", "--out", str(out)])
    with open(out / "gemm.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return code, out, rows


@pytest.mark.slow  # the dry run (shared fixture) runs every dry shape in the emulator
def test_dry_run_writes_csv_markdown_and_png(dry_run, bench_gemm):
    code, out, rows = dry_run
    assert code == 0
    assert (out / "gemm.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "gemm.md").read_text()
    assert "EMULATOR DRY RUN" in md and "| group | M | N | K | layout | dtype | plugin |" in md
    labels = {bench_gemm.case_of(*c)["label"] for c in bench_gemm.DRY_CASES}
    assert {r["label"] for r in rows} == labels
    for shape, layout, dtype in bench_gemm.DRY_CASES:  # one Markdown line per problem
        assert f"| {shape.group} | {shape.m} | {shape.n} | {shape.k} | {layout} | {dtype} |" in md
    assert {r["group"] for r in rows} == {"square", "skinny", "ragged"}
    assert {r["layout"] for r in rows} == {"NN", "NT"} and {r["dtype"] for r in rows} == set(bench_gemm.DTYPES)


@pytest.mark.slow  # the dry run (shared fixture) runs every dry shape in the emulator
def test_every_plugin_row_is_verified_and_timed(dry_run, bench_gemm):
    _, _, rows = dry_run
    plugin = [r for r in rows if r["backend"] == "plugin"]
    assert len(plugin) == len(bench_gemm.DRY_CASES)
    for r in plugin:
        out_dtype = bench_gemm.DTYPES[r["dtype"]][1]
        assert r["status"] == "ok" and r["verified"] == "True", r
        assert 0 <= float(r["rel_err"]) <= bench_gemm.TOLERANCE[out_dtype], r
        assert int(r["trials"]) >= 5 and float(r["median_ms"]) > 0 and float(r["p90_ms"]) >= float(r["median_ms"])
        assert float(r["tflops"]) > 0 and float(r["pct_peak"]) > 0


@pytest.mark.slow  # the dry run (shared fixture) runs every dry shape in the emulator
def test_gpu_baselines_are_reported_not_available(dry_run):
    _, _, rows = dry_run
    others = [r for r in rows if r["backend"] != "plugin"]
    assert {r["backend"] for r in others} == {"torch-mps", "mlx", "in-tree"}
    assert all(r["status"] == "n/a" and r["note"] and not r["median_ms"] for r in others)


def test_a_wrong_plugin_result_fails_the_run(bench_gemm, tmp_path, monkeypatch):
    """The check is real: a plugin 'kernel' that returns 1.05 C + 1 is reported WRONG and the exit status is 1."""
    import torch

    def off_by_one(problem, args, *, dry_run):
        return lambda a, b: (problem.reference * 1.05 + 1).to(getattr(torch, problem.out_dtype))

    monkeypatch.setattr(bench_gemm, "plugin_kernel", off_by_one)
    code = bench_gemm.main(["--dry-run", "--out", str(tmp_path), "--groups", "skinny", "--backends", "plugin"])
    assert code == 1
    with open(tmp_path / "gemm.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows and all(r["status"] == "wrong" and r["verified"] == "False" for r in rows)
    assert "WRONG" in (tmp_path / "gemm.md").read_text()


def test_too_few_trials_is_a_usage_error(bench_gemm):
    with pytest.raises(SystemExit) as exc:
        bench_gemm.main(["--dry-run", "--trials", "3"])
    assert exc.value.code == 2
