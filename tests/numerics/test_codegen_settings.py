"""Settings that change codegen (TILELANG_METAL_FRAGMENT_CT): the non-default value gives a different,
still correct kernel, and no cache or memo hands out a kernel lowered under the other value."""

import pytest
import tilelang
import torch
from gemm_support import assert_close, lower_source, operands

import tilelang_metal
from tilelang_metal import kernels as E

SHAPE = (100, 72, 64)  # partial tiles in M and N


def _kernel():
    return E.gemm_shared(*SHAPE, epilogue="bias", out_dtype="float32")


@pytest.fixture(scope="module")
def default_source():
    return lower_source(_kernel(), E.metal4_target())


def test_default_routes_the_fragment_accumulator_to_cooperative_tensors(default_source):
    assert "matmul2d" in default_source and "simdgroup_multiply_accumulate" not in default_source


def test_fragment_ct_off_gives_a_simdgroup_kernel_that_matches_torch(monkeypatch, metal4, default_source):
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "0")
    kernel = tilelang.compile(_kernel(), out_idx=[-1], target=metal4, execution_backend="emulator")
    source = kernel.get_kernel_source()
    assert "simdgroup_multiply_accumulate" in source and "matmul2d" not in source
    M, N, K = SHAPE
    a, b, ref = operands(M, N, K, "float16")
    bias = torch.randn(N)
    assert_close(kernel(a, b, bias), ref + bias, "float16", "float32", K, "FRAGMENT_CT=0 shared GEMM + bias")


def test_fragment_ct_is_part_of_the_kernel_cache_key(monkeypatch):
    from tilelang.cache.kernel_cache import KernelCache

    cache = KernelCache.__new__(KernelCache)
    func = _kernel()

    def key(target):
        return cache._generate_key(func, [-1], "emulator", args=(), target=target)

    monkeypatch.delenv("TILELANG_METAL_FRAGMENT_CT", raising=False)
    on_metal, on_cuda = key(E.metal4_target()), key("cuda")
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "0")
    off_metal, off_cuda = key(E.metal4_target()), key("cuda")
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "1")
    assert key(E.metal4_target()) == on_metal  # same setting, same key
    assert off_metal != on_metal
    assert off_cuda == on_cuda  # other backends' keys are untouched


def test_kernel_cache_never_serves_a_kernel_lowered_under_the_other_value(monkeypatch, tmp_path):
    from tilelang import env

    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "0")  # the suite runs with it off; this test needs it on
    was_enabled = env.is_cache_enabled()
    env.enable_cache()
    try:
        func, target = _kernel(), E.metal4_target()

        def compile_():
            return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="emulator")

        monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "1")
        on = compile_()
        assert compile_() is on  # the cache is really on
        monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "0")
        off = compile_()
        assert off is not on and "matmul2d" not in off.get_kernel_source()
        monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "1")
        assert compile_() is on
    finally:
        (env.enable_cache if was_enabled else env.disable_cache)()


def test_jit_memo_is_kept_per_setting_value(monkeypatch):
    @tilelang.jit(out_idx=[-1], target=E.metal4_target(), execution_backend="emulator")
    def gemm(M, N, K):
        return E.gemm_shared(M, N, K, epilogue="bias", out_dtype="float32")

    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "1")
    on = gemm(*SHAPE)
    assert "matmul2d" in on.get_kernel_source()
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "0")
    off = gemm(*SHAPE)
    assert off is not on and "simdgroup_multiply_accumulate" in off.get_kernel_source()
    assert gemm(*SHAPE) is off
    monkeypatch.setenv("TILELANG_METAL_FRAGMENT_CT", "1")
    assert gemm(*SHAPE) is on  # switching back returns the kernel compiled under that value
    assert tilelang_metal.active()
