"""`import tilelang_metal` is cheap, and any use of tilelang after it sees the plugin active,
whichever module is imported first. Each scenario runs in a fresh interpreter; the scenarios that
import tilelang start together (module fixture) so their start-up costs overlap."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = str(Path(__file__).resolve().parents[2])

TINY_KERNEL = """
import tilelang
from tilelang_metal import kernels as examples

source = tilelang.lower(examples.gemm_direct_global(64, 128, 32), target="metal").kernel_source
print("BANNER", source.startswith("// tilelang_metal"))
"""

SCENARIOS = {  # the ones marked LOWER end by lowering TINY_KERNEL
    "plugin_first": """
        import sys
        import tilelang_metal
        assert "tilelang" not in sys.modules and tilelang_metal.autoload.pending()
        import tilelang
        print("ACTIVE", tilelang_metal.active())
        print("HOOK_LEFT", any(type(f).__module__ == "tilelang_metal.autoload" for f in sys.meta_path))
    """,
    "tilelang_first": """
        import tilelang
        import tilelang_metal
        print("ACTIVE", tilelang_metal.active())
    """,
    "plugin_module_imports_tilelang": """
        import tilelang_metal
        from tilelang_metal.codegen import build  # imports host, which imports tilelang
        print("ACTIVE", tilelang_metal.active())
    """,
    "threads_import_tilelang": """
        import threading
        import tilelang_metal
        barrier = threading.Barrier(4)
        def worker():
            barrier.wait()
            import tilelang
            assert tilelang_metal.active()
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads: t.start()
        for t in threads: t.join()
        print("ACTIVE", tilelang_metal.active())
    """,
    "deactivated_before_import": """
        import tilelang_metal
        assert tilelang_metal.deactivate() is False  # nothing installed yet; drops the pending hook
        import tilelang
        print("ACTIVE", tilelang_metal.active())
        assert tilelang_metal.activate() is True and tilelang_metal.active()
    """,
}


pytestmark = pytest.mark.slow  # five fresh interpreters importing tilelang (~35 s of CPU): full tier

LOWER = {"plugin_first", "tilelang_first", "threads_import_tilelang"}


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TILELANG_METAL_AUTOLOAD"}
    env.update(PYTHONPATH=REPO, **extra)
    return env


@pytest.fixture(scope="module")
def outputs():
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(code) + (TINY_KERNEL if name in LOWER else "")],
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for name, code in SCENARIOS.items()
    }
    results = {}
    for name, proc in procs.items():
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, f"{name}:\n{err[-3000:]}"
        results[name] = out
    return results


def test_plugin_first_then_tilelang(outputs):
    out = outputs["plugin_first"]
    assert "ACTIVE True" in out and "BANNER True" in out
    assert "HOOK_LEFT False" in out  # the finder removed itself


def test_tilelang_first_then_plugin(outputs):
    assert "ACTIVE True" in outputs["tilelang_first"] and "BANNER True" in outputs["tilelang_first"]


def test_tilelang_imported_from_inside_a_plugin_module(outputs):
    assert "ACTIVE True" in outputs["plugin_module_imports_tilelang"]


def test_concurrent_first_imports(outputs):
    out = outputs["threads_import_tilelang"]
    assert "ACTIVE True" in out and "BANNER True" in out


def test_deactivate_before_tilelang_import_cancels_activation(outputs):
    out = outputs["deactivated_before_import"]
    assert "ACTIVE False" in out


def _python(code, **env):
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(**env), capture_output=True, text=True)


def test_import_and_cli_help_load_neither_tilelang_nor_torch():
    proc = _python(
        """
        import sys
        import tilelang_metal
        from tilelang_metal import (
            CodegenError, ConfigError, GemmLoweringError, MetalLoweringError, SUPPORTED_RANGE_TEXT,
            UnsupportedHostError, __version__, activate, active, deactivate,
        )
        assert not active()
        from tilelang_metal.cli import main
        try:
            main(["--help"])
        except SystemExit:
            pass
        print("HEAVY", sorted(m for m in ("tilelang", "torch", "tvm_ffi") if m in sys.modules))
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: python -m tilelang_metal" in proc.stdout
    assert "HEAVY []" in proc.stdout


def test_autoload_off_installs_no_hook():
    proc = _python(
        """
        import sys
        import tilelang_metal
        print("PENDING", tilelang_metal.autoload.pending())
        """,
        TILELANG_METAL_AUTOLOAD="0",
    )
    assert proc.returncode == 0, proc.stderr
    assert "PENDING False" in proc.stdout


def test_unsupported_tilelang_imported_after_the_plugin_fails_naming_the_range(tmp_path):
    fake = tmp_path / "tilelang"
    fake.mkdir()
    (fake / "__init__.py").write_text('__version__ = "0.3.1"\n')
    code = "import tilelang_metal; import tilelang"
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), REPO])
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "UnsupportedHostError" in proc.stderr
    assert "tilelang>=0.1.15,<0.2" in proc.stderr and "0.3.1" in proc.stderr


def test_bad_autoload_value_is_refused_at_import():
    proc = _python("import tilelang_metal", TILELANG_METAL_AUTOLOAD="perhaps")
    assert proc.returncode != 0
    assert "TILELANG_METAL_AUTOLOAD='perhaps' is not valid" in proc.stderr
