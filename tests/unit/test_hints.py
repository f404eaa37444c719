"""Hints where users get stuck: no target on a host without Metal, the emulator backend while the
plugin is inactive, the MLX backend without MLX installed. Each error names the fix."""

from __future__ import annotations

import pytest
import tilelang

import tilelang_metal
from tilelang_metal import kernels as examples
from tilelang_metal.target.normalize import _local_facts, metal_available


@pytest.fixture(scope="module")
def func():
    return examples.gemm_direct_global(32, 32, 16, 32, 32, threads=32)


needs_no_metal = pytest.mark.skipif(metal_available(_local_facts()), reason="this host has Metal: target='auto' finds it")


@needs_no_metal
def test_compile_without_target_says_to_pass_target_metal(func):
    with pytest.raises(ValueError, match="No registered target detector") as info:
        tilelang.compile(func, out_idx=[-1])
    message = str(info.value)
    assert 'target="metal"' in message and "metal4" in message and 'execution_backend="emulator"' in message


@needs_no_metal
def test_jit_without_target_says_to_pass_target_metal():
    @tilelang.jit(out_idx=[-1])
    def build(n):
        return examples.gemm_direct_global(n, n, n, 32, 32, threads=32)

    with pytest.raises(ValueError, match='target="metal"'):
        build(32)


def test_emulator_backend_while_inactive_says_to_activate(func):
    assert tilelang_metal.active()
    tilelang_metal.deactivate()
    try:
        with pytest.raises(ValueError, match="Allowed") as info:
            tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="emulator")
        assert "import tilelang_metal" in str(info.value) and "tilelang_metal.activate()" in str(info.value)
        # other backend names keep tilelang's message as it is
        with pytest.raises(ValueError) as other:
            tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="no_such_backend")
        assert "tilelang_metal" not in str(other.value)
    finally:
        tilelang_metal.activate()


def test_the_hint_leaves_successful_resolution_alone():
    from tilelang.backend.module import BackendModule
    from tilelang import tvm

    target = tvm.target.Target("metal")
    tilelang_metal.deactivate()
    try:
        from tilelang.backend import module as backend_module

        in_tree = backend_module._BACKENDS[backend_module._TARGET_KIND_INDEX["metal"][0]]
        wrapped = BackendModule.resolve_execution_backend
        names = in_tree.allowed_execution_backends(target, include_unavailable=False) + ("auto",)
        for name in names:
            assert wrapped(in_tree, name, target) is wrapped.__wrapped__(in_tree, name, target)
    finally:
        tilelang_metal.activate()


def test_mlx_backend_without_mlx_says_how_to_install_it(func, monkeypatch):
    from tilelang_metal.execution import backends

    monkeypatch.setattr(backends, "mlx_available", lambda: False)
    with pytest.raises(ValueError, match="not available") as info:
        tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="mlx")
    assert "pip install mlx (on Linux: pip install 'mlx[cpu]')" in str(info.value)
