"""The precompiled shim prelude: built once, really used by the compiler (g++ or clang), injected only where it changes nothing."""

from __future__ import annotations

import subprocess

import emu_msl_kernels as K

from tilelang_metal.emulator import toolchain


def test_prelude_is_precompiled_and_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path))
    before = toolchain.STATS["prelude_builds"]
    header = toolchain.prelude_header()
    assert header is not None and header.with_suffix(".h.gch").exists()
    assert toolchain.prelude_header() == header
    assert toolchain.STATS["prelude_builds"] == before + 1
    src = tmp_path / "k.metal"
    src.write_text(K.add_half4())
    cmd = toolchain._kernel_cmd(toolchain.compiler(), src, ["-fsyntax-only", "-H", "-Winvalid-pch"], prelude=header)
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    if "clang" in toolchain.compiler_identity(toolchain.compiler()):
        # clang -H lists the headers it parses; with the PCH loaded, metal_stdlib is not among them
        assert not any(line.endswith("/metal_stdlib") for line in lines), r.stderr
    else:
        # g++ -H marks a precompiled header it loaded with '!'
        assert any(line.startswith("!") and line.endswith(".gch") for line in lines), r.stderr
    assert "invalid" not in r.stderr


def test_prelude_only_where_metal_stdlib_comes_first():
    assert toolchain._starts_with_stdlib(K.add_half4())
    assert toolchain._starts_with_stdlib("#include <metal_stdlib>\nusing namespace metal;\n")
    assert not toolchain._starts_with_stdlib("#define half float\n#include <metal_stdlib>\n")
    assert not toolchain._starts_with_stdlib("using namespace metal;\n")


def test_checkouts_with_identical_shims_do_not_share_a_prelude(tmp_path, monkeypatch):
    """A precompiled header records the absolute paths of the headers it was built from; a kernel of a
    second checkout (same shim bytes, other directory) that loaded the first checkout's PCH would include
    both copies of the `#pragma once` headers and fail with redefinitions."""
    import shutil

    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path / "cache"))
    first = toolchain.prelude_header()
    other_shim = tmp_path / "checkout" / "shim"
    shutil.copytree(toolchain.SHIM_DIR, other_shim)
    monkeypatch.setattr(toolchain, "SHIM_DIR", other_shim)
    second = toolchain.prelude_header()
    assert first is not None and second is not None and second != first
    src = tmp_path / "k.metal"
    src.write_text(K.add_half4())
    r = subprocess.run(toolchain._kernel_cmd(toolchain.compiler(), src, ["-fsyntax-only"], prelude=second),
                       capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[:2000]
