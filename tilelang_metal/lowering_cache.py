"""The optional on-disk cache of lowered modules (`TILELANG_METAL_LOWERING_CACHE`, off by default).

Lowering is most of the time a compile takes once the emulator's build cache is warm (tilelang's
C++ passes and their Z3 proofs: 0.3 s for a GEMM, seconds for a kernel with ten reductions). The
pass pipeline is a function of what the key below holds, so its result can be kept; so is that of
tilelang's passes preparing the device module for the codegen hook (`caching_device_preparation`),
which run after every lowering, a hit too (their Simplify: seconds for an attention kernel):

- the input module, serialized whole (`tvm.ir.save_json`: every node, attribute and annotation,
  deterministic across processes);
- the target, the lowering options (all fields), the current PassContext's config;
- tilelang's and the plugin's versions and a hash of the plugin's sources.

The code must be the code as written: `take_baseline()` (`activate()` runs it when the cache is
on) records the functions, classes and instructions the lowering modules hold, and while any of
them is another object (a test's monkeypatch, `REGISTRY.substituted`) lowerings neither read nor
write the cache.
Nor while something observes the lowering: GEMM-plan recorders (`gemm.recorded_plans`),
`TILELANG_METAL_DEBUG` logging, PassContext instruments. A lowering that raises stores nothing. An
entry that cannot be read is deleted and the module is lowered again. Entries are written to a
temporary file and renamed, so concurrent processes (pytest-xdist workers) publish whole files.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import sys
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import config
from .version import __version__

FORMAT = "1"  # bump when what an entry holds changes
_STATS = {"hits": 0, "misses": 0, "bypassed": 0}
_PREPARATION_STATS = {"hits": 0, "misses": 0, "bypassed": 0}


def stats() -> dict[str, int]:
    """This process's hits, misses and bypassed lowerings (for tests and benchmarks)."""
    return dict(_STATS)


def preparation_stats() -> dict[str, int]:
    """The same for the device preparations (`caching_device_preparation`)."""
    return dict(_PREPARATION_STATS)


_PACKAGE_ROOT = Path(__file__).resolve().parent


@functools.cache
def _source_files() -> tuple[tuple[Path, str], ...]:
    """Each Python file of the plugin, with its module name (`tilelang_metal.gemm` for
    `gemm/__init__.py`), in a fixed order."""
    files = []
    for path in sorted(_PACKAGE_ROOT.rglob("*.py")):
        parts = path.relative_to(_PACKAGE_ROOT).with_suffix("").parts
        files.append((path, ".".join(("tilelang_metal", *(parts[:-1] if parts[-1] == "__init__" else parts)))))
    return tuple(files)


