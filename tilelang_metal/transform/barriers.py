"""Barrier statements as the plugin's passes build and recognise them: `tvm_storage_sync(scope)`,
printed as `threadgroup_barrier(...)` (scope "shared" / "shared.dyn": threadgroup memory; "global":
device and threadgroup memory) or `simdgroup_barrier` ("warp")."""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..core.scopes import SHARED_SCOPES
from ..host import vocab


def storage_sync(scope: str) -> Any:
    return tir.Evaluate(tir.call_intrin("int32", vocab.TIRX_TVM_STORAGE_SYNC, tir.StringImm(scope)))


def sync_scope(stmt: Any) -> str | None:
    """The scope of a `tvm_storage_sync` statement; None for any other statement."""
    if isinstance(stmt, tir.Evaluate) and isinstance(stmt.value, tir.Call) and str(getattr(stmt.value.op, "name", "")) == vocab.TIRX_TVM_STORAGE_SYNC:
        return str(stmt.value.args[0].value)
    return None


def is_threadgroup_barrier(stmt: Any) -> bool:
    """A barrier that orders threadgroup memory only (one that orders device memory too is not)."""
    return sync_scope(stmt) in SHARED_SCOPES


def merge_adjacent_barriers(stmt: Any) -> Any:
    """`stmt` with one barrier where two follow each other in a sequence (nested sequences
    flattened): nothing runs between them, so the second orders nothing the first did not. The one
    kept has the wider scope (a device-memory barrier orders threadgroup memory too)."""

    def merge(seq: Any) -> Any:
        flat: list[Any] = []
        for item in seq.seq:
            flat.extend(item.seq if isinstance(item, tir.SeqStmt) else [item])
        kept: list[Any] = []
        for item in flat:
            scope = sync_scope(item)
            previous = sync_scope(kept[-1]) if kept else None
            if scope not in (None, "warp") and previous not in (None, "warp"):
                if scope == "global":
                    kept[-1] = item
                continue
            kept.append(item)
        if len(kept) == len(seq.seq) and len(flat) == len(seq.seq):
            return None
        return kept[0] if len(kept) == 1 else tir.SeqStmt(kept)

    return tvm.tirx.stmt_functor.ir_transform(stmt, None, merge, [vocab.TIRX_SEQSTMT])
