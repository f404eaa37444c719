"""Small helpers to build the TIR that the GEMM lowering returns (plain nodes, no parser magic).

The MSL printer recognises the `tlm_*` extern calls declared here; they are the whole vocabulary
between the GEMM lowering and the codegen. Lane and simdgroup ids are plain `tx % 32` / `tx // 32`
(see transform/simdgroup_indices.py).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._host import tir

# Matrix intrinsics (first argument is always the destination buffer's data var).
CT_MMA = "tlm_ct_mma"  # (C, c_chunk, A, a_offset, B, b_offset): C_chunk += A x B on a 16x32x16 matmul2d
SG_MMA = "tlm_sg_mma"  # (C, c_frag, A, a_frag, B, b_frag): simdgroup_multiply_accumulate
SG_LOAD = "tlm_sg_load"  # (X, frag, address, stride, transpose): simdgroup_load
SG_STORE = "tlm_sg_store"  # (X, frag, address, stride): simdgroup_store

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


def call(name: str, *args: Any) -> Any:
    return tir.Evaluate(tir.call_extern("handle", name, *args))


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
