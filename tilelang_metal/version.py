"""Single source of the plugin version and of the tilelang versions it supports."""

__version__ = "0.1.0"

SUPPORTED_TILELANG = ((0, 1, 15), (0, 2, 0))  # [lower, upper)
SUPPORTED_RANGE_TEXT = "tilelang>=0.1.15,<0.2"
