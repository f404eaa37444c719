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


def test_prelude_of_another_checkouts_shim_is_its_own(tmp_path, monkeypatch):
    """Two checkouts with the same shim text share a cache: each gets its own PCH, since a PCH names
    its headers by path (clang then saw the shim twice: redefinitions)."""
    import shutil

    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path / "cache"))
    mine = toolchain.prelude_header()
    copy = tmp_path / "other-checkout" / "shim"
    shutil.copytree(toolchain.SHIM_DIR, copy)
    monkeypatch.setattr(toolchain, "SHIM_DIR", copy)
    theirs = toolchain.prelude_header()
    assert mine is not None and theirs is not None and mine != theirs
    src = tmp_path / "k.metal"
    src.write_text(K.add_half4())
    cmd = toolchain._kernel_cmd(toolchain.compiler(), src, ["-fsyntax-only", "-Winvalid-pch"], prelude=theirs)
    r = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr


def test_prelude_survives_a_shim_header_with_a_new_mtime_and_the_same_content(tmp_path, monkeypatch):
    """The cache keys the prelude by the shim's content; a checkout or a revert that brings back
    content built before (new mtime) must reuse that PCH, not fail with 'has been modified since the
    precompiled header was built' (clang records input mtimes unless told not to)."""
    import os

    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path))
    header = toolchain.prelude_header()
    assert header is not None
    shim = toolchain.SHIM_DIR / "tlm" / "math.h"
    st = shim.stat()
    try:
        os.utime(shim, ns=(st.st_atime_ns, st.st_mtime_ns + 5 * 10**9))
        assert toolchain.prelude_header() == header  # same content: the cached PCH
        src = tmp_path / "k.metal"
        src.write_text(K.add_half4())
        cmd = toolchain._kernel_cmd(toolchain.compiler(), src, ["-fsyntax-only"], prelude=header)
        r = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert r.returncode == 0, r.stderr
    finally:
        os.utime(shim, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_foreign_kernels_build_on_a_prelude_of_their_own_flags(tmp_path, monkeypatch):
    """Foreign MSL carries predefines (and, in the traced counters flavour, -O0 and clang's memory
    tracing): each flag set gets its own PCH, which the compiler accepts (it refuses one whose macros
    or optimization level differ), and the results are those of parsing the shim (0.37 s of CPU per
    tiny foreign build without it, 0.15 s with it)."""
    import torch

    from tilelang_metal.emulator import compile_msl
    from tilelang_metal.emulator.foreign import memory_counts_unavailable

    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(tmp_path))
    builds: list[list[str]] = []
    real_run = toolchain._run

    def recording_run(cmd, cwd):
        if "-shared" in cmd:
            builds.append(cmd)
        return real_run(cmd, cwd)

    monkeypatch.setattr(toolchain, "_run", recording_run)
    src = ("#include <metal_stdlib>\nusing namespace metal;\nkernel void scale3(const device float* a [[buffer(0)]], "
           "device float* b [[buffer(1)]], uint i [[thread_position_in_grid]]) { b[i] = a[i] * 3.0f + __METAL_VERSION__; }\n")
    kernel = compile_msl(src, "scale3")
    a, b = torch.randn(64), torch.zeros(64)
    kernel.launch([a, b], grid=(2,), block=(32,))
    torch.testing.assert_close(b, a * 3 + 320)
    counts = kernel.counters([a, torch.zeros(64)], grid=(2,), block=(32,))
    assert counts["device_store_bytes"] == 64 * 4
    if memory_counts_unavailable() is None:  # clang: the traced build, its own flags
        assert counts["load_instructions"] == 64 and counts["device_transactions"] == 4  # 2 x 2 segments of 128 B
    assert len(builds) == 2 and all("-include" in cmd for cmd in builds), builds
    assert len(list((tmp_path / "prelude").iterdir())) == 2  # plain and counters: different flags, different PCHs
