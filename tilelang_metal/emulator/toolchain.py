"""Compiler invocation and the on-disk build cache.

Kernels are compiled with the machine's g++ against the shim headers; the CPU runtime is compiled
once per (runtime sources, compiler, flags) into a relocatable object that every kernel library
links statically. Everything is cached under `cache_dir()` by content hash and published with
`os.replace`, so concurrent processes building the same thing are safe; a per-key lock file makes
the second of two concurrent builders (pytest-xdist workers) wait for the first and load its result
instead of compiling the same source again. Every use of an entry is
recorded and the cache is kept within its size limit, least recently used first (cache.py).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import config
from . import cache
from .errors import EmulatorCompileError
from .version import SHIM_VERSION

PACKAGE_DIR = Path(__file__).resolve().parent
SHIM_DIR = PACKAGE_DIR / "shim"
RUNTIME_DIR = PACKAGE_DIR / "runtime"
RUNTIME_SOURCES = ("runtime.cpp", "fiber.cpp")

# Flags shared by the runtime and the kernels. -fno-strict-aliasing: MSL code reinterprets scalar
# arrays as vectors; -fsigned-char: MSL `char` is signed on every target.
COMMON_FLAGS = (
    "-std=c++20",
    "-fPIC",
    "-fno-strict-aliasing",
    "-fsigned-char",
    "-fvisibility=hidden",
    "-pthread",
)
# -fstack-clash-protection: a frame bigger than a page probes every page, so it faults on the guard
# page below the fiber stack instead of jumping over it into a neighbour's stack.
# -ftrivial-auto-var-init=zero: MSL that reads a never-written thread variable on some lanes and
# discards the value (TVM's LowerThreadAllreduce leaves inactive lanes' red_buf uninitialized before a
# shuffle) is undefined behaviour in C++, and clang -O1 and up then assumed the guarded store before
# it always ran: an unguarded threadgroup load, out of bounds. Zero-initialized, the read is defined.
# Plain -O2 otherwise: on the suite's own kernels (built as here, with the prelude and the link),
# -fno-slp-vectorize -fno-vectorize -mllvm -fast-isel saves 7% of a plain build's CPU and 2-4% of an
# instrumented one's, -O1 nothing: the time goes to InstCombine, GVN, LICM on the inlined shim, and to
# starting clang (~35 ms) and the link (~50 ms).
KERNEL_FLAGS = ("-O2", "-fstack-clash-protection", "-ftrivial-auto-var-init=zero", "-fno-exceptions", "-fno-rtti",
                "-Wno-attributes", "-Wno-unused", "-Wno-unused-parameter")
RUNTIME_FLAGS = ("-O2",)

# Counters for tests and benchmarks: how many compiler invocations this process made.
_stats_lock = threading.Lock()
STATS = {"kernel_builds": 0, "runtime_builds": 0, "prelude_builds": 0, "disk_hits": 0, "memory_hits": 0}


def bump(counter: str) -> None:
    with _stats_lock:
        STATS[counter] += 1


def cache_dir() -> Path:
    path = config.emulator_cache()
    path.mkdir(parents=True, exist_ok=True)
    return path


def compiler() -> str:
    return config.emulator_cxx()


def fiber_flavour() -> str:
    """`native` (hand-written switch where available) or `portable` (makecontext + _setjmp/_longjmp)."""
    return config.emulator_fibers()


@functools.cache
def compiler_identity(cxx: str) -> str:
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, check=True).stdout
        machine = subprocess.run([cxx, "-dumpmachine"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        raise EmulatorCompileError(f"cannot run the C++ compiler '{cxx}': {e}") from e
    return out.splitlines()[0].strip() + " / " + machine.strip()


@functools.cache
def _tree_hash(version_salt: str) -> str:
    h = hashlib.sha256(version_salt.encode())
    for root in (SHIM_DIR, RUNTIME_DIR):
        for p in sorted(root.rglob("*")):
            if p.is_file() and "__pycache__" not in p.parts:
                h.update(str(p.relative_to(PACKAGE_DIR)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()


def sources_hash() -> str:
    """Hash of the shim headers and runtime sources (part of every cache key)."""
    return _tree_hash(SHIM_VERSION)


@functools.cache
def _host_flags() -> tuple[str, ...]:
    """Target flags that are safe on this very machine. F16C turns every half<->float conversion
    from a libgcc call into one instruction; the flag is part of the cache key, so a cache shared
    with a machine without F16C never hands it such a library."""
    import platform

    if platform.machine() not in ("x86_64", "AMD64"):
        return ()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags") and " f16c" in line:
                    return ("-mf16c",)
    except OSError:
        pass
    return ()


def _defines() -> list[str]:
    flags = list(_host_flags())
    if fiber_flavour() == "portable":
        flags.append("-DTLM_PORTABLE_FIBERS")
    return flags


def _key(*parts: str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\0")
    return h.hexdigest()


def _run(cmd: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)


def _publish(tmp_file: Path, final: Path) -> None:
    os.replace(tmp_file, final)  # atomic; a concurrent identical build simply wins or loses the race


_build_lock = threading.Lock()


@contextlib.contextmanager
def _building(final: Path):
    """Held while `final` is built: a concurrent builder of the same key (another process or
    thread) waits here, then finds the entry published and loads it. Only an optimization: a
    builder that gets past a lock removed under it builds again and publishes the same bytes."""
    final.parent.mkdir(parents=True, exist_ok=True)
    lock = final.parent / f".lock-{final.name}"  # dot names are not cache entries (cache.entries)
    fd = os.open(lock, os.O_CREAT | os.O_RDWR, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        with contextlib.suppress(FileNotFoundError):
            lock.unlink()
        os.close(fd)  # releases the lock


def runtime_object() -> Path:
    """The compiled runtime (one relocatable object), built on first use."""
    cxx = compiler()
    flags = [*COMMON_FLAGS, *RUNTIME_FLAGS, *_defines()]
    key = _key("runtime", sources_hash(), compiler_identity(cxx), " ".join(flags))
    final = cache_dir() / "runtime" / f"{key[:32]}.o"
    if cache.touch(final):
        return final
    with _building(final):
        if cache.touch(final):  # built by the holder of the lock
            return final
        _build_runtime(cxx, flags, final)
    cache.after_publish(cache_dir(), final)
    return final


def _build_runtime(cxx: str, flags: list[str], final: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        objs = []
        for src in RUNTIME_SOURCES:
            obj = tmp / (Path(src).stem + ".o")
            cmd = [cxx, *flags, "-I", str(SHIM_DIR), "-c", str(RUNTIME_DIR / src), "-o", str(obj)]
            r = _run(cmd, tmp)
            if r.returncode != 0:
                raise EmulatorCompileError(f"building the emulator runtime failed:\n{' '.join(cmd)}\n{r.stderr}")
            objs.append(str(obj))
        combined = tmp / "tlm_runtime_combined.o"
        r = _run([cxx, "-r", "-nostdlib", "-o", str(combined), *objs], tmp)
        if r.returncode != 0:
            raise EmulatorCompileError(f"linking the emulator runtime failed:\n{r.stderr}")
        bump("runtime_builds")
        _publish(combined, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@dataclass(frozen=True)
class SourceUnit:
    """What gets compiled: the rewritten kernel (same line numbers as the MSL) plus the driver."""

    kernel_name: str
    original: str
    rewritten: str
    driver: str
    # Foreign MSL (foreign.py): translated headers (build-relative path, text) and the flags that find them.
    extra_files: tuple[tuple[str, str], ...] = ()
    extra_flags: tuple[str, ...] = ()

    @property
    def key_text(self) -> str:
        """Everything compiled, for the cache key."""
        if not self.extra_files and not self.extra_flags:
            return self.text
        extra = "".join(f"\0{path}\0{text}" for path, text in self.extra_files)
        return self.text + "\0flags " + " ".join(self.extra_flags) + extra

    def write_extra_files(self, build: Path) -> None:
        for rel, text in self.extra_files:
            target = build / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)

    @property
    def file_name(self) -> str:
        return f"{self.kernel_name}.metal"

    @property
    def text(self) -> str:
        return self.rewritten + ("" if self.rewritten.endswith("\n") else "\n") + self.driver


_DIAG_RE = re.compile(r"^(?P<file>[^:\s]+):(?P<line>\d+):(?:\d+:)?\s")


def format_diagnostics(unit: SourceUnit, stderr: str, build_dir: Path) -> str:
    """Compiler output with temporary paths removed, followed by the source lines it points at."""
    text = stderr.replace(str(build_dir) + os.sep, "")
    orig = unit.original.splitlines()
    driver = unit.driver.split("\n")
    # driver text starts with "\n#line 1 ..." so its line k is driver[k + 1]
    shown: list[str] = []
    seen: set[tuple[str, int]] = set()
    for ln in text.splitlines():
        m = _DIAG_RE.match(ln)
        if not m:
            continue
        f, n = m.group("file"), int(m.group("line"))
        if (f, n) in seen:
            continue
        if f == unit.file_name and 1 <= n <= len(orig):
            seen.add((f, n))
            shown.append(f"  {n:5d} | {orig[n - 1]}")
        elif f == "tlm_driver" and 0 <= n + 1 < len(driver):
            seen.add((f, n))
            shown.append(f"  driver {n:3d} | {driver[n + 1]}")
    if shown:
        text += "\noffending source lines:\n" + "\n".join(shown)
    return text


# Memory tracing of foreign kernels' counters flavour (foreign.py): clang's thread-sanitizer
# instrumentation reports every load, store and memcpy / memmove / memset to the runtime's __tsan_*
# hooks (runtime.cpp; no sanitizer runtime is linked). -O0, so the accesses are the source's: one per
# scalar or whole vector / struct value read or written (at -O2 SROA splits a `half4` copy into lanes
# and GVN / LICM drop repeated loads). Atomics and function entry/exit are not instrumented; reads
# followed by a write of the same address are (a `+=` is a load and a store).
MEMORY_TRACE_FLAGS = (
    "-O0", "-fsanitize=thread", "-DTLM_TRACE_MEMORY",
    "-mllvm", "-tsan-instrument-atomics=0",
    "-mllvm", "-tsan-instrument-func-entry-exit=0",
    "-mllvm", "-tsan-instrument-read-before-write=1",
)


def memory_trace_unavailable() -> str | None:
    """Why foreign kernels' memory traffic cannot be counted with this compiler, or None if it can."""
    cxx = compiler()
    if "clang" not in compiler_identity(cxx).lower():
        return (f"foreign kernels' memory traffic is counted only when the emulator builds with clang (clang++-19; "
                f"this compiler is {compiler_identity(cxx)}): set TILELANG_METAL_EMULATOR_CXX=clang++-19")
    return None


