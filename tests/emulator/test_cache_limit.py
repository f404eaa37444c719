"""The emulator cache's size limit: least-recently-used eviction, safety under concurrent
processes, and `python -m tilelang_metal cache info|clear`."""

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import emu_msl_kernels as K
import pytest

import tilelang_metal.emulator as emu
from tilelang_metal.cli import main
from tilelang_metal.emulator import cache

KB = 1024


def _entry(root, section, name, size, age):
    """A fake published entry of `size` bytes last used `age` seconds ago (kernels get a .cpp too)."""
    path = root / section / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x" * size)
    paths = [path]
    if section == "kernels":
        paths.append(path.with_suffix(".cpp"))
        paths[-1].write_bytes(b"y" * 10)
    when = time.time() - age
    for p in paths:
        os.utime(p, (when, when))
    return path


@pytest.fixture
def root(tmp_path):
    return tmp_path / "cache"


def test_over_the_limit_the_least_recently_used_go_first(root):
    old = _entry(root, "kernels", "k_old-aaaa.so", 100 * KB, age=3000)
    mid = _entry(root, "kernels", "k_mid-bbbb.so", 100 * KB, age=2000)
    new = _entry(root, "kernels", "k_new-cccc.so", 100 * KB, age=1000)
    stamp = _entry(root, "syntax", "k-dddd.ok", 0, age=5000)
    evicted = cache.trim(root, limit=250 * KB)
    assert [e.key for e in evicted] == [stamp, old]  # oldest use first, down to 90% of the limit
    assert not old.exists() and not old.with_suffix(".cpp").exists()
    assert mid.exists() and new.exists()
    assert cache.trim(root, limit=250 * KB) == []  # under the limit: nothing more


def test_a_use_makes_an_entry_recent(root):
    first = _entry(root, "kernels", "k_first-aaaa.so", 100 * KB, age=3000)
    second = _entry(root, "kernels", "k_second-bbbb.so", 100 * KB, age=2000)
    assert cache.touch(first)  # what a cache hit does
    cache.trim(root, limit=150 * KB, now=time.time() + 2 * cache.RECENT_SECONDS)
    assert first.exists() and not second.exists()


def test_entries_used_just_now_are_never_evicted(root):
    busy = _entry(root, "kernels", "k_busy-aaaa.so", 300 * KB, age=1)
    assert cache.trim(root, limit=100 * KB) == []  # another process may be about to load it
    assert busy.exists()


def test_directories_and_runtime_objects_are_entries(root):
    _entry(root, "runtime", "rt.o", 50 * KB, age=4000)
    prelude = root / "prelude" / "key1"
    prelude.mkdir(parents=True)
    (prelude / "tlm_prelude.h.gch").write_bytes(b"z" * 60 * KB)
    os.utime(prelude, (time.time() - 3000,) * 2)
    (root / "kernels" / ".build-xyz").mkdir(parents=True)  # a build in progress: never an entry
    found = {e.key.name: e for e in cache.entries(root)}
    assert set(found) == {"rt.o", "key1"} and found["key1"].size == 60 * KB
    cache.trim(root, limit=10 * KB)
    assert not prelude.exists() and (root / "kernels" / ".build-xyz").exists()


def test_eviction_tolerates_files_vanishing_and_concurrent_trims(root):
    for i in range(40):
        _entry(root, "kernels", f"k{i}-{i:04d}.so", 8 * KB, age=1000 + i)
    listed = cache.entries(root)
    (root / "kernels" / "k3-0003.so").unlink()  # another process evicted it meanwhile
    cache._remove(next(e for e in listed if e.key.name == "k3-0003.so"))
    errors = []

    def trim():
        try:
            cache.trim(root, limit=100 * KB)
        except Exception as err:  # noqa: BLE001
            errors.append(err)

    threads = [threading.Thread(target=trim) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(e.size for e in cache.entries(root)) <= 100 * KB


def test_a_build_trims_the_cache_to_the_configured_limit(root, monkeypatch):
    runtime = emu.toolchain.runtime_object()  # from the usual cache: no runtime rebuild here
    (root / "runtime").mkdir(parents=True)
    shutil.copy2(runtime, root / "runtime" / runtime.name)
    stale = _entry(root, "kernels", "stale-eeee.so", 2 * 1024 * KB, age=10_000)
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(root))
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE_MB", "1")
    monkeypatch.setattr(cache, "_estimate", None)  # as if this process had not scanned the cache yet
    emu.clear_memory_cache()
    try:
        kernel = emu.compile_kernel(K.reverse_tile())
    finally:
        emu.clear_memory_cache()
    assert not stale.exists()  # 2 MiB unused for hours, over a 1 MiB limit
    assert kernel.library_path.exists()  # the new build stays