@functools.cache
def source_fingerprint() -> str:
    """Hash of the plugin's own Python sources: an edited checkout never reuses stale kernels."""
    digest = hashlib.sha256()
    for path, _ in _source_files():
        digest.update(path.relative_to(_PACKAGE_ROOT).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


# Modules that do not run inside the cached passes: what runs after the lowered module exists
# (launching, emulating; tests patch them, and the race-check tier swaps the emulator adapter's
# runner), and what builds the input or drives compiles from above (its work is in the key).
_NOT_LOWERING = ("tilelang_metal.emulator", "tilelang_metal.execution", "tilelang_metal.kernels",
                 "tilelang_metal.tuning.autotune", "tilelang_metal.cli", "tilelang_metal.__main__")
_baseline: dict[str, dict[str, Any]] = {}  # module -> {attribute: the object it held when taken}
_registry_baseline: tuple[Any, ...] = ()


def _takes_part(name: str) -> bool:
    if not (name == "tilelang_metal" or name.startswith("tilelang_metal.")):
        return False
    return not any(name == prefix or name.startswith(prefix + ".") for prefix in _NOT_LOWERING)


def _members(module: Any) -> dict[str, Any]:
    """The functions and classes `module` holds, and the members of the classes it defines."""
    held: dict[str, Any] = {}
    for attr, value in vars(module).items():
        if isinstance(value, type):
            held[attr] = value
            if value.__module__ == module.__name__:
                held.update({f"{attr}.{member}": inner for member, inner in vars(value).items() if callable(inner)
                             or isinstance(inner, (staticmethod, classmethod, property))})
        elif callable(value):
            held[attr] = value
    return held


def take_baseline() -> None:
    """Record the functions, classes and instructions the lowering modules hold now as the code as
    written. `activate()` takes it; a test harness that wraps plugin functions for all its tests
    takes it again after doing so. A lowering while anything differs from it is not cached."""
    import importlib

    global _registry_baseline
    for _, name in _source_files():
        if _takes_part(name):
            importlib.import_module(name)  # every lowering module is in the baseline before any test runs
    _baseline.clear()
    for name in [n for n in sys.modules if _takes_part(n)]:
        if sys.modules[name] is not None:
            _baseline[name] = _members(sys.modules[name])
    from .target.isa import REGISTRY

    _registry_baseline = tuple(REGISTRY)


def take_baseline_if_on() -> None:
    """`activate()`'s part: the baseline, when the cache is on (otherwise nothing is imported or
    walked; a cache turned on later takes it at its first lowering)."""
    if config.lowering_cache() is not None:
        take_baseline()


def patched() -> str | None:
    """The first function, class or instruction of the lowering modules that is not the one the
    baseline recorded (a test's monkeypatch, `REGISTRY.substituted`), or None."""
    from .target.isa import REGISTRY

    if not _baseline:
        take_baseline()
    for name in [n for n in sys.modules if _takes_part(n)]:
        module = sys.modules[name]
        if module is None:
            continue
        now = _members(module)
        recorded = _baseline.setdefault(name, now)  # imported since the baseline: its state now is its own
        for attr, value in now.items():
            if recorded.get(attr, value) is not value:
                return f"{name}.{attr}"
    current = tuple(REGISTRY)
    if len(current) != len(_registry_baseline) or any(a is not b for a, b in zip(current, _registry_baseline)):
        return "isa.REGISTRY"
    return None


def _observed(debug: bool, instrumented: bool) -> bool:
    """Something would miss what a skipped lowering does, or the code is not as written."""
    from .gemm import plans_are_recorded

    return debug or plans_are_recorded() or instrumented or patched() is not None


def entry_key(mod_json: str, target: Any, options: Any, pass_config: list[tuple[str, str]], stage: str = "lowering") -> str:
    """The key of `stage` (the plugin's lowering, or tilelang's device preparation, which takes no
    lowering options) run on the module serialized as `mod_json` under the PassContext config
    `pass_config` (sorted pairs)."""
    import tilelang

    export = target.export() if hasattr(target, "export") else str(target)
    parts = {
        "format": FORMAT,
        "tilelang": getattr(tilelang, "__version__", "?"),
        "plugin": __version__,
        "sources": source_fingerprint(),
        "target": json.dumps(export, sort_keys=True, default=str),
        "options": options.to_json() if options is not None else None,
        "pass_config": pass_config,
        "stage": stage,
    }
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode())
    digest.update(b"\0")
    digest.update(mod_json.encode())
    return digest.hexdigest()


def cached_lowering(mod: Any, target: Any, options: Any, lower: Callable[[Any, Any, Any], Any]) -> Any:
    """`lower(mod, target, options)`, or the module a previous identical lowering stored."""
    root = config.lowering_cache()
    if root is None:
        return lower(mod, target, options)
    return _through_cache(root, mod, lambda: lower(mod, target, options), target, options, options.debug, _LOWERING)


