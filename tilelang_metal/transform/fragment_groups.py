"""One instruction and one partition for `T.gemm` calls whose register fragments meet element by element.

A register fragment's thread layout is fixed by the T.gemm that accumulates into it (or reads it as
A), and tilelang's layout inference needs fragments combined element by element (`T.copy(S, P)`, a
`T.Parallel` over `C1[i, j] + C2[i, j]`) to put each element on the same thread. GemmMetal answers
the layout hook one call at a time, so before layout inference this analysis (reading the plans
`gemm_plans.RecordGemmPlans` first records for each call alone) groups the fragments
that meet element by element and decides, per group, one matrix instruction and the partitions
that make their layouts equal:

- a group with a register A operand (attention's P = cast(S) feeding P . V): the rows are split
  over as many simdgroups as whole instruction tiles allow (`selection.row_partition`); the
  accumulators in the group hold whole rows (no N split, the other simdgroups replicate), which is
  exactly the layout the register operand needs; the reading T.gemm splits its own C along N;
- a group of accumulators of one shape and no register operand: the first T.gemm's partition
  (its policy) for all;
- accumulators of different shapes but the same M: whole rows for all (their layouts then agree
  on every element they share); different M cannot agree, and is left to the layout-inference
  error (`pipeline._infer_layouts`), which names both fragments.

Fragments also meet row by row, through 1-D row fragments: a reduction's result (`T.reduce_max(S, m)`)
combined with another accumulator's rows (`O[i, j] *= scale[i]` with `scale` computed from `m`), as in
flash attention and MLA decoding. Each row of such 1-D fragments must sit on the threads that hold
that row in both accumulators, so their T.gemm calls need one instruction and one row split (the N
split and replicas may differ). When the calls' own choices already agree, nothing changes; otherwise
they all take `selection.row_partition` (MLA's `FullCol` policy splits a 16x32 score tile 2x4 and the
16x64 output 1x8 on 8 simdgroups: the rows of `m` and `scale` would live on different threads).

Cooperative tensors are chosen when every T.gemm of the group can use them; when they would need
more replication than simdgroup matrices (a 32-row tile on 4 simdgroups: 16-row tiles give 2
simdgroups along M, 8-row tiles 4), simdgroup matrices win, since the replicas compute the same
tile twice. The decisions reach GemmMetal through the plans `gemm_plans.RecordGemmPlans` records on the calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..host import gemm_call_fields, tir
from ..target.capabilities import TargetCapabilities
from ..target.isa import COOPERATIVE_TENSOR_KIND, SIMD_WIDTH, MatrixInstruction
from ..core.scopes import FRAGMENT_SCOPES
from ..selection import (
    Partition,
    Selection,
    choose_partition,
    cooperative_instructions,
    row_partition,
    simdgroup_instruction,
)
from ..planning import gemm_key, recorded_plan
from ..core.ir_attrs import find_nodes
from ..host import vocab


@dataclass(frozen=True)
class GemmSite:
    """One T.gemm call as the analysis sees it."""

    a: Any  # data variables of the operand buffers (the key GemmMetal's plan() finds the decision by)
    b: Any
    c: Any
    a_name: str
    b_name: str
    c_name: str
    m: int
    n: int
    k: int
    policy: int
    register_a: bool  # A is a register fragment
    alone: Any  # the plan recorded on the call, planned alone (`gemm_plans.RecordGemmPlans`), or None

    @property
    def key(self) -> tuple:
        return gemm_key(self.a, self.b, self.c)

    def describe(self) -> str:
        return f"T.gemm({self.a_name}, {self.b_name}, {self.c_name}) ({self.m}x{self.n}x{self.k})"


class _Groups:
    """Union-find over fragment data variables."""

    def __init__(self) -> None:
        self.parent: dict[Any, Any] = {}

    def find(self, x: Any) -> Any:
        self.parent.setdefault(x, x)
        while self.parent[x] is not x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, members: list) -> None:
        for other in members[1:]:
            self.parent[self.find(other)] = self.find(members[0])


def _is_matrix_fragment(buffer: Any) -> bool:
    return str(buffer.scope()) in FRAGMENT_SCOPES and len(buffer.shape) >= 2


def _link(body: Any, groups: _Groups, counts: Any) -> None:
    """Union the fragments `counts` accepts that each T.Parallel nest or non-GEMM tile op touches."""
    for loop in find_nodes(body, [vocab.TIRX_FOR]):
        if loop.kind != tir.ForKind.PARALLEL:
            continue
        accesses = find_nodes(loop.body, [vocab.TIRX_BUFFERLOAD, vocab.TIRX_BUFFERSTORE])
        groups.union(list({a.buffer.data: None for a in accesses if counts(a.buffer)}))
    for call in find_nodes(body, [vocab.TIRX_CALL]):
        name = str(getattr(call.op, "name", ""))
        if not name.startswith(vocab.TILE_OP_PREFIX) or name == vocab.GEMM_TILE_OP:
            continue
        buffers = [arg.args[0].buffer for arg in call.args if isinstance(arg, tir.Call) and arg.args and isinstance(arg.args[0], tir.BufferLoad)]
        groups.union(list({b.data: None for b in buffers if counts(b)}))


def _element_links(body: Any, groups: _Groups) -> None:
    """Union the 2-D fragments each T.Parallel nest or fragment-to-fragment tile op (T.copy) touches."""
    _link(body, groups, _is_matrix_fragment)


def _row_links(body: Any, groups: _Groups) -> None:
    """Union the fragments of any rank each T.Parallel nest or tile op touches (a reduction joins its
    2-D source with its 1-D result): accumulators whose rows meet through row fragments."""
    _link(body, groups, lambda buffer: str(buffer.scope()) in FRAGMENT_SCOPES)


def _sites(body: Any) -> list[GemmSite]:
    sites = []
    for call in find_nodes(body, [vocab.TIRX_CALL]):
        f = gemm_call_fields(call)
        if f is None or f.a_buffer is None or f.b_buffer is None:
            continue
        sites.append(
            GemmSite(
                f.a_buffer.data, f.b_buffer.data, f.c_buffer.data, f.a_buffer.name, f.b_buffer.name, f.c_buffer.name,
                f.m, f.n, f.k, f.policy, str(f.a_buffer.scope()) in FRAGMENT_SCOPES, recorded_plan(call),
            )
        )
    return sites


def _whole_tiles(site: GemmSite, inst: MatrixInstruction) -> bool:
    return site.m % inst.m == 0 and site.n % inst.n == 0 and site.k % inst.k == 0


def _group_partitions(producers: list[GemmSite], consumers: list[GemmSite], inst: MatrixInstruction, num_warps: int) -> dict | None:
    """Partition per T.gemm of one group with instruction `inst`, or None when there is none."""
    if inst.kind == COOPERATIVE_TENSOR_KIND and not all(_whole_tiles(s, inst) for s in producers + consumers):
        return None  # cooperative tensors need whole tiles (CanUseCooperativeTensor); simdgroup masks edges
    shapes = {(s.m, s.n) for s in producers} | {(s.m, s.k) for s in consumers}
    if not consumers and len(shapes) == 1:
        first = producers[0]
        part = choose_partition(first.policy, first.m, first.n, num_warps, inst.m, inst.n)
        return None if part is None else {s.key: part for s in producers}
    if len({m for m, _ in shapes}) != 1:
        return None  # rows split differently: no common layout (left to the layout-inference error)
    if any(s.n % inst.n or s.k % inst.n for s in consumers):
        return None
    parts = {}
    for s in consumers:
        parts[s.key] = row_partition(s.m, s.n, num_warps, inst.m, inst.n, split_n=True)
    for s in producers:  # whole rows: no N split (overrides a consumer's own split when it is both)
        parts[s.key] = row_partition(s.m, s.n, num_warps, inst.m, inst.n, split_n=False)
    return None if None in parts.values() else parts


@dataclass(frozen=True)
class GroupPlan:
    selection: Selection
    partition: Partition


def fragment_group_plans(mod: Any, capabilities: TargetCapabilities, fragment_ct: bool) -> dict[tuple, GroupPlan]:
    """Per T.gemm (keyed by `gemm_key(A, B, C data)`) whose fragments meet another T.gemm's element
    by element: the instruction and partition all of them use."""
    plans: dict[tuple, GroupPlan] = {}
    pinned: set[tuple] = set()  # plans whose partition their element group needs (not just its policy's)
    for threads, body in _kernels(mod):
        sites = _sites(body)
        if len(sites) < 2 or threads % SIMD_WIDTH:
            continue  # a threads count GemmMetal refuses with its own message
        num_warps = threads // SIMD_WIDTH
        groups = _Groups()
        _element_links(body, groups)
        roots = {groups.find(s.c) for s in sites} | {groups.find(s.a) for s in sites if s.register_a}
        for root in roots:
            producers = [s for s in sites if groups.find(s.c) is root]
            consumers = [s for s in sites if s.register_a and groups.find(s.a) is root]
            if not producers or (not consumers and len(producers) < 2):
                continue  # one T.gemm fixes every layout of the group: its own selection stands
            choice = _choose(producers, consumers, num_warps, capabilities.metal4 and fragment_ct, capabilities.features)
            if choice is None:
                continue
            inst, parts = choice
            names = sorted({s.c_name for s in producers} | {s.a_name for s in consumers})
            reason = f"fragments {', '.join(names)} meet element by element: one instruction and one row split for their T.gemm calls"
            for key, part in parts.items():
                plans.setdefault(key, GroupPlan(Selection(inst, reason, part), part))
            if consumers or len({(s.m, s.n) for s in producers}) > 1:
                pinned.update(parts)  # a layout the group needs (whole rows): row groups keep it
        rows = _Groups()
        _row_links(body, rows)
        for root in {rows.find(s.c) for s in sites}:
            members = [s for s in sites if rows.find(s.c) is root]
            plans.update(_row_group_plans(members, plans, pinned, num_warps, capabilities, fragment_ct))
    return plans


def _row_group_plans(
    members: list[GemmSite],
    plans: dict[tuple, GroupPlan],
    pinned: set[tuple],
    num_warps: int,
    capabilities: TargetCapabilities,
    fragment_ct: bool,
) -> dict[tuple, GroupPlan]:
    """Plans for the T.gemm calls of one row group (accumulators whose rows meet through 1-D row
    fragments) that make their row splits agree; none when they already agree or cannot. A call
    whose element group only shares its policy's split is re-planned (all calls of one shape get
    the same row partition, so that group still agrees); a pinned one is kept."""
    if len({s.c for s in members}) < 2 or len({s.m for s in members}) != 1:
        return {}  # one accumulator, or different M: no row split serves both (the layout error names them)
    own = {}
    for s in members:
        if s.key in plans:
            own[s.key] = (plans[s.key].selection.instruction, plans[s.key].partition)
            continue
        if s.alone is None or s.alone.threads != num_warps * SIMD_WIDTH:
            return {}  # not planned: GemmMetal plans these calls alone
        own[s.key] = (s.alone.instruction, s.alone.partition)  # a register A's plan has the row split GemmMetal needs
    if all(part is not None for _, part in own.values()) and len({(inst.name, part.m_warp) for inst, part in own.values()}) == 1:
        return {}  # the calls' own choices already split the rows alike
    planned = [s for s in members if s.key in pinned]
    free = [s for s in members if s.key not in pinned]
    fixed = {plans[s.key].selection.instruction.name: plans[s.key].selection.instruction for s in planned}
    if len(fixed) > 1 or not free:
        return {}
    if any(i.kind == COOPERATIVE_TENSOR_KIND for i in fixed.values()) and any(s.register_a for s in free):
        return {}  # a register A operand reads cooperative tensors only where GemmMetal's later checks allow
    # a register A operand reads cooperative tensors only under conditions GemmMetal checks later
    # (register_a_blockers): such a group takes simdgroup matrices
    may_use_ct = capabilities.metal4 and fragment_ct and not any(s.register_a for s in free)
    features = capabilities.features
    candidates = list(fixed.values()) or (cooperative_instructions(features) if may_use_ct else []) + [simdgroup_instruction(features)]
    best = None
    for inst in candidates:
        if inst.kind == COOPERATIVE_TENSOR_KIND and not all(_whole_tiles(s, inst) for s in free):
            continue
        parts = {s.key: row_partition(s.m, s.n, num_warps, inst.m, inst.n, split_n=True) for s in free}
        if None in parts.values():
            continue
        if len({p.m_warp for p in parts.values()} | {plans[s.key].partition.m_warp for s in planned}) != 1:
            continue
        cost = max(p.replicas for p in parts.values())
        if best is None or cost < best[0]:
            best = (cost, inst, parts)
    if best is None:
        return {}
    _, inst, parts = best
    names = ", ".join(sorted({s.c_name for s in members}))
    reason = f"accumulators {names} meet row by row (through row fragments): one instruction and one row split for their T.gemm calls"
    return {key: GroupPlan(Selection(inst, reason, part), part) for key, part in parts.items()}


def _kernels(mod: Any) -> list[tuple[int, Any]]:
    """(threads, body) of every kernel launch (a function may hold several `T.Kernel` blocks)."""
    kernels = []
    for func in mod.functions.values():
        if not isinstance(func, tir.PrimFunc):
            continue
        for node in find_nodes(func.body, [vocab.TIRX_ATTRSTMT]):
            if str(node.attr_key) != "thread_extent" or str(node.node.thread_tag) != "threadIdx.x":
                continue
            if isinstance(node.value, tir.IntImm):  # kernels with tile ops run 1-D (LinearizeThreadLaunch)
                kernels.append((int(node.value.value), node.body))
    return kernels


def _choose(
    producers: list[GemmSite], consumers: list[GemmSite], num_warps: int, may_use_ct: bool, features: frozenset[str]
) -> tuple | None:
    """The instruction with the least replication (cooperative tensors, in registry preference
    order, on a tie) and its partitions."""
    best = None
    for inst in (cooperative_instructions(features) if may_use_ct else []) + [simdgroup_instruction(features)]:
        parts = _group_partitions(producers, consumers, inst, num_warps)
        if parts is None:
            continue
        cost = max(p.replicas for p in parts.values())
        if best is None or cost < best[0]:
            best = (cost, inst, parts)
    return None if best is None else best[1:]


def gemm_roles(mod: Any) -> dict[str, tuple[str, int]]:
    """For the layout-conflict message: register fragment name -> (which T.gemm fixes its layout and
    how, its number of rows)."""
    roles: dict[str, tuple[str, int]] = {}
    for _, body in _kernels(mod):
        for site in _sites(body):
            roles.setdefault(site.c_name, (f"the accumulator of {site.describe()}", site.m))
            if site.register_a:
                roles.setdefault(site.a_name, (f"the A operand of {site.describe()}", site.m))
    return roles
