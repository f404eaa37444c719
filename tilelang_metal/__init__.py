"""tilelang_metal: a Metal backend for stock TileLang, loaded as a plugin.

`import tilelang_metal` is cheap (it imports neither tilelang nor torch) and arranges activation:
at once if tilelang is already imported, otherwise right after `import tilelang` finishes (a
post-import hook, `autoload.py`). From then on every `target="metal"` compilation goes through the
plugin's target normalization, instruction selection, GEMM lowering, pass pipeline and MSL codegen.
The tilelang version guard runs before activation. `deactivate()` restores the in-tree backend
exactly. Set TILELANG_METAL_AUTOLOAD=0 to import without activating (docs/configuration.md).
"""

from __future__ import annotations

import sys
from typing import Any

from . import autoload, config
from .errors import CodegenError, ConfigError, GemmLoweringError, Metal4UnavailableError, MetalLoweringError, UnsupportedHostError
from .version import SUPPORTED_RANGE_TEXT, __version__

__all__ = [
    "__version__",
    "activate",
    "deactivate",
    "active",
    "MetalLoweringError",
    "GemmLoweringError",
    "CodegenError",
    "ConfigError",
    "Metal4UnavailableError",
    "UnsupportedHostError",
    "SUPPORTED_RANGE_TEXT",
    "check_host_version",
]


def activate() -> bool:
    """Route `target="metal"` through the plugin (imports tilelang; the version guard runs first).
    Idempotent; returns True if this call activated it."""
    autoload.cancel()  # activating now: a pending post-import hook must not re-enter this import
    from . import host as _host
    from .lowering_cache import take_baseline_if_on
    from .plugin import build_hooks

    installed = _host.install(build_hooks())
    take_baseline_if_on()  # the lowering code as written, before anyone wraps or patches it
    return installed


def deactivate() -> bool:
    """Restore the in-tree Metal backend and everything the plugin replaced. Idempotent. Also drops
    a pending activation when tilelang has not been imported yet (returns False then)."""
    autoload.cancel()
    if __name__ + ".host" not in sys.modules:
        return False
    from . import host as _host

    return _host.uninstall()


def active() -> bool:
    """True when the plugin's hooks are installed in tilelang (never imports tilelang itself)."""
    host = sys.modules.get(__name__ + ".host")
    return host is not None and host.is_installed()


def __getattr__(name: str) -> Any:
    if name == "check_host_version":  # needs tilelang: imported on first use only
        from .host import check_host_version

        return check_host_version
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if config.autoload():
    autoload.when_imported(activate)
