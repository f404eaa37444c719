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
    assert {r["layout"] for r in rows} == set(bench_gemm.LAYOUTS) and {r["dtype"] for r in rows} == set(bench_gemm.DTYPES)


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


def test_in_tree_kernel_is_never_launched_on_shapes_its_tiles_do_not_divide(bench_gemm):
    """TileLang's in-tree kernel has no edge guards: on a ragged shape it would write past C."""
    args = bench_gemm._parser().parse_args(["--dry-run"])
    ragged = bench_gemm.Problem(bench_gemm.Shape("ragged", 100, 128, 64), "NN", "fp16", "cpu")
    why = bench_gemm.make_runner("in-tree", ragged, args)
    assert isinstance(why, str) and why.startswith("not launched: the in-tree kernel has no edge guards")
    aligned = bench_gemm.Problem(bench_gemm.Shape("square", 128, 128, 64), "NN", "fp16", "cpu")
    assert "no edge guards" not in bench_gemm.make_runner("in-tree", aligned, args)


@pytest.mark.parametrize("layout, dtype", [("TN", "fp16"), ("NN", "fp32")])
def test_tn_and_fp32_problems_match_their_reference(bench_gemm, layout, dtype):
    """The TN layout (A stored K x M) and fp32 inputs: a plugin kernel against the problem's fp32 reference."""
    args = bench_gemm._parser().parse_args(["--dry-run"])
    p = bench_gemm.Problem(bench_gemm.Shape("square", 64, 128, 48), layout, dtype, "cpu")
    assert p.a.shape == ((48, 64) if layout == "TN" else (64, 48))
    runner = bench_gemm.make_runner("plugin", p, args)
    out = runner.launch()
    assert bench_gemm.harness.relative_error(out, p.reference) <= bench_gemm.TOLERANCE[p.out_dtype]


def test_spec_runner_dry_run_verifies_and_writes_rows(tmp_path, capsys):
    """benchmark/matmul_metal/benchmark_matmul_metal.py (the spec's runner): one shape, the plugin's
    kernel checked against the fp32 reference, GPU backends n/a, the CSV written."""
    spec = load_benchmark("matmul_metal/benchmark_matmul_metal")
    assert spec.main(["--dry-run", "--m", "64", "--n", "128", "--k", "48", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "benchmark_matmul_metal.csv", newline="") as f:
        rows = {r["backend"]: r for r in csv.DictReader(f)}
    assert rows["tilelang"]["status"] == "ok" and float(rows["tilelang"]["rel_err"]) < 1e-2
    assert rows["torch-mps"]["status"] == rows["mlx"]["status"] == "n/a"
    assert "64 x 128 x 48" in capsys.readouterr().out
    assert spec.SPEC_SHAPES == ((4096, 4096, 4096), (2048, 2048, 2048), (4096, 2048, 4096), (2048, 4096, 4096))
