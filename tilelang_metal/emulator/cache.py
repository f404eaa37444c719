"""Size limit of the emulator's build cache: least-recently-used entries are evicted.

An entry is what one build publishes: a kernel library (`kernels/NAME-KEY.so` with its `.cpp`),
a runtime object (`runtime/KEY.o`), a precompiled prelude (`prelude/KEY/`) or a syntax-check stamp
(`syntax/NAME-KEY.ok`). Every use of an entry sets its modification time (`touch`), so the mtime
is the time of last use. After a new build the cache is trimmed to 90% of its limit
(`config.emulator_cache_mb()`), oldest use first, whenever this process's estimate of the size
passes the limit (see `after_publish`).

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
RESCAN_SECONDS = 300.0  # a process rescans the cache at least this often while it builds


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


def _dir_size(path: str) -> int:
    total = 0
    try:
        with os.scandir(path) as it:
            for item in it:
                try:
                    total += _dir_size(item.path) if item.is_dir(follow_symlinks=False) else item.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    pass
    except FileNotFoundError:
        pass
    return total


def entries(root: Path) -> list[Entry]:
    """Every published entry under `root` (in-progress `.build-*` directories excluded). One
    `stat` per file (a few thousand entries scan in well under a second)."""
    found: list[Entry] = []
    for section in SECTIONS:
        groups: dict[str, list[tuple[Path, int, float]]] = {}
        try:
            with os.scandir(root / section) as it:
                for item in it:
                    if item.name.startswith("."):
                        continue
                    try:
                        st = item.stat(follow_symlinks=False)
                        size = _dir_size(item.path) if item.is_dir(follow_symlinks=False) else st.st_size
                    except FileNotFoundError:
                        continue  # evicted by another process meanwhile
                    stem = item.name.rsplit(".", 1)[0] if section == "kernels" else item.name
                    groups.setdefault(stem, []).append((Path(item.path), size, st.st_mtime))
        except FileNotFoundError:
            continue
        for items in groups.values():
            key = next((i for i in items if i[0].suffix == ".so"), items[0])
            found.append(Entry(key[0], tuple(p for p, _, _ in items), sum(size for _, size, _ in items), key[2]))
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


# This process's running estimate of the cache size: (bytes, time of the scan it started from).
_estimate: tuple[int, float] | None = None


def after_publish(root: Path, published: Path) -> None:
    """Called after each new build: keep the cache within its limit. A scan of the cache costs a
    fraction of a second for thousands of entries, so a process scans (and trims) only when its
    running estimate (last scan + what it built since) passes the limit, or when its last scan is
    older than RESCAN_SECONDS (other processes build too). The limit is therefore soft: it can be
    exceeded by what other processes build between two scans."""
    global _estimate
    limit = limit_bytes()
    now = time.time()
    added = _dir_size(str(published)) if published.is_dir() else _file_size(published)
    if _estimate is not None:
        size, scanned_at = _estimate
        if size + added <= limit and now - scanned_at < RESCAN_SECONDS:
            _estimate = (size + added, scanned_at)
            return
    trim(root, limit, now)
    _estimate = (sum(e.size for e in entries(root)), now)


def _file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


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
