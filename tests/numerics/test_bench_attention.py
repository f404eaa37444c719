"""benchmark/bench_attention.py --dry-run: the plugin's flash-attention forward through the emulator,
checked against torch's SDPA in fp32; GPU baselines reported n/a; the output says timings mean nothing.

The harness itself is also tested with stand-in kernels (a correct one and a wrong one) that follow
the documented builder contract, so its verdicts are known to fail on a wrong kernel."""

from __future__ import annotations

import csv

import pytest
from bench_support import load_benchmark

from tilelang_metal import kernels as examples


@pytest.fixture(scope="module")
def bench_attention():
    return load_benchmark("bench_attention")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow  # the plugin's attention kernels in the emulator; the stand-in tests below stay quick
def test_dry_run_runs_the_plugin_kernel_in_the_emulator(bench_attention, tmp_path, capsys):
    code = bench_attention.main(["--dry-run", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert "timings mean nothing" in printed and "plugin / torch-mps = n/a" in printed
    rows = _rows(tmp_path / "attention.csv")
    plugin = [r for r in rows if r["backend"] == "plugin"]
    assert len(plugin) == len(bench_attention.DRY_SHAPES)
    assert all(r["status"] == "ok" and r["verified"] == "True" and float(r["median_ms"]) > 0 for r in plugin)
    assert (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG" and (tmp_path / "attention.md").exists()


def _stand_in(offset: float):
    """A builder with flash_attention_forward's signature whose 'kernel' computes attention with
    torch (plus `offset`), recording how it was called."""
    import torch

    calls = []

    def flash_attention_forward(batch, heads, seq_len, head_dim, causal=False, dtype="float16", block_m=64, block_n=64,
                                threads=128, target=None, execution_backend=None):
        calls.append({"execution_backend": execution_backend, "causal": causal, "dtype": dtype, "target": target})

        def kernel(q, k, v):
            assert q.shape == (batch, seq_len, heads, head_dim)
            o = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2).float() for x in (q, k, v)), is_causal=causal)
            return (o.transpose(1, 2) + offset).to(q.dtype)

        return kernel

    return flash_attention_forward, calls


def test_harness_verifies_and_reports_a_correct_stand_in(bench_attention, tmp_path, monkeypatch, capsys):
    builder, calls = _stand_in(0.0)
    monkeypatch.setattr(examples, "flash_attention_forward", builder, raising=False)
    code = bench_attention.main(["--dry-run", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert [c["causal"] for c in calls] == [s.causal for s in bench_attention.DRY_SHAPES]
    assert all(c["execution_backend"] == "emulator" and "metal4" in str(c["target"]) for c in calls)
    rows = _rows(tmp_path / "attention.csv")
    assert {r["backend"] for r in rows} == {"plugin", "torch-mps", "mlx"}
    assert all(r["status"] == ("ok" if r["backend"] == "plugin" else "n/a") for r in rows)
    assert all(int(r["trials"]) >= 5 for r in rows if r["backend"] == "plugin")
    assert "timings mean nothing" in printed and "TFLOP/s ratios" in printed
    assert (tmp_path / "attention.png").read_bytes()[:4] == b"\x89PNG"


def test_harness_fails_a_wrong_stand_in(bench_attention, tmp_path, monkeypatch):
    builder, _ = _stand_in(0.25)
    monkeypatch.setattr(examples, "flash_attention_forward", builder, raising=False)
    assert bench_attention.main(["--dry-run", "--out", str(tmp_path), "--backends", "plugin"]) == 1
    assert all(r["status"] == "wrong" for r in _rows(tmp_path / "attention.csv"))


def test_missing_plugin_kernel_is_reported_and_fails(bench_attention, tmp_path, monkeypatch):
    monkeypatch.delattr(examples, "flash_attention_forward", raising=False)
    assert bench_attention.main(["--dry-run", "--out", str(tmp_path), "--backends", "plugin"]) == 1
    rows = _rows(tmp_path / "attention.csv")
    assert all(r["status"] == "n/a" and "flash_attention_forward" in r["note"] for r in rows)


def test_causal_flops_are_half(bench_attention):
    full = bench_attention.Shape(2, 4, 256, 64, False)
    causal = bench_attention.Shape(2, 4, 256, 64, True)
    assert bench_attention.attention_flops(full) == 4 * 2 * 4 * 256 * 256 * 64
    assert bench_attention.attention_flops(causal) == bench_attention.attention_flops(full) / 2


# the kernel's own defaults (kernels/attention_config.attention_blocks), within the register budget
@pytest.mark.parametrize("target", ["metal4", "metal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_default_blocks_are_the_kernels_and_fit_the_budget(bench_attention, target, head_dim):
    from tilelang_metal.kernels.attention_config import attention_blocks, attention_dataflow, check_attention_config
    from tilelang_metal.performance.register_budget import REGISTER_BUDGET

    args = bench_attention._parser().parse_args(["--dry-run", "--target", target])
    shape = bench_attention.Shape(1, 1, 64, head_dim, False)
    dataflow = attention_dataflow(bench_attention.run_target(args))
    assert dataflow == ("direct" if target == "metal4" else "staged")
    blocks = attention_blocks(head_dim, dataflow=dataflow)
    assert bench_attention.blocks_for(shape, "float16", args) == (blocks.block_m, blocks.block_n)
    assert blocks.threads == args.threads and blocks.registers.total <= REGISTER_BUDGET.registers, blocks.describe()
    for full in bench_attention.FULL_SHAPES:  # every problem of the Mac run gets a configuration that fits
        check_attention_config(full.head_dim, *bench_attention.blocks_for(full, "float16", args), "float16", args.threads,
                               dataflow=dataflow)
