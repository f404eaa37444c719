"""`@tilelang.autotune` over plugin kernels with tilelang's caches as users run them: the autotuner's
per-function memo and its result cache (memory and disk, on with TILELANG_DISABLE_CACHE=0) must never
serve a kernel lowered under other lowering options (TILELANG_METAL_* settings, plugin pass configs),
and the plugin's execution backends (emulator, mlx, torch), whose kernels tilelang cannot serialize,
must not try to write them to disk."""

import logging
import os

import pytest
import tilelang
import tilelang.language as T
import torch

N = 96


def make_tuned_exp(plus: float = 1.0):
    """A fresh autotuned kernel family (its own memo): C = exp(A) + plus over blocks of 32 or 64."""

    @tilelang.autotune(configs=[{"block": 32}, {"block": 64}], warmup=1, rep=1)
    @tilelang.jit(out_idx=[-1], target="metal", execution_backend="emulator")
    def tuned_exp(block: int = 32):
        @T.prim_func
        def main(A: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
            with T.Kernel(T.ceildiv(N, block), threads=32) as b:
                for i in T.Parallel(block):
                    C[b * block + i] = T.exp(A[b * block + i]) + plus

        return main

    return tuned_exp


@pytest.fixture(params=["cache-off", "cache-on"])
def tilelang_cache(request, monkeypatch, tmp_path):
    from tilelang import env

    on = request.param == "cache-on"
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "0" if on else "1")
    monkeypatch.chdir(tmp_path)  # tilelang's autotuner writes autotuner.log into the working directory
    was_enabled = env.is_cache_enabled()
    (env.enable_cache if on else env.disable_cache)()
    try:
        yield tmp_path if on else None
    finally:
        (env.enable_cache if was_enabled else env.disable_cache)()


def is_precise(kernel) -> bool:
    return "precise::exp" in kernel.get_kernel_source()


def check(kernel, plus: float = 1.0):
    a = torch.randn(N, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(kernel(a), torch.exp(a) + plus, rtol=1e-6, atol=1e-6)


def test_autotune_never_serves_a_kernel_tuned_under_other_lowering_options(tilelang_cache, monkeypatch):
    tuned = make_tuned_exp()
    monkeypatch.delenv("TILELANG_METAL_PRECISE_MATH", raising=False)
    fast = tuned()
    assert not is_precise(fast)
    monkeypatch.setenv("TILELANG_METAL_PRECISE_MATH", "1")
    precise = tuned()
    assert precise is not fast and is_precise(precise)
    check(precise)
    again = make_tuned_exp()()  # a new memo, the same tuning key: tilelang's result cache (when on) must tell them apart
    assert is_precise(again)
    monkeypatch.delenv("TILELANG_METAL_PRECISE_MATH")
    assert tuned() is fast  # switching back returns the kernel tuned under those options
    assert not is_precise(make_tuned_exp()())


class Errors(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage() + (f" {record.exc_info[1]!r}" if record.exc_info else ""))


@pytest.mark.parametrize("tilelang_cache", ["cache-on"], indirect=True)
def test_autotune_results_of_plugin_backends_stay_in_memory(tilelang_cache):
    errors, tilelang_logger = Errors(), logging.getLogger("tilelang")  # tilelang's loggers do not propagate to the root
    tilelang_logger.addHandler(errors)
    try:
        kernel = make_tuned_exp(2.0)()  # a constant of its own: not in tilelang's result cache from another test
    finally:
        tilelang_logger.removeHandler(errors)
    check(kernel, 2.0)
    assert not errors.messages  # was: "Error during atomic autotune result save", the emulator adapter has no libpath
    written = [os.path.join(d, f) for d, _, files in os.walk(tilelang_cache) for f in files if "autotuner" in d]
    assert not written  # nothing tilelang could not load back
