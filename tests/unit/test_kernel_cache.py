"""The kernel cache key carries the plugin's identity: an in-tree artifact is never served to the
plugin (or the other way round), with tilelang's cache enabled."""

import types

import tilelang
import torch
from tilelang import env

import tilelang_metal
from tilelang_metal import kernels as E
from tilelang_metal.execution import backends


def _compile_torch_backend(func, target):
    # tilelang's cache turns itself off after a torch-backend compile: switch it back on each time
    env.enable_cache()
    return tilelang.compile(func, out_idx=[-1], target=target, execution_backend="torch")


def test_metal_keys_carry_the_plugin_identity_only_while_active():
    from tilelang.cache.kernel_cache import KernelCache

    cache = object.__new__(KernelCache)  # not KernelCache(): that would become tilelang's singleton
    func = E.gemm_direct_global(128, 128, 64)

    def key(target):
        return cache._generate_key(func, [-1], "emulator", args=(), target=target)

    metal_active, cuda_active = key(E.metal4_target()), key("cuda")
    tilelang_metal.deactivate()
    try:
        metal_in_tree, cuda_in_tree = key(E.metal4_target()), key("cuda")
    finally:
        tilelang_metal.activate()
    assert metal_active != metal_in_tree
    assert cuda_active == cuda_in_tree  # other backends' keys are untouched


def test_cache_never_crosses_backends(monkeypatch, tmp_path):
    monkeypatch.setenv("TILELANG_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TILELANG_DISABLE_CACHE", "0")  # the suite runs with it off; this test needs it on
    monkeypatch.setattr(backends, "mps_available", lambda: True)  # let the plugin declare torch here
    # the torch adapter compiles the shader when it is built; on Linux hand it an inert library
    monkeypatch.setattr(torch.mps, "compile_shader", lambda source: types.SimpleNamespace(main_kernel=lambda *a, **k: None))
    func = E.gemm_direct_global(128, 128, 64)
    target = E.metal4_target()  # the in-tree backend lowers this kernel only on metal4
    was_enabled = env.is_cache_enabled()
    try:
        tilelang_metal.deactivate()
        in_tree = _compile_torch_backend(func, target)
        assert "tilelang_metal" not in in_tree.get_kernel_source()
        assert _compile_torch_backend(func, target) is in_tree  # the cache is really on

        tilelang_metal.activate()
        plugin = _compile_torch_backend(func, target)
        assert plugin is not in_tree
        assert plugin.get_kernel_source().startswith("// tilelang_metal")
        assert _compile_torch_backend(func, target) is plugin  # the plugin's own entry is reused

        tilelang_metal.deactivate()
        again = _compile_torch_backend(func, target)
        assert "tilelang_metal" not in again.get_kernel_source()
    finally:
        tilelang_metal.activate()
        (env.enable_cache if was_enabled else env.disable_cache)()


def test_plugin_backends_keep_memory_only_caches_after_a_bare_kernel_cache_exists(monkeypatch):
    """tilelang's KernelCache is a singleton whose `_instance` subclasses inherit: with a bare one
    built (as any code may), a re-activation once made the emulator's cache that instance, which
    wrote emulator kernels to disk and logged "Error during atomic cache save"."""
    import tilelang.cache as cache_pkg
    from tilelang.cache.kernel_cache import KernelCache

    monkeypatch.setattr(KernelCache, "_instance", object.__new__(KernelCache))
    tilelang_metal.deactivate()
    tilelang_metal.activate()
    emulator_cache = cache_pkg._dispatch_map["emulator"]
    assert type(emulator_cache) is not KernelCache and emulator_cache is not KernelCache._instance
    assert emulator_cache._save_kernel_to_disk("key", None, None, False) is None  # memory only