# The counters flavour keeps the source's loops rolled: the GPU-level counts group the lanes of a
# simdgroup by program point, which must be the source's (as in foreign MSL's -O0 traced build), not
# a copy the C++ compiler made by unrolling a loop whose trip count differs between lanes.
INSTRUMENT_DEFINES = {None: [], "counters": ["-DTLM_COUNTERS", "-fno-unroll-loops"], "racecheck": ["-DTLM_RACECHECK"]}


def _kernel_cmd(cxx: str, src: Path, extra: list[str], instrument: str | None = None, prelude: Path | None = None) -> list[str]:
    pch = ["-include", str(prelude)] if prelude is not None else []
    return [cxx, *COMMON_FLAGS, *KERNEL_FLAGS, *_defines(), *INSTRUMENT_DEFINES[instrument], "-I", str(SHIM_DIR),
            *pch, "-x", "c++", str(src), *extra]


# ---------------------------------------------------------------- precompiled shim prelude

PRELUDE_NAME = "tlm_prelude.h"
PRELUDE_TEXT = "// Precompiled prelude of emulated kernels (toolchain.py).\n#ifndef TLM_PRELUDE_H\n#define TLM_PRELUDE_H\n#include <metal_stdlib>\n#endif\n"
_LEADING_RE = re.compile(r"\A(?:[ \t]*(?://[^\n]*)?\n)*[ \t]*#include <metal_stdlib>")


