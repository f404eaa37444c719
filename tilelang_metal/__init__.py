"""tilelang_metal: a Metal backend for stock TileLang, loaded as a plugin.

`import tilelang_metal` activates it: from then on every `target="metal"` compilation goes through
the plugin's target normalization, instruction selection, GEMM lowering, pass pipeline and MSL
codegen. `deactivate()` restores the in-tree backend exactly. Set TILELANG_METAL_AUTOLOAD=0 to
import without activating.
"""

from __future__ import annotations

import os

from ._host import SUPPORTED_RANGE_TEXT, UnsupportedHostError, check_host_version  # version guard runs here
from ._host import register_error_types
from .errors import CodegenError, GemmLoweringError, MetalLoweringError
from .version import __version__

register_error_types(MetalLoweringError, GemmLoweringError, CodegenError)

__all__ = [
    "__version__",
    "activate",
    "deactivate",
    "active",
    "MetalLoweringError",
    "GemmLoweringError",
    "CodegenError",
    "UnsupportedHostError",
    "SUPPORTED_RANGE_TEXT",
    "check_host_version",
]


def activate() -> bool:
    """Route `target="metal"` through the plugin. Idempotent; returns True if this call activated it."""
    from . import _host
    from .plugin import build_hooks

    return _host.install(build_hooks())


def deactivate() -> bool:
    """Restore the in-tree Metal backend and everything the plugin replaced. Idempotent."""
    from . import _host

    return _host.uninstall()


def active() -> bool:
    from . import _host

    return _host.is_installed()


if os.environ.get("TILELANG_METAL_AUTOLOAD", "1") != "0":
    activate()
