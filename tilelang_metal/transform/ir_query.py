"""Find TIR nodes of given types without a Python callback per node (declared in ir_attrs.py,
which the printer shares; re-exported here for the passes)."""

from __future__ import annotations

from ..ir_attrs import declared_element_counts, find_nodes

__all__ = ["declared_element_counts", "find_nodes"]
