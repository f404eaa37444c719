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
    assert {r["group"] for r in rows} == set(bench_gemm.GROUPS)
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


def test_fused_problem_is_bias_gelu_and_a_wrong_epilogue_fails(bench_gemm, monkeypatch):
    """The fused problem's reference is gelu_tanh(A @ B + bias); the plugin's one-kernel version meets
    it, and a kernel that forgets the bias is caught (the check reads the epilogue, not only A @ B)."""
    import torch

    args = bench_gemm._parser().parse_args(["--dry-run"])
    p = bench_gemm.Problem(bench_gemm.Shape("fused", 64, 128, 32), "NN", "fp16", "cpu")
    expected = torch.nn.functional.gelu(p.a.float() @ p.b.float() + p.bias, approximate="tanh")
    assert torch.allclose(p.reference, expected)
    out = bench_gemm.make_runner("plugin", p, args).launch()
    assert bench_gemm.harness.relative_error(out, p.reference) <= bench_gemm.TOLERANCE[p.out_dtype]
    no_bias = torch.nn.functional.gelu(p.a.float() @ p.b.float(), approximate="tanh").half()
    assert bench_gemm.harness.relative_error(no_bias, p.reference) > bench_gemm.TOLERANCE[p.out_dtype]
    assert "in-tree" in bench_gemm.make_runner("in-tree", p, args)
    full = bench_gemm.selected_cases(bench_gemm._parser().parse_args(["--out", "x"]))
    assert {(lay, dt) for s, lay, dt in full if s.group == "fused"} == {("NN", "fp16"), ("NN", "bf16")}


def test_metal4_status_line_names_what_is_missing(bench_gemm, monkeypatch):
    """The one-line MSL 4.0 check of the benchmarks' environment: the launch-time checks' reasons."""
    from tilelang_metal.execution import metal4_launch

    assert "dry run" in bench_gemm.harness.metal4_status(dry_run=True)
    facts = {"torch": metal4_launch.RuntimeFacts("15.5", "torch", "2.10.0"), "mlx": metal4_launch.RuntimeFacts("15.5", "mlx", "0.32.4")}
    monkeypatch.setattr(metal4_launch, "current", lambda runtime: facts[runtime])
    line = bench_gemm.harness.metal4_status(dry_run=False)
    assert "torch: no, macOS 15.5 has no MSL 4.0" in line and "torch>=2.11" in line and "mlx: no, macOS 15.5" in line
    facts.update(torch=metal4_launch.RuntimeFacts("26.1", "torch", "2.11.0"), mlx=metal4_launch.RuntimeFacts("26.1", "mlx", "0.32.4"))
    assert bench_gemm.harness.metal4_status(dry_run=False) == "torch: yes; mlx: yes"


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
