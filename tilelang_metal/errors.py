"""Errors the plugin raises for bad input, with the problem and the fix in the text.

Nothing here imports tilelang: `except tilelang_metal.UnsupportedHostError` works before tilelang is
imported, and the classes are registered with TVM's FFI only at activation.
"""

from __future__ import annotations


class MetalLoweringError(ValueError):
    """A kernel the Metal backend cannot lower as written."""


class GemmLoweringError(MetalLoweringError):
    """A `T.gemm` call the Metal backend cannot lower as written."""


class CodegenError(MetalLoweringError):
    """TIR that the MSL printer does not support."""


class ConfigError(ValueError):
    """A `TILELANG_METAL_*` environment variable has a value the plugin does not accept."""


class UnsupportedHostError(ImportError):
    """The installed tilelang is outside the supported range (raised when the plugin activates)."""
