"""Errors the plugin raises for bad input, at lower time, with the problem and the fix in the text."""

from __future__ import annotations


class MetalLoweringError(ValueError):
    """A kernel the Metal backend cannot lower as written."""


class GemmLoweringError(MetalLoweringError):
    """A `T.gemm` call the Metal backend cannot lower as written."""


class CodegenError(MetalLoweringError):
    """TIR that the MSL printer does not support."""