def test_cli_cache_info_and_clear(root, monkeypatch, capsys):
    _entry(root, "kernels", "k-aaaa.so", 3 * 1024 * KB, age=10)
    _entry(root, "syntax", "k-bbbb.ok", 0, age=10)
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(root))
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE_MB", "64")
    assert main(["cache", "info"]) == 0
    out = capsys.readouterr().out
    assert f"path:    {root}" in out and "entries: 2" in out and "size:    3.0 MiB" in out and "limit:   64.0 MiB" in out
    assert main(["cache", "clear"]) == 0
    assert "removed 2 entries" in capsys.readouterr().out
    assert cache.entries(root) == []
    main(["cache", "info"])
    assert "entries: 0" in capsys.readouterr().out


def test_cli_bad_cache_limit_is_one_line(monkeypatch, capsys, root):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE", str(root))
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE_MB", "lots")
    assert main(["cache", "info"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "TILELANG_METAL_EMULATOR_CACHE_MB='lots'" in err


def test_a_process_scans_only_when_its_estimate_passes_the_limit(root, monkeypatch):
    monkeypatch.setenv("TILELANG_METAL_EMULATOR_CACHE_MB", "1")
    monkeypatch.setattr(cache, "_estimate", None)
    scans = []
    real_trim = cache.trim
    monkeypatch.setattr(cache, "trim", lambda r, limit, now=None: scans.append(limit) or real_trim(r, limit, now))
    small = [_entry(root, "syntax", f"s{i}-{i:04d}.ok", 10 * KB, age=5000) for i in range(5)]
    for path in small:
        cache.after_publish(root, path)
    assert len(scans) == 1  # the first publish scans; the next ones only add to the estimate
    big = _entry(root, "kernels", "big-ffff.so", 1100 * KB, age=0)
    cache.after_publish(root, big)  # the estimate passes 1 MiB: scan and trim
    assert len(scans) == 2
    assert not any(p.exists() for p in small) and big.exists()  # old stamps go, the new build stays


def test_processes_sharing_a_small_cache_build_and_evict_without_errors(root):
    """Two processes (as pytest-xdist workers do) build distinct kernels into one cache over its
    limit, full of stale entries both try to evict at once; both succeed and load their kernels."""
    runtime = emu.toolchain.runtime_object()
    (root / "runtime").mkdir(parents=True)
    shutil.copy2(runtime, root / "runtime" / runtime.name)
    prelude = emu.toolchain.prelude_header()  # also from the usual cache: no prelude rebuilds
    if prelude is not None:
        shutil.copytree(prelude.parent, root / "prelude" / prelude.parent.name)
    stale = [_entry(root, "kernels", f"stale{i}-{i:04d}.so", 64 * KB, age=10_000 + i) for i in range(40)]
    script = (  # compile_kernel loads the library it built (no torch needed in the workers)
        "import sys, tilelang_metal.emulator as e\n"
        "src = sys.stdin.read().replace(') {\\n', ') {\\n  // process %s\\n' % sys.argv[1], 1)\n"
        "assert e.compile_kernel(src).library_path.exists()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2]), TILELANG_METAL_EMULATOR_CACHE=str(root),
               TILELANG_METAL_EMULATOR_CACHE_MB="1")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(i)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for i in range(2)]
    results = [p.communicate(K.reverse_tile(), timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in results]
    assert not any(p.exists() for p in stale)  # 2.5 MiB of stale entries over a 1 MiB limit: evicted
    assert len([e for e in cache.entries(root) if e.key.suffix == ".so"]) == 2  # both new builds stay
