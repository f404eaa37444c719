"""Lowering of the tile ops tilelang has no Metal implementation for (one module per op) and the
pass that applies them (`LowerMetalTileOps`, placed before LowerTileOp in the pipeline)."""

from .lower_tile_ops import LowerMetalAtomicTileOps, LowerMetalTileOps

__all__ = ["LowerMetalAtomicTileOps", "LowerMetalTileOps"]
