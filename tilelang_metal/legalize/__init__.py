"""The late MSL legalization: the plugin passes that turn lowered TIR into TIR the printer spells
one node at a time. `pipeline.finalize_for_codegen` runs them last, after tilelang's own pre-codegen
passes (LowerIntrin, Simplify, HoistBroadcastValues), which would undo or re-merge their output."""

from __future__ import annotations

from .element_atomics import LowerAtomics
from .segmented_shuffles import LowerShuffleWidths
from .vector_split import SplitWideVectors
from .wide_copies import UseWideCopies

__all__ = ["LowerAtomics", "LowerShuffleWidths", "SplitWideVectors", "UseWideCopies"]
