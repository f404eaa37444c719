"""Build cache: hits do not recompile, keys follow the source, concurrent builds are safe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import emu_msl_kernels as K
import pytest
import torch

import tilelang_metal.emulator as emu


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache: the runtime is built again (only for the test that counts runtime builds)."""
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path / "cache"))
    emu.clear_memory_cache()
    yield tmp_path / "cache"
    emu.clear_memory_cache()


@pytest.fixture(scope="session")
def _session_cache_dir(tmp_path_factory):
    """A cache without kernels, holding the runtime object already built in the default cache
    (same key: the key does not depend on the directory), so no test rebuilds the runtime."""
    runtime = emu.toolchain.runtime_object()  # the suite's usual cache: built at most once
    root = tmp_path_factory.mktemp("emulator-cache")
    (root / "runtime").mkdir()
    shutil.copy2(runtime, root / "runtime" / runtime.name)
    return root


@pytest.fixture
def session_cache(_session_cache_dir, monkeypatch):
    """A cache with a prebuilt runtime and no kernels but those built by earlier tests of this session."""
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(_session_cache_dir))
    emu.clear_memory_cache()
    yield _session_cache_dir
    emu.clear_memory_cache()


def _builds() -> int:
    return emu.build_stats()["kernel_builds"]


def test_cache_hit_does_not_recompile(fresh_cache):
    src = K.reverse_tile()
    before = emu.build_stats()
    k1 = emu.compile_kernel(src)
    after_cold = emu.build_stats()
    assert after_cold["kernel_builds"] == before["kernel_builds"] + 1
    assert after_cold["runtime_builds"] == before["runtime_builds"] + 1  # fresh cache: runtime built once
    assert k1.library_path.parent.parent == fresh_cache

    k2 = emu.compile_kernel(src)  # same process: memoised
    assert k2 is k1 and _builds() == after_cold["kernel_builds"]

    emu.clear_memory_cache()  # as a new process would: found on disk
    k3 = emu.compile_kernel(src)
    stats = emu.build_stats()
    assert stats["kernel_builds"] == after_cold["kernel_builds"]
    assert stats["disk_hits"] == after_cold["disk_hits"] + 1
    assert k3.library_path == k1.library_path

    # the cached library works
    a = torch.randn(128)
    b = torch.zeros(128)
    k3.launch([a, b], (1, 1, 1), (128, 1, 1))
    assert torch.equal(b, a.flip(0))

    # a different source or build mode is a different entry
    emu.compile_kernel(src, checked=False)
    emu.compile_kernel(src.replace(") {\n", ") {\n  // variant\n", 1))
    assert _builds() == after_cold["kernel_builds"] + 2
    assert emu.build_stats()["runtime_builds"] == after_cold["runtime_builds"]


def test_cache_hit_in_a_new_process(session_cache):
    src = K.add_half4()
    emu.compile_kernel(src)
    root = Path(__file__).resolve().parents[2]
    code = (
        "import json, sys; import tilelang_metal.emulator as e; "
        "e.compile_kernel(sys.stdin.read()); print(json.dumps(e.build_stats()))"
    )
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code], input=src, capture_output=True, text=True, env=env, check=True)
    stats = json.loads(out.stdout)
    assert stats["kernel_builds"] == 0 and stats["runtime_builds"] == 0 and stats["disk_hits"] == 1


def test_concurrent_builds_of_the_same_kernel(session_cache):
    src = K.simd_collectives()
    unit = emu._unit(src, True)[1]
    before = _builds()
    with ThreadPoolExecutor(max_workers=3) as pool:  # a failing build re-raises in .result()
        results = [f.result() for f in [pool.submit(emu.toolchain.kernel_library, unit, True) for _ in range(3)]]
    assert len(set(results)) == 1 and results[0].exists()
    # one compile: the others waited on the key's lock and loaded it (as two xdist workers would)
    assert _builds() - before == 1
    leftovers = [p for p in session_cache.rglob(".build-*")] + [p for p in session_cache.rglob(".lock-*")]
    assert leftovers == []


def test_portable_fibers(monkeypatch):
    """The makecontext + _setjmp/_longjmp fibers (used off x86-64) run barriers and collectives too."""
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_FIBERS", "portable")
    k = emu.compile_kernel(K.reverse_tile())
    a = torch.randn(4 * 128)
    b = torch.zeros(4 * 128)
    k.launch([a, b], (4, 1, 1), (128, 1, 1), workers=2)
    assert torch.equal(b.view(4, 128), a.view(4, 128).flip(1))

    k = emu.compile_kernel(K.mpp_gemm("half"))
    x = torch.randn(64, 64, dtype=torch.float16)
    y = torch.randn(64, 128, dtype=torch.float16)
    c = torch.zeros(64, 128)
    k.launch([x, y, c], (2, 2, 1), (128, 1, 1))
    torch.testing.assert_close(c, x.float() @ y.float(), rtol=1e-5, atol=1e-4)


def test_shim_version_is_consistent():
    config = (Path(emu.__file__).parent / "shim" / "tlm" / "config.h").read_text()
    assert f'#define TLM_SHIM_VERSION "{emu.SHIM_VERSION}"' in config
    k = emu.compile_kernel(K.add_half4())
    import ctypes

    fn = ctypes.CDLL(str(k.library_path)).tlm_shim_version
    fn.restype = ctypes.c_char_p
    assert fn().decode() == emu.SHIM_VERSION