def _starts_with_stdlib(text: str) -> bool:
    """The prelude may be injected only where it changes nothing: the source's first directive
    (after comments and blank lines) already is `#include <metal_stdlib>` (every printed kernel)."""
    return bool(_LEADING_RE.match(text))


def prelude_header(instrument: str | None = None, unit_flags: tuple[str, ...] = ()) -> Path | None:
    """The shim prelude with its precompiled header (`.gch`, built once per shim directory and sources, compiler and
    flags; g++ parses the text instead if it ever rejects the `.gch`). None if it cannot be built. `unit_flags`: a
    foreign unit's own flags (predefines, -O0 memory tracing); the PCH is built with them, since a macro or
    optimization level that differs makes the compiler refuse it, except their include directories, which come
    after the shim's and cannot change what the prelude's `#include <metal_stdlib>` finds (a PCH per directory
    would cost a foreign build more than it saves)."""
    cxx = compiler()
    unit_flags = tuple(f for f in unit_flags if not f.startswith("-I"))
    # clang records each input's mtime and refuses the PCH when one changes; the key covers the
    # shim's content, so a checkout that restores content built before must find its PCH valid.
    no_timestamps = ["-Xclang", "-fno-pch-timestamp"] if "clang" in compiler_identity(cxx) else []
    flags = [*COMMON_FLAGS, *KERNEL_FLAGS, *_defines(), *INSTRUMENT_DEFINES[instrument], *no_timestamps, *unit_flags]
    # The shim's path is in the key too: a PCH names the headers it holds by path, and a kernel that
    # includes the same headers from another checkout would get both copies (redefinitions).
    key = _key("prelude", sources_hash(), str(SHIM_DIR), compiler_identity(cxx), " ".join(flags), PRELUDE_TEXT)
    final = cache_dir() / "prelude" / key[:32]
    header = final / PRELUDE_NAME
    gch = final / (PRELUDE_NAME + ".gch")
    if gch.exists() and cache.touch(final):
        return header
    with _building(final):
        if gch.exists() and cache.touch(final):  # built by the holder of the lock
            return header
        built = _build_prelude(cxx, flags, final, header)
    if built:
        cache.after_publish(cache_dir(), final)
    return header if gch.exists() else None


