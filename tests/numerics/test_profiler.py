"""TileLang's profiler on plugin kernels in the emulator: `assert_allclose` compares with a torch
reference on CPU tensors (and fails for a wrong one); `do_bench` returns CPU wall time and warns
once that it says nothing about GPU speed."""

from __future__ import annotations

import warnings

import pytest
import tilelang
import torch

from tilelang_metal import kernels as examples
from tilelang_metal.execution import profiling

M, N, K = 40, 48, 24  # tiles that do not divide M


@pytest.fixture(scope="module")
def kernel():
    func = examples.gemm_direct_global(M, N, K, 32, 32, dtype="float16", out_dtype="float32", threads=64)
    return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator")


def _reference(a, b):
    return a.float() @ b.float()


def test_profiler_supplies_cpu_inputs(kernel):
    inputs = kernel.get_profiler()._get_inputs()
    assert [tuple(t.shape) for t in inputs] == [(M, K), (K, N)]
    assert all(t.device.type == "cpu" and t.dtype == torch.float16 for t in inputs)


def test_assert_allclose_passes_for_the_right_reference(kernel):
    kernel.get_profiler().assert_allclose(_reference, atol=1e-2, rtol=1e-2)


def test_assert_allclose_fails_for_a_wrong_reference(kernel):
    profiler = kernel.get_profiler()
    with pytest.raises(AssertionError):
        profiler.assert_allclose(lambda a, b: _reference(a, b) + 0.5)
    with pytest.raises(AssertionError):  # transposed B: same shape, wrong product
        profiler.assert_allclose(lambda a, b: a.float() @ b.float().flip(0))


def test_do_bench_returns_positive_wall_time_and_warns_once(kernel, monkeypatch):
    monkeypatch.setattr(profiling.PluginProfiler, "_warned_about_emulator_timing", False)
    profiler = kernel.get_profiler()
    with pytest.warns(RuntimeWarning, match="says nothing about the kernel's speed on a GPU"):
        first = profiler.do_bench(n_warmup=1, n_repeat=2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = profiler.do_bench(n_warmup=1, n_repeat=2)
    assert isinstance(first, float) and first > 0
    assert isinstance(second, float) and second > 0


def test_do_bench_refuses_gpu_only_timing_backends(kernel):
    with pytest.raises(ValueError, match="backend='wall'"):
        kernel.get_profiler().do_bench(backend="cupti")


def test_deactivate_restores_tilelangs_profiler(kernel):
    import tilelang_metal
    from tilelang.profiler import Profiler

    tilelang_metal.deactivate()
    try:
        assert type(kernel.get_profiler()) is Profiler
    finally:
        tilelang_metal.activate()
    assert type(kernel.get_profiler()) is profiling.PluginProfiler
