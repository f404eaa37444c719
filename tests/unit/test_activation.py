"""activate()/deactivate(): the plugin takes over target="metal" and gives it back exactly."""

import os
import subprocess
import sys
import textwrap
import threading

import pytest
import tilelang
from tilelang import tvm

import tilelang_metal
from tilelang_metal import kernels as examples

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _lower(func, target):
    with tvm.transform.PassContext(), target:
        return tilelang.lower(func, target=target).kernel_source


def _in_tree_source_in_fresh_process() -> str:
    code = textwrap.dedent(
        """
        import sys
        import tilelang_metal
        assert not tilelang_metal.active()
        import tilelang
        from tilelang import tvm
        from tilelang_metal import kernels as examples
        t = examples.metal4_target()
        with tvm.transform.PassContext(), t:
            sys.stdout.write(tilelang.lower(examples.gemm_direct_global(128, 256, 128), target=t).kernel_source)
        """
    )
    env = dict(os.environ, TILELANG_METAL_AUTOLOAD="0", PYTHONPATH=REPO)
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout


def test_import_activates_and_lowering_goes_through_the_plugin():
    assert tilelang_metal.active()
    source = _lower(examples.gemm_direct_global(128, 256, 128), examples.metal4_target())
    assert source.splitlines()[0].startswith(f"// tilelang_metal {tilelang_metal.__version__}")


@pytest.mark.slow  # two fresh interpreters importing tilelang: ~12 s of CPU
def test_deactivate_restores_the_in_tree_backend_byte_for_byte():
    from tilelang.backend import module as backend_module
    from tilelang.backend import target as backend_target
    from tilelang.cache.kernel_cache import KernelCache

    reference = _in_tree_source_in_fresh_process()
    assert "tilelang_metal" not in reference
    active_norm = backend_target._TARGET_NORMALIZERS["metal"]
    assert tilelang_metal.deactivate() is True
    try:
        assert not tilelang_metal.active()
        assert tilelang_metal.deactivate() is False  # idempotent
        import tilelang.metal.backend as in_tree

        assert backend_module._BACKENDS["metal"] is in_tree.BACKEND
        assert backend_module._TARGET_KIND_INDEX["metal"] == ["metal"]
        assert "tilelang_metal" not in backend_module._BACKENDS
        assert backend_target._TARGET_NORMALIZERS["metal"] is not active_norm
        assert "tilelang_metal" not in KernelCache._get_base_key()
        source = _lower(examples.gemm_direct_global(128, 256, 128), examples.metal4_target())
        assert source == reference
    finally:
        assert tilelang_metal.activate() is True
    assert tilelang_metal.active()
    assert _lower(examples.gemm_direct_global(128, 256, 128), examples.metal4_target()).startswith("// tilelang_metal")


def test_activate_is_idempotent_and_thread_safe():
    tilelang_metal.deactivate()
    results = []
    barrier = threading.Barrier(8)

    def worker():
        barrier.wait()
        results.append(tilelang_metal.activate())

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(results) == [False] * 7 + [True]
    assert tilelang_metal.active()


def test_autoload_can_be_turned_off():
    env = dict(os.environ, TILELANG_METAL_AUTOLOAD="0", PYTHONPATH=REPO)
    out = subprocess.run(
        [sys.executable, "-c", "import tilelang_metal; print(tilelang_metal.active())"], env=env, check=True, capture_output=True, text=True
    ).stdout
    assert out.strip() == "False"


@pytest.mark.slow  # a fresh interpreter: ~9 s of CPU
def test_unsupported_tilelang_fails_at_import_naming_the_range():
    code = "import tilelang; tilelang.__version__ = '0.3.1'; import tilelang_metal"
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "tilelang>=0.1.15,<0.2" in proc.stderr and "0.3.1" in proc.stderr
