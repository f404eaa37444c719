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


class Metal4UnavailableError(RuntimeError):
    """A kernel with Metal 4 tensor operations (metal4) launched where the runtime cannot compile
    MSL 4.0 (macOS before 26, or a torch / MLX that does not request MSL 4.0)."""


class UnsupportedHostError(ImportError):
    """The installed tilelang is outside the supported range (raised when the plugin activates)."""
