"""Barrier statements as the plugin's passes build and recognise them: `tvm_storage_sync(scope)`,
printed as `threadgroup_barrier(...)` (scope "shared" / "shared.dyn": threadgroup memory; "global":
device and threadgroup memory) or `simdgroup_barrier` ("warp")."""

from __future__ import annotations

from typing import Any

from ..host import tir
from ..scopes import SHARED_SCOPES
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
