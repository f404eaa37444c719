"""Find TIR nodes of given types without a Python callback per node (lowering-time budget)."""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..host import vocab


def find_nodes(stmt: Any, type_keys: list[str]) -> list[Any]:
    """All nodes whose type key is in `type_keys`, in post order. The traversal runs in C++ and
    calls back into Python only for matching nodes."""
    found: list[Any] = []

    def collect(node: Any) -> None:
        found.append(node)
        return None  # keep the node unchanged

    tvm.tirx.stmt_functor.ir_transform(stmt, None, collect, type_keys)
    return found


def declared_element_counts(body: Any) -> dict[Any, int]:
    """Element count of each buffer declared over a data variable (views into merged pools)."""
    out: dict[Any, int] = {}
    for node in find_nodes(body, [vocab.TIRX_DECLBUFFER]):
        count = 1
        for dim in node.buffer.shape:
            if not isinstance(dim, tir.IntImm):
                break
            count *= int(dim.value)
        else:
            out[node.buffer.data] = max(count, out.get(node.buffer.data, 0))
    return out