def caching_device_preparation(prepare: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """tilelang's passes between the host/device split and the device codegen (LowerIntrin,
    Simplify, HoistBroadcastValues) on a Metal device module, through the cache: they run after
    every lowering, a hit too, and their Simplify took 2.4 s of an attention kernel's 2.6 s compile
    once its lowering was a hit."""

    def prepared(device_mod: Any) -> Any:
        from .host import device_target, tir

        root = config.lowering_cache()
        target = device_target(device_mod) if root is not None else None
        # the options lower_metal stamped: none on a module the plugin did not lower
        options = config.stamped([f for f in device_mod.functions.values() if isinstance(f, tir.PrimFunc)]) if target else None
        if options is None or target.kind.name != "metal":
            return prepare(device_mod)
        return _through_cache(root, device_mod, lambda: prepare(device_mod), target, options, options.debug, _PREPARATION)

    return prepared


class _Stage:
    """What is cached: its name in the key, its entries' file suffix, its counters, and whether a
    hit's variables are swapped for the caller's (a lowered module's host code names the caller's
    parameters; a device module shares no variable with its host, which calls it by name)."""

    def __init__(self, name: str, suffix: str, counts: dict[str, int], rebind: bool) -> None:
        self.name, self.suffix, self.counts, self.rebind = name, suffix, counts, rebind


_LOWERING = _Stage("lowering", ".json.z", _STATS, rebind=True)
_PREPARATION = _Stage("device preparation", ".device.z", _PREPARATION_STATS, rebind=False)


def _through_cache(root: Path, mod: Any, run: Callable[[], Any], target: Any, options: Any, debug: bool, stage: _Stage) -> Any:
    """`run()` (`stage` on `mod`), or the module a previous identical run stored."""
    from .host import module_from_json, module_to_json, pass_context_state

    pass_config, instrumented = pass_context_state()
    if _observed(debug, instrumented):
        stage.counts["bypassed"] += 1
        return run()
    key = entry_key(module_to_json(mod), target, options, pass_config, stage.name)
    # one directory per version of the plugin's sources: entries of an edited checkout can never be
    # read again, so all but the KEPT_VERSIONS most recently used versions are deleted
    version_dir = root / source_fingerprint()
    path = version_dir / key[:2] / f"{key[2:34]}{stage.suffix}"
    try:
        text = zlib.decompress(path.read_bytes()).decode()
    except FileNotFoundError:
        text = None
    except (OSError, zlib.error, UnicodeDecodeError):
        _forget(path)  # unreadable: lowered again below and written anew
        text = None
    if text is not None:
        try:
            stored = module_from_json(text)
            lowered = _rebound(stored, mod) if stage.rebind else stored[1]
        except Exception:  # noqa: BLE001 - a damaged entry is a miss, never an error
            _forget(path)
        else:
            stage.counts["hits"] += 1
            try:
                os.utime(version_dir)  # recently used: kept by _drop_old_versions
            except OSError:
                pass
            return lowered
    stage.counts["misses"] += 1
    lowered = run()
    if not version_dir.exists():
        _drop_old_versions(root)
    # stored with its input: the variables they share (parameters, buffer data, shape variables)
    # come back shared, and are then swapped for the caller's own
    _publish(path, zlib.compress(module_to_json(mod, lowered).encode(), 1))
    return lowered


def _rebound(stored: Any, mod: Any) -> Any:
    """The stored lowered module with the variables it shares with its stored input replaced by
    the caller's: the host's call sites then name the caller's own parameters (the adapters match
    kernel arguments to parameters by identity)."""
    from .host import paired_free_vars, rebind_vars, tir

    stored_input, lowered = stored[0], stored[1]
    mapping = paired_free_vars(stored_input, mod)
    for gv, func in list(lowered.functions.items()):
        if isinstance(func, tir.PrimFunc):
            lowered.update_func(gv, rebind_vars(func, mapping))
    return lowered


KEPT_VERSIONS = 3  # source versions kept (switching between a few branches stays warm)


def _drop_old_versions(root: Path) -> None:
    """Delete the entries of all but the KEPT_VERSIONS - 1 most recently used source versions (a
    new one is about to be written): the cache then holds a few suite runs' worth at most."""
    import shutil

    try:
        versions = sorted((d for d in root.iterdir() if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:
        return
    for old in versions[KEPT_VERSIONS - 1:]:
        shutil.rmtree(old, ignore_errors=True)  # another process may be reading it: a miss there, no error


def _forget(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass  # not even removable (the cache path is not a directory): the miss stays a miss


def _publish(path: Path, data: bytes) -> None:
    """Write an entry whole or not at all; a cache that cannot be written (read-only, full) costs
    the next lowering, never this compile."""
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".part-", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)  # atomic: readers see the old state or the whole entry
    except OSError:
        if tmp is not None:
            _forget(Path(tmp))
