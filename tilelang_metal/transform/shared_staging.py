"""`BypassSharedStaging`: shared buffers that only stage a `T.gemm` operand are dropped, and the
`T.gemm` reads its operands from global memory (the spec's direct-global path, section 5.5).

A shared buffer is *staging only* when all of these hold:
- it is written once, by a `T.copy` from a global buffer of the same dtype, of the buffer's whole shape,
  in the same statement sequence as the `T.gemm` and before it (the same loop body);
- it is read once, by that `T.gemm`, as its whole A or B operand;
- nothing else reads or writes it, and `T.annotate_layout` gives it no layout;
- the global source is not written anywhere in the kernel.
`T.copy` zero-fills outside the source buffer and the direct-global GEMM reads zeros there, so the
results are the same. A `T.gemm` is rewritten only when both A and B are staging only (one operand
in shared memory and one in global is not a Metal GEMM dataflow).

Where it applies (`TILELANG_METAL_STAGING_BYPASS=1`, the default, and the kernel does not carry
the `KEEP_STAGING_ATTR` attribute):
- `metal4`: always; no threadgroup memory, copies or barriers remain for those operands (TileLang's
  standard 128x128x32 GEMM with 3 stages needs 48 KiB of staging and would be refused);
- plain `metal` (simdgroup matrices): the staging is kept while it fits the 32 KiB of threadgroup
  memory, with fewer `T.Pipelined` stages if that is what it takes; only when even one stage does not
  fit does the `T.gemm` load its simdgroup matrices straight from device memory.
A pipelined loop left without staging copies loses its pipelining annotation. Every decision is
recorded on the function for `--explain` (`ir_attrs.DECISIONS_ATTR`; the reasons a staging is kept
also in `ir_attrs.STAGING_KEPT_ATTR`, for the threadgroup-memory refusal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..target.capabilities import TargetCapabilities
from ..core.ir_attrs import STAGING_KEPT_ATTR, find_nodes, with_decisions
from ..config import LoweringOptions
from ..host import annotated_layout_vars, pipeline_stages, tile_op_name, tile_region, tir, tvm, with_call_annotations, with_pipeline_stages
from ..planning import STAGING_BYPASS_ANNOTATION
from ..target.limits import THREADGROUP_MEMORY_BYTES
from ..core.scopes import GLOBAL_SCOPES, SHARED_SCOPES
from ..gemm.problem import tile_view_refusal
from ..host import vocab

# A PrimFunc attribute: keep this kernel's shared staging as written, whatever the bypass setting
# (`keep_shared_staging(func)`; the autotuner's shared-path configurations use it).
KEEP_STAGING_ATTR = "tilelang_metal.keep_shared_staging"


def keep_shared_staging(func: Any) -> Any:
    """`func` marked so that the staging bypass leaves its shared buffers alone."""
    return func.with_attr(KEEP_STAGING_ATTR, True)


@dataclass(frozen=True)
class StagingDecision:
    """One `T.gemm` with shared operands: bypassed, kept (and why), or kept with fewer stages."""

    gemm: str  # "T.gemm(A_s, B_s, C_acc)"
    action: str  # "bypass" | "keep" | "fewer_stages"
    reason: str

    def describe(self) -> str:
        if self.action == "bypass":
            return f"shared staging bypass: {self.gemm} reads A and B from global memory; the staging buffers, their T.copy and barriers are gone; because {self.reason}"
        if self.action == "fewer_stages":
            return f"shared staging kept with fewer pipeline stages: {self.gemm}; because {self.reason}"
        return f"shared staging kept: {self.gemm}; because {self.reason}"


@dataclass(frozen=True)
class _Staging:
    buffer: Any
    copy: Any  # the T.copy statement (an Evaluate)
    source: Any  # the T.copy's source region argument


def _gemm_name(call: Any) -> str:
    names = [tile_region(call.args[i]).buffer.name for i in range(3)]
    return f"T.gemm({', '.join(names)})"


def _bytes(buffer: Any) -> int:
    count = 1
    for dim in buffer.shape:
        count *= int(dim)
    return count * tvm.DataType(str(buffer.dtype)).bits // 8


class _Kernel:
    """What the decisions need to know about one kernel body."""

    def __init__(self, body: Any):
        self.body = body
        self.refs: dict[Any, int] = {}
        for node in find_nodes(body, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE]):
            self.refs[node.buffer.data] = self.refs.get(node.buffer.data, 0) + 1
        self.written: set = set()  # data vars of buffers some statement writes
        for node in find_nodes(body, [vocab.TIRX_BUFFERSTORE]):
            self.written.add(node.buffer.data)
        for call in find_nodes(body, [vocab.TIRX_CALL]):
            if str(getattr(call.op, "name", "")) in (vocab.TL_TILEOP_REGION, vocab.REGION_OP) and int(call.args[1]) & 2:
                self.written.add(call.args[0].buffer.data)
        self.annotated: set = set()
        self.shared_allocs: list[Any] = []
        for block in find_nodes(body, [vocab.TIRX_SBLOCK]):
            self.annotated.update(annotated_layout_vars(block))
            self.shared_allocs += [b for b in block.alloc_buffers if str(b.scope()) in SHARED_SCOPES]


def _staging_of(kernel: _Kernel, seq: list[Any], gemm_at: int, operand: Any) -> _Staging | str:
    """The staging of a T.gemm operand, or why it is not staging only."""
    region = tile_region(operand)
    buf = region.buffer
    name = buf.name
    if any(not (isinstance(m, tir.IntImm) and int(m) == 0) for m in region.mins) or [int(e) for e in region.extents] != [int(d) for d in buf.shape]:
        return f"the T.gemm reads a part of {name}"
    copies = []
    for stmt in seq[:gemm_at]:
        call = stmt.value if isinstance(stmt, tir.Evaluate) else None
        if call is not None and tile_op_name(call) == "copy" and tile_region(call.args[1]).buffer.same_as(buf):
            copies.append(stmt)
    if len(copies) != 1:
        return f"{name} is not written by one T.copy before the T.gemm in the same loop body"
    copy = copies[0].value
    if len(copy.args) != 2:
        return f"the T.copy into {name} has options"
    src, dst = tile_region(copy.args[0]), tile_region(copy.args[1])
    if str(src.buffer.scope()) not in GLOBAL_SCOPES:
        return f"{name} is copied from {src.buffer.name} in scope {src.buffer.scope()}, not from global memory"
    if str(src.buffer.dtype) != str(buf.dtype):
        return f"the T.copy into {name} casts {src.buffer.dtype} to {buf.dtype}"
    if any(not (isinstance(m, tir.IntImm) and int(m) == 0) for m in dst.mins) or [int(e) for e in dst.extents] != [int(d) for d in buf.shape]:
        return f"the T.copy writes a part of {name}"
    src_extents = [e for e in src.extents if not (isinstance(e, tir.IntImm) and int(e) == 1)] if len(src.extents) > len(buf.shape) else list(src.extents)
    if [int(e) if isinstance(e, tir.IntImm) else -1 for e in src_extents] != [int(d) for d in buf.shape]:
        return f"the T.copy into {name} reads a region of another shape"
    refusal = tile_view_refusal(src.buffer, src.mins, src.extents)
    if refusal is not None:
        return f"the T.gemm cannot read {src.buffer.name} in place of {name}: {refusal}"
    if kernel.refs.get(buf.data, 0) != 2:
        return f"{name} has readers or writers other than one T.copy and the T.gemm"
    if buf.data in kernel.annotated:
        return f"{name} has an annotated layout"
    if src.buffer.data in kernel.written:
        return f"{src.buffer.name} is written in the kernel"
    return _Staging(buf, copies[0], copy.args[0])


def _candidates(kernel: _Kernel) -> list[tuple[Any, Any, list[_Staging] | str]]:
    """(gemm statement, its sequence, stagings of A and B or the reason they are not) per T.gemm with
    a shared operand."""
    out = []
    for seq_node in find_nodes(kernel.body, [vocab.TIRX_SEQSTMT]):
        seq = list(seq_node.seq)
        for i, stmt in enumerate(seq):
            call = stmt.value if isinstance(stmt, tir.Evaluate) else None
            if call is None or tile_op_name(call) != "gemm":
                continue
            operands = [call.args[0], call.args[1]]
            if not any(str(tile_region(a).buffer.scope()) in SHARED_SCOPES for a in operands):
                continue
            dtypes = [str(tile_region(a).buffer.dtype) for a in operands]
            if dtypes[0] != dtypes[1]:  # left to the GEMM's own refusal, which names these buffers and the cast
                out.append((stmt, seq_node, f"A and B differ in dtype ({dtypes[0]}, {dtypes[1]})"))
                continue
            found = [_staging_of(kernel, seq, i, a) for a in operands]
            reasons = [f for f in found if isinstance(f, str)]
            out.append((stmt, seq_node, reasons[0] if reasons else found))
    return out


def _staged_bytes(kernel: _Kernel, stages: dict[Any, int]) -> int:
    """Estimated threadgroup memory: each shared buffer written inside a pipelined loop once per stage."""
    total = 0
    for buf in kernel.shared_allocs:
        total += _bytes(buf) * max(1, stages.get(buf.data, 1))
    return total


def _pipelined_copies(body: Any) -> dict[Any, tuple[Any, int]]:
    """shared data var -> (pipelined loop, num_stages) for buffers a T.copy writes inside such a loop."""
    out: dict[Any, tuple[Any, int]] = {}
    for loop in find_nodes(body, [vocab.TIRX_FOR]):
        n = pipeline_stages(loop)
        if n < 2:
            continue
        for call in find_nodes(loop.body, [vocab.TIRX_CALL]):
            if tile_op_name(call) == "copy":
                dst = tile_region(call.args[1]).buffer
                if str(dst.scope()) in SHARED_SCOPES:
                    out[dst.data] = (loop, n)
    return out


def _fewest_cuts(kernel: _Kernel) -> dict[Any, int] | None:
    """New num_stages per pipelined loop so that the staging fits, or None if one stage does not fit."""
    pipelined = _pipelined_copies(kernel.body)
    loops = {}
    for loop, n in pipelined.values():
        loops[loop] = n
    for stages in range(max(loops.values(), default=1), 0, -1):
        per_buffer = {data: min(n, stages) for data, (loop, n) in pipelined.items()}
        if _staged_bytes(kernel, per_buffer) <= THREADGROUP_MEMORY_BYTES:
            return {loop: min(n, stages) for loop, n in loops.items()}
    return None


def _rewrite(body: Any, bypass: list[tuple[Any, list[_Staging]]], stages: dict[Any, int]) -> Any:
    copy_stmts = [s.copy for _, st in bypass for s in st]
    dropped = [s.buffer for _, st in bypass for s in st]
    gemm_sources = [(g, [s.source for s in st]) for g, st in bypass]

    def is_dropped_copy(stmt: Any) -> bool:
        return any(stmt.same_as(c) for c in copy_stmts)

    def rewrite(node: Any) -> Any:
        if isinstance(node, tir.SeqStmt):
            kept = []
            for stmt in node.seq:
                if is_dropped_copy(stmt):
                    continue
                for g, sources in gemm_sources:
                    if stmt.same_as(g):
                        call = stmt.value
                        args = [sources[0], sources[1], *list(call.args[2:])]
                        # the plan records the bypass from this mark (transform/gemm_plans.py: GemmPlan.staging_bypassed)
                        rewritten = with_call_annotations(tir.Call(call.dtype, call.op, args, call.annotations), {STAGING_BYPASS_ANNOTATION: "bypassed"})
                        stmt = tir.Evaluate(rewritten)
                kept.append(stmt)
            if len(kept) == len(node.seq) and all(a.same_as(b) for a, b in zip(kept, node.seq)):
                return None
            return kept[0] if len(kept) == 1 else tir.SeqStmt(kept)
        if isinstance(node, tir.SBlock):
            allocs = [b for b in node.alloc_buffers if not any(b.same_as(d) for d in dropped)]
            if len(allocs) == len(node.alloc_buffers):
                return None
            return tir.SBlock(node.iter_vars, node.reads, node.writes, node.name_hint, node.body, node.init, allocs, node.match_buffers, node.annotations)
        return None

    # loops first (they are matched by identity), then the statements inside them
    def restage(node: Any) -> Any:
        for loop, n in stages.items():
            if node.same_as(loop):
                return with_pipeline_stages(node, n)
        return None

    body = tvm.tirx.stmt_functor.ir_transform(body, None, restage, [vocab.TIRX_FOR]) if stages else body
    body = tvm.tirx.stmt_functor.ir_transform(body, None, rewrite, [vocab.TIRX_SEQSTMT, vocab.TIRX_SBLOCK])

    def unpipeline(node: Any) -> Any:  # a pipelined loop with no staging copy left pipelines nothing
        if pipeline_stages(node) < 2:
            return None
        if any(tile_op_name(c) == "copy" for c in find_nodes(node.body, [vocab.TIRX_CALL])):
            return None
        return with_pipeline_stages(node, 0)

    return tvm.tirx.stmt_functor.ir_transform(body, None, unpipeline, [vocab.TIRX_FOR]) if bypass else body


def bypass_function(func: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    """`func` with its staging-only operands bypassed where the rules above say so, and every
    decision on it (`_decide`)."""
    decisions: list[StagingDecision] = []
    new = _bypass(func, capabilities, options.staging_bypass, decisions.append)
    kept = [d.reason for d in decisions if d.action == "keep"]
    return with_decisions(with_decisions(new, [d.describe() for d in decisions]), kept, STAGING_KEPT_ATTR)


def _bypass(func: Any, capabilities: TargetCapabilities, enabled: bool, record: Any) -> Any:
    kernel = _Kernel(func.body)
    found = _candidates(kernel)
    if not found:
        return func
    if func.attrs is not None and KEEP_STAGING_ATTR in func.attrs and bool(func.attrs[KEEP_STAGING_ATTR]):
        for gemm_stmt, _, _ in found:
            record(StagingDecision(_gemm_name(gemm_stmt.value), "keep", f"the kernel sets {KEEP_STAGING_ATTR}"))
        return func
    bypass: list[tuple[Any, list[_Staging]]] = []
    stages: dict[Any, int] = {}
    ready = [(g, st) for g, _, st in found if not isinstance(st, str)]
    for gemm_stmt, _, st in found:
        if isinstance(st, str):
            record(StagingDecision(_gemm_name(gemm_stmt.value), "keep", st))
    if not ready:
        return func
    if not enabled:
        for g, _ in ready:
            record(StagingDecision(_gemm_name(g.value), "keep", "TILELANG_METAL_STAGING_BYPASS=0"))
        return func
    if capabilities.metal4:
        bypass = ready
        reason = "A and B are staging only (one T.copy from global, read only by the T.gemm) and the target has metal4 (direct-global cooperative tensors)"
    else:
        current = _staged_bytes(kernel, {d: n for d, (_, n) in _pipelined_copies(kernel.body).items()})
        if current <= THREADGROUP_MEMORY_BYTES:
            for g, _ in ready:
                record(StagingDecision(_gemm_name(g.value), "keep", f"plain metal target (simdgroup matrices reuse the staged tiles) and the staging fits 32 KiB ({current} bytes)"))
            return func
        cuts = _fewest_cuts(kernel)
        if cuts is not None:
            stages = {loop: n for loop, n in cuts.items() if n != pipeline_stages(loop)}
            detail = ", ".join(f"num_stages {pipeline_stages(loop)} -> {n}" for loop, n in cuts.items())
            for g, _ in ready:
                record(StagingDecision(_gemm_name(g.value), "fewer_stages", f"plain metal target; the staging needs {current} bytes of threadgroup memory > 32 KiB; {detail}"))
            return func.with_body(_rewrite(func.body, [], stages))
        bypass = ready
        reason = "plain metal target and the staging does not fit 32 KiB even with one pipeline stage; simdgroup matrices load from device memory"
    for g, _ in bypass:
        record(StagingDecision(_gemm_name(g.value), "bypass", reason))
    return func.with_body(_rewrite(func.body, bypass, stages))


def BypassSharedStaging(mod: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc):
            new = bypass_function(func, capabilities, options)
            if not new.same_as(func):
                updates[gvar] = new
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod
