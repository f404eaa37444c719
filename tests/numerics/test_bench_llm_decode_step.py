"""benchmark/llm_decode_step.py --dry-run: one decoder layer for one token from the plugin's kernels
(rms_norm, 4-bit quantized_matmul, rope, flash decoding, the script's elementwise kernels) in the
emulator, against the float32 torch reference; the device bytes per token against the floor; a wrong
layer fails the run; off a Mac the timed run exits 2. The layer's kernels compile once (module fixture)."""

from __future__ import annotations

import re
import sys

import pytest
from bench_support import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("llm_decode_step")


@pytest.fixture(scope="module")
def plugin(bench):
    return bench.PluginLayer(bench.DRY, "metal", "emulator")


@pytest.mark.slow  # the layer's 9 kernels, each also in the counting flavour: ~20 emulator builds cold (ci/run runs the script too)
def test_dry_run_matches_the_reference_and_reports_bytes_per_token(bench, plugin, capsys):
    code = bench.dry_run(plugin)
    printed = capsys.readouterr().out
    assert code == 0, printed
    error = float(re.search(r"max error \|out - ref\| / max \|ref\| = (\S+)", printed).group(1))
    assert error <= bench.TOLERANCE, printed
    m = re.search(r"device bytes per token \((\d+) launches\): device_load_bytes (\d+) .*unique_device_load_bytes (\d+) "
                  r".*floor (\d+) = weights (\d+) \(packed \+ scales \+ biases\) \+ KV cache read (\d+)", printed)
    assert m, printed
    launches, loads, unique, floor, weights, cache = map(int, m.groups())
    d = bench.DRY
    # qkv, o, gate_up, down: packed 4-bit words + a float16 scale and bias per group of 64, as laid out
    projections = ((d.q_width + 2 * d.kv_width, d.hidden), (d.hidden, d.q_width), (2 * d.intermediate, d.hidden),
                   (d.hidden, d.intermediate))
    assert weights == sum(n * k * bench.BITS // 8 + 2 * 2 * n * k // bench.GROUP_SIZE for n, k in projections)
    assert cache == 2 * d.context * d.kv_width * 2 and floor == weights + cache
    assert launches == 11 and floor <= unique <= loads  # every weight and cache byte is read at least once


@pytest.mark.slow  # shares the compiled layer with the test above
def test_a_wrong_layer_fails_the_dry_run(bench, plugin, monkeypatch, capsys):
    right = bench.reference_step
    monkeypatch.setattr(bench, "reference_step", lambda layer: right(layer) * 1.1)
    assert bench.dry_run(plugin) == 1
    assert "does not match the float32 reference" in capsys.readouterr().err


@pytest.mark.skipif(sys.platform == "darwin", reason="on a Mac the timed run runs")
def test_timed_run_needs_a_mac(bench, capsys):
    assert bench.main([]) == 2
    assert bench.NEEDS_A_MAC in capsys.readouterr().err


def test_mlx_layer_of_the_timed_run_matches_the_reference(bench):
    """The timed run's MLX layer (on MLX's CPU here) against the same float32 reference: its rope, cache
    layout, GQA attention and quantized weights agree with the plugin's layer."""
    mx = pytest.importorskip("mlx.core", reason="MLX's CPU build runs the timed run's MLX layer")
    import numpy as np
    import torch

    layer = bench.Layer(bench.DRY, "cpu")
    expected = bench.reference_step(layer)
    out = torch.from_numpy(np.array(bench.mlx_step(layer, mx)().astype(mx.float32)))
    assert bench.harness.relative_error(out, expected) <= bench.TOLERANCE
