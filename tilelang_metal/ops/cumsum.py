"""`T.cumsum` / `T.cummax` (tile ops `tl.cumsum`, `tl.cummax`) lowered to plain TIR for Metal.

TileLang stages fragment scans through shared memory, so the tile op always sees threadgroup (or
device) buffers. Every line along the scanned axis is one thread's serial scan: threads take lines
round-robin, accumulate in float32 for fp16/bf16, and write each prefix as they go (in place is
fine: a line's element is read before it is overwritten). ThreadSync puts the barriers around it;
when a kernel turns ThreadSync off (`tl.disable_thread_storage_sync`), the scan carries them itself
(`own_barriers`): its lines are spread over the threads in its own way, unlike the `T.copy` that
fills the buffer and the one that reads it (a fragment scan is staged through shared memory by
tilelang's frontend, where the kernel's author has no place for a `T.sync_threads`).
"""

from __future__ import annotations

from typing import Any

from ..host import tile_region, tir, tvm
from ..errors import MetalLoweringError
from ..core.scopes import SHARED_SCOPES
from ..transform.barriers import storage_sync
from .reduce import accumulator_dtype, combine, identity, is_seeded


def _line_indices(mins: list[Any], extents: list[int], dim: int, line: Any, k: Any) -> list[Any]:
    """Indices of element `k` of line `line` (lines enumerate the other axes row-major)."""
    indices: list[Any] = [None] * len(extents)
    rest = line
    for axis in reversed(range(len(extents))):
        if axis == dim:
            continue
        indices[axis] = mins[axis] + tvm.tirx.floormod(rest, extents[axis])
        rest = tvm.tirx.floordiv(rest, extents[axis])
    indices[dim] = mins[dim] + k
    return indices


def lower_cumsum(call: Any, name: str, tx: Any, threads: int, own_barriers: bool = False) -> tuple[Any, list[Any]]:
    src, dst = tile_region(call.args[0]), tile_region(call.args[1])
    dim, reverse = int(call.args[2].value), bool(call.args[3].value)
    what = "T.cumsum" if name == "cumsum" else "T.cummax"
    for region in (src, dst):
        if region.buffer.scope() in ("local", "local.fragment", "local.var"):
            raise MetalLoweringError(f"{what} on the register buffer {region.buffer.name}: stage it through shared memory")
    if len(src.extents) != len(src.mins) or len(dst.extents) != len(dst.mins):
        raise MetalLoweringError(f"{what}: give source and destination as whole buffers or full-rank slices")
    extents = []
    for a, b in zip(src.extents, dst.extents):
        if not (isinstance(a, tir.IntImm) and isinstance(b, tir.IntImm)) or int(a.value) != int(b.value):
            raise MetalLoweringError(f"{what}: source and destination need the same static extents, got {list(src.extents)} and {list(dst.extents)}")
        extents.append(int(a.value))
    if tx is None:
        raise MetalLoweringError(f"{what} needs a thread launch (T.Kernel(..., threads=N))")
    length = extents[dim]
    lines = 1
    for axis, n in enumerate(extents):
        if axis != dim:
            lines *= n
    acc_dtype = accumulator_dtype(src.buffer.dtype)
    kind = "sum" if name == "cumsum" else "max"
    acc = tir.decl_buffer((1,), acc_dtype, dst.buffer.name + "_scan", scope="local")

    def scan_line(line: Any) -> Any:
        k = tir.Var("scan_k", "int32")
        pos = (length - 1 - k) if reverse else k
        value = tir.BufferLoad(src.buffer, _line_indices(src.mins, extents, dim, line, pos))
        if str(value.dtype) != acc_dtype:
            value = tir.Cast(acc_dtype, value)
        total = combine(kind, tir.BufferLoad(acc, [0]), value)
        out: Any = tir.BufferLoad(acc, [0])
        if str(dst.buffer.dtype) != acc_dtype:
            out = tir.Cast(str(dst.buffer.dtype), out)
        step = tir.SeqStmt(
            [tir.BufferStore(acc, total, [0]), tir.BufferStore(dst.buffer, out, _line_indices(dst.mins, extents, dim, line, pos))]
        )
        # a float running max starts from the line's first element (combining it with itself changes
        # nothing), so leading NaNs scan to NaN as the NaN rule's fmax prefix fold does; -inf would win
        start = _first(line) if is_seeded(kind, acc_dtype) else identity(kind, acc_dtype)
        return tir.SeqStmt([tir.BufferStore(acc, start, [0]), tir.For(k, 0, length, tir.ForKind.SERIAL, step)])

    def _first(line: Any) -> Any:
        value = tir.BufferLoad(src.buffer, _line_indices(src.mins, extents, dim, line, length - 1 if reverse else 0))
        return tir.Cast(acc_dtype, value) if str(value.dtype) != acc_dtype else value

    rounds = -(-lines // threads)
    round_var = tir.Var("scan_round", "int32")
    line = round_var * threads + tx
    body: Any = scan_line(line)
    if lines % threads:
        body = tir.IfThenElse(line < lines, body, None)
    scan: Any = tir.For(round_var, 0, rounds, tir.ForKind.SERIAL, body)
    if own_barriers and any(str(r.buffer.scope()) in SHARED_SCOPES for r in (src, dst)):
        scan = tir.SeqStmt([storage_sync("shared"), scan, storage_sync("shared")])
    return scan, [acc]