def _build_prelude(cxx: str, flags: list[str], final: Path, header: Path) -> bool:
    if not header.exists():
        tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
        try:
            (tmp / PRELUDE_NAME).write_text(PRELUDE_TEXT)
            os.rename(tmp, final)  # atomic publish of the directory; a concurrent build may have won
        except OSError:
            pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    # The PCH is built from the published header, never from a temporary copy: clang records the
    # header's path in the PCH and refuses the PCH once that file is gone.
    fd, part = tempfile.mkstemp(prefix=".build-", suffix=".part", dir=final)
    os.close(fd)
    cmd = [cxx, *flags, "-I", str(SHIM_DIR), "-x", "c++-header", str(header), "-o", part]
    if _run(cmd, final).returncode != 0:
        Path(part).unlink(missing_ok=True)
        return False  # builds go on without it
    bump("prelude_builds")
    os.replace(part, final / (PRELUDE_NAME + ".gch"))  # concurrent builders publish the same bytes
    return True


@functools.cache
def _linker_flags(cxx: str) -> tuple[str, ...]:
    """gold links a kernel library ~10x faster than bfd (~0.01 s instead of ~0.1 s); used when present."""
    try:
        r = subprocess.run([cxx, "-fuse-ld=gold", "-Wl,--version"], capture_output=True, text=True, check=False)
    except OSError:
        return ()
    return ("-fuse-ld=gold",) if r.returncode == 0 and "gold" in r.stdout.lower() else ()


