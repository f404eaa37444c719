"""Run a callback (the plugin's activation) as soon as `tilelang` has been imported.

`import tilelang_metal` must stay cheap (no tilelang, no torch), yet every use of tilelang after it
must see the plugin active. `when_imported(callback)` runs `callback` at once if tilelang is
already imported. Otherwise it puts a finder at the front of `sys.meta_path` that wraps the loader
of `tilelang`, so the callback runs right after the module body has executed, before `import
tilelang` returns. The finder removes itself once the callback has run.

One subtlety: when the import of tilelang comes from inside one of the plugin's own modules (say
`tilelang_metal.codegen.build` imports `host`, which imports tilelang), those modules are still
half-initialized, and activation needs them. While pending, the finder therefore also counts
`tilelang_metal.*` imports in progress (per thread) and, in that case, runs the callback when the
outermost one completes.

If the callback raises, the error propagates out of the import that triggered it (a failed
activation is never silent) and the finder stays, so a later import tries again.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

HOST_MODULE = "tilelang"
PLUGIN_PREFIX = __name__.rsplit(".", 1)[0] + "."  # "tilelang_metal."

_lock = threading.RLock()
_finder: _PostImportFinder | None = None


class _WrappedLoader(importlib.abc.Loader):
    """Delegates to the real loader; calls `before()` / `after(ok)` around the module body."""

    def __init__(self, loader: Any, before: Callable[[], None], after: Callable[[bool], None]) -> None:
        self._loader = loader
        self._before = before
        self._after = after

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._before()
        ok = False
        try:
            self._loader.exec_module(module)
            ok = True
        finally:
            self._after(ok)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, get_resource_reader, ...
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, callback: Callable[[], Any]) -> None:
        self._callback = callback
        self._local = threading.local()  # .searching (re-entrancy guard), .depth, .deferred

    def find_spec(self, fullname: str, path: Any, target: ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        watched = fullname == HOST_MODULE or fullname.startswith(PLUGIN_PREFIX)
        if not watched or getattr(self._local, "searching", False):
            return None
        self._local.searching = True
        try:
            spec = _find_with_other_finders(self, fullname, path, target)
        finally:
            self._local.searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        if fullname == HOST_MODULE:
            spec.loader = _WrappedLoader(spec.loader, lambda: None, self._host_imported)
        else:
            spec.loader = _WrappedLoader(spec.loader, self._enter_plugin_module, self._leave_plugin_module)
        return spec

    def _depth(self) -> int:
        return getattr(self._local, "depth", 0)

    def _enter_plugin_module(self) -> None:
        self._local.depth = self._depth() + 1

    def _leave_plugin_module(self, ok: bool) -> None:
        self._local.depth = self._depth() - 1
        if ok and self._local.depth == 0 and getattr(self._local, "deferred", False):
            self._local.deferred = False
            self.fire()

    def _host_imported(self, ok: bool) -> None:
        if not ok:
            return
        if self._depth() > 0:  # a plugin module is half-imported on this thread: wait for it
            self._local.deferred = True
            return
        self.fire()

    def fire(self) -> None:
        with _lock:
            if _finder is not self:  # already fired (or cancelled), maybe by another thread
                return
            _remove(self)
        try:
            self._callback()  # outside the lock: the callback imports modules (import locks)
        except BaseException:
            _install(self)  # keep the promise: a later import tries again
            raise


def _find_with_other_finders(me: _PostImportFinder, fullname: str, path: Any, target: ModuleType | None) -> importlib.machinery.ModuleSpec | None:
    for finder in list(sys.meta_path):
        if finder is me or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


def _remove(finder: _PostImportFinder) -> None:
    global _finder
    with _lock:
        try:
            sys.meta_path.remove(finder)
        except ValueError:
            pass
        if _finder is finder:
            _finder = None


def _install(finder: _PostImportFinder) -> None:
    global _finder
    with _lock:
        if _finder is None:
            _finder = finder
            sys.meta_path.insert(0, finder)


def when_imported(callback: Callable[[], Any]) -> bool:
    """Run `callback` now if tilelang is imported, else as soon as it is. Returns True if it ran now.

    Only one callback can be pending; a second call while one is pending is a no-op."""
    finder = _PostImportFinder(callback)
    _install(finder)  # before looking at sys.modules: a concurrent import cannot slip in between
    if HOST_MODULE in sys.modules and _finder is finder:
        finder.fire()
        return True
    return False


def pending() -> bool:
    """True while a callback waits for tilelang to be imported."""
    return _finder is not None


def cancel() -> None:
    """Drop a pending callback (activation was requested or refused explicitly)."""
    with _lock:
        if _finder is not None:
            _remove(_finder)
