"""Size limit of the emulator's build cache: least-recently-used entries are evicted.

An entry is what one build publishes: a kernel library (`kernels/NAME-KEY.so` with its `.cpp`),
a runtime object (`runtime/KEY.o`), a precompiled prelude (`prelude/KEY/`) or a syntax-check stamp
(`syntax/NAME-KEY.ok`). Every use of an entry sets its modification time (`touch`), so the mtime
is the time of last use. After each new build the cache is trimmed to 90% of its limit
(`config.emulator_cache_mb()`), oldest use first.

Several processes share the cache (pytest-xdist workers, concurrent users): builds publish with
atomic renames (toolchain.py), and eviction tolerates files that vanish under it or appear while it
runs. An entry used in the last `RECENT_SECONDS` is never evicted, so a library another process has
just found is still there when it loads it (a loaded library stays mapped after it is deleted).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from .. import config

SECTIONS = ("kernels", "runtime", "prelude", "syntax")
RECENT_SECONDS = 60.0
LOW_WATER = 0.9  # trim to this fraction of the limit, so not every build trims again


@dataclass(frozen=True)
class Entry:
    key: Path  # the file (or directory) that stands for the entry; its mtime is the last use
    paths: tuple[Path, ...]  # everything removed with it
    size: int
    last_use: float


def touch(path: Path) -> bool:
    """Record a use of the entry at `path`; False if it has vanished (evicted by another process)."""
    try:
        os.utime(path)
        return True
    except FileNotFoundError:
        return False


def _size(path: Path) -> int:
    try:
        if path.is_dir():
            return sum(_size(p) for p in path.iterdir())
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def entries(root: Path) -> list[Entry]:
    """Every published entry under `root` (in-progress `.build-*` directories excluded)."""
    found: list[Entry] = []
    for section in SECTIONS:
        directory = root / section
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        groups: dict[str, list[Path]] = {}
        for name in names:
            if name.startswith("."):
                continue
            path = directory / name
            stem = name.rsplit(".", 1)[0] if section == "kernels" else name
            groups.setdefault(stem, []).append(path)
        for stem, paths in groups.items():
            key = next((p for p in paths if p.suffix == ".so"), paths[0])
            try:
                last_use = key.stat().st_mtime
            except FileNotFoundError:
                continue
            found.append(Entry(key, tuple(paths), sum(_size(p) for p in paths), last_use))
    return found


def _remove(entry: Entry) -> None:
    for path in entry.paths:
        try:
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink()
        except FileNotFoundError:
            pass


def limit_bytes() -> int:
    return config.emulator_cache_mb() * 1024 * 1024


def trim(root: Path, limit: int, now: float | None = None) -> list[Entry]:
    """Evict least-recently-used entries until the cache holds at most `LOW_WATER * limit` bytes
    (entries used in the last RECENT_SECONDS stay). Returns what was evicted."""
    found = entries(root)
    total = sum(e.size for e in found)
    if total <= limit:
        return []
    now = time.time() if now is None else now
    target = int(limit * LOW_WATER)
    evicted = []
    for entry in sorted(found, key=lambda e: e.last_use):
        if total <= target:
            break
        if now - entry.last_use < RECENT_SECONDS:
            break  # the rest is newer still
        _remove(entry)
        total -= entry.size
        evicted.append(entry)
    return evicted


def after_publish(root: Path) -> None:
    """Called after each new build: keep the cache within its limit."""
    trim(root, limit_bytes())


@dataclass(frozen=True)
class CacheInfo:
    path: Path
    entries: int
    size: int
    limit: int


def info(root: Path) -> CacheInfo:
    found = entries(root)
    return CacheInfo(root, len(found), sum(e.size for e in found), limit_bytes())


def clear(root: Path) -> int:
    """Remove every entry (and leftovers of interrupted builds); returns how many entries went."""
    found = entries(root)
    for entry in found:
        _remove(entry)
    for section in SECTIONS:
        directory = root / section
        try:
            names = os.listdir(directory)
        except FileNotFoundError:
            continue
        for name in names:  # stale temporary build directories (older than any running build)
            path = directory / name
            try:
                if name.startswith(".build-") and time.time() - path.stat().st_mtime > 3600:
                    shutil.rmtree(path, ignore_errors=True)
            except FileNotFoundError:
                pass
    return len(found)


__all__ = ["CacheInfo", "Entry", "RECENT_SECONDS", "after_publish", "clear", "entries", "info", "limit_bytes", "touch", "trim"]