def syntax_check(unit: SourceUnit) -> None:
    """`-fsyntax-only` on `unit`; a success leaves an empty stamp file in the cache, keyed like a
    kernel build (shim + runtime sources, compiler, flags, text), so the same source is checked once."""
    cxx = compiler()
    flags = " ".join([*COMMON_FLAGS, *KERNEL_FLAGS, *_defines()])
    key = _key("syntax", sources_hash(), compiler_identity(cxx), flags, unit.text)
    stamp = cache_dir() / "syntax" / f"{unit.kernel_name[:48]}-{key[:32]}.ok"
    if cache.touch(stamp):
        return
    with _building(stamp):
        if cache.touch(stamp):  # checked by the holder of the lock
            return
        _check_syntax(unit, cxx, stamp)
    cache.after_publish(cache_dir(), stamp)


def _check_syntax(unit: SourceUnit, cxx: str, stamp: Path) -> None:
    with tempfile.TemporaryDirectory(prefix="tlm-check-") as d:
        build = Path(d)
        src = build / unit.file_name
        src.write_text(unit.text)
        prelude = prelude_header() if _starts_with_stdlib(unit.text) else None
        r = _run(_kernel_cmd(cxx, src, ["-fsyntax-only"], prelude=prelude), build)
        if r.returncode != 0:
            raise EmulatorCompileError(
                f"MSL kernel '{unit.kernel_name}' does not compile:\n" + format_diagnostics(unit, r.stderr, build)
            )
    stamp.touch()


def kernel_library(unit: SourceUnit, checked: bool, instrument: str | None = None) -> Path:
    """Path of the shared library for `unit`, compiled unless already cached."""
    cxx = compiler()
    flags = " ".join([*COMMON_FLAGS, *KERNEL_FLAGS, *_defines(), *INSTRUMENT_DEFINES[instrument], *_linker_flags(cxx)])
    key = _key("kernel", sources_hash(), compiler_identity(cxx), flags, f"checked={checked}", unit.key_text)
    kdir = cache_dir() / "kernels"
    final = kdir / f"{unit.kernel_name[:48]}-{key[:32]}.so"
    if cache.touch(final):
        bump("disk_hits")
        return final
    rt = runtime_object()
    with _building(final):
        if cache.touch(final):  # built by the holder of the lock
            bump("disk_hits")
            return final
        _build_kernel(unit, cxx, rt, instrument, final)
    cache.after_publish(cache_dir(), final)
    return final


def _build_kernel(unit: SourceUnit, cxx: str, rt: Path, instrument: str | None, final: Path) -> None:
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=final.parent))
    try:
        src = tmp / unit.file_name
        src.write_text(unit.text)
        unit.write_extra_files(tmp)
        lib = tmp / "kernel.so"
        # Foreign units' predefines (and tracing flags) are in their prelude's flags: one PCH per flag set.
        prelude = prelude_header(instrument, unit.extra_flags) if _starts_with_stdlib(unit.text) else None
        link = [*unit.extra_flags, "-shared", *_linker_flags(cxx), "-o", str(lib), "-x", "none", str(rt)]
        cmd = _kernel_cmd(cxx, src, link, instrument, prelude)
        r = _run(cmd, tmp)
        if r.returncode != 0:
            raise EmulatorCompileError(
                f"MSL kernel '{unit.kernel_name}' does not compile:\n" + format_diagnostics(unit, r.stderr, tmp)
            )
        bump("kernel_builds")
        # Keep the compiled C++ next to the library: handy when debugging a kernel.
        os.replace(src, final.with_suffix(".cpp"))
        _publish(lib, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
