"""Small helpers to build the TIR that the GEMM lowering returns (plain nodes, no parser magic).

The matrix calls themselves are built by `tilelang_metal.core.intrinsics`. Lane and simdgroup ids are
plain `tx % 32` / `tx // 32` (see transform/simdgroup_indices.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..host import tir

INT32 = "int32"


def seq(stmts: Iterable[Any]) -> Any:
    flat = [s for s in stmts if s is not None]
    if not flat:
        return tir.Evaluate(0)
    return flat[0] if len(flat) == 1 else tir.SeqStmt(flat)


def local_buffer(name: str, count: int, dtype: str) -> Any:
    return tir.decl_buffer((count,), dtype, name=name, scope="local")


def flat_view(buffer: Any, count: int, name: str) -> Any:
    """A 1-D local view over an existing buffer's storage (used for fragment accumulators)."""
    return tir.decl_buffer((count,), buffer.dtype, name=name, data=buffer.data, scope="local")



def guarded(cond: Any | None, value: Any, dtype: str) -> Any:
    if cond is None:
        return value
    return tir.if_then_else(cond, value, tir.const(0, dtype))


def cast(value: Any, dtype: str) -> Any:
    return value if str(value.dtype) == dtype else tir.Cast(dtype, value)


def as_block_func(body: Any, allocs: list[Any], name: str) -> Any:
    """Wrap a lowered GEMM body the way tilelang's GemmNode::Lower expects (a PrimFunc with a block)."""
    block = tir.SBlock([], [], [], name, body, alloc_buffers=allocs)
    func = tir.PrimFunc([], tir.SBlockRealize([], True, block))
    return func.with_attr("global_symbol", name)
