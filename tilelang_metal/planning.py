"""One plan per `T.gemm`, decided in one place: instruction, warp partition and dataflow.

`plan_gemm` is the only caller of `selection.select_inst`. GemmMetal (layout inference and
lowering), the analyses that run before layout inference (accumulator sharing, fragment groups,
register staging), the register budget, the autotuner and the cost model all ask it, so a tiling
they reason about is the tiling GemmMetal lowers. Plans are pure functions of the call's signature,
the options and the target's capabilities, and cached on them.

The decisions that need the whole kernel (a fragment shared by calls of different instructions, a
group of fragments that meet element by element) come in as arguments (`shared_accumulator`,
`group`); the ones that need the operands' types, the loop around the call or the options
(K-prefetch, register staging, the shared-staging bypass) are taken by the pass that records the
plans (transform/gemm_plans.py) and carried as the plan's flags. `encode_plan` / `decode_plan`
carry a plan on the call it was made for (`GEMM_PLAN_ANNOTATION`); nothing after that pass decides
them again.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, fields
from typing import Any

from .host import call_annotations
from .target.capabilities import TargetCapabilities
from .target.isa import COOPERATIVE_TENSOR_KIND, REGISTRY, SIMD_WIDTH, MatrixInstruction
from .core.scopes import FRAGMENT_SCOPES, GLOBAL_SCOPES
from .selection import Partition, Selection, row_partition, select_inst, simdgroup_instruction, warp_partition

DIRECT_GLOBAL = "direct_global"
SHARED = "shared"
REGISTER_A = "register_a"

# tl.gemm call annotation: the call's encoded GemmPlan (transform/gemm_plans.py writes it, GemmMetal reads it).
GEMM_PLAN_ANNOTATION = "tilelang_metal.gemm_plan"
# tl.gemm call annotation: BypassSharedStaging rewrote the call to read its staging buffers' sources (GemmPlan.staging_bypassed).
STAGING_BYPASS_ANNOTATION = "tilelang_metal.staging_bypassed"


@dataclass(frozen=True)
class GemmPlan:
    """What GemmMetal lowers a T.gemm with. `partition` is None when no legal split exists (GemmMetal
    refuses the call with its message); `problem` is the call's `GemmProblem` when the plan was made
    for GemmMetal, None for a tiling planned from its shape alone (autotuner, cost model)."""

    selection: Selection
    partition: Partition | None
    dataflow: str  # DIRECT_GLOBAL | SHARED | REGISTER_A
    threads: int
    problem: Any = field(default=None, compare=False, hash=False)
    # Flags set by the pass that records the plan (transform/gemm_plans.py), read by GemmMetal and the passes:
    k_prefetch: bool = False  # the K loop loads step k+1's operands into a second set while step k's MMAs run
    register_staging: bool = False  # the pipelined loop around the call stores its staged copies after the MMAs
    staging_bypassed: bool = False  # A and B were staging-only shared buffers; the call reads them from device memory

    @property
    def instruction(self) -> MatrixInstruction:
        return self.selection.instruction

    @property
    def kind(self) -> str:
        return self.selection.kind

    def describe(self) -> str:
        part = self.partition
        split = "no legal warp partition" if part is None else (
            f"warps {part.m_warp}x{part.n_warp}{f' x{part.replicas} replicas' if part.replicas > 1 else ''}")
        head = "T.gemm"
        p = self.problem
        if p is not None:
            head = (f"T.gemm {p.M}x{p.N}x{p.K} (A {p.A.scope} {p.A.dtype}{' T' if p.trans_A else ''}, "
                    f"B {p.B.scope} {p.B.dtype}{' T' if p.trans_B else ''}, C {p.C.scope} {p.C.dtype})")
        flags = "".join(f", {name.replace('_', ' ')}" for name in self.flags())
        return (f"{head}, threads={self.threads}: {self.selection.kind} ({self.instruction.name}) / {self.dataflow}{flags}, "
                f"{split}; because {self.selection.reason}")

    def flags(self) -> list[str]:
        """Names of the flags that are set, in declaration order."""
        return [name for name in PLAN_FLAGS if getattr(self, name)]


PLAN_FLAGS = ("k_prefetch", "register_staging", "staging_bypassed")
assert set(PLAN_FLAGS) == {f.name for f in fields(GemmPlan) if f.type in ("bool", bool)}


def gemm_key(a: Any, b: Any, c: Any) -> tuple:
    """The key of one T.gemm call among a kernel's: the data variables of its A, B and C buffers."""
    return (a, b, c)


def register_a_blockers(M: int, N: int, K: int, inst: MatrixInstruction) -> list[str]:
    """Why a register-fragment A of an M x N x K T.gemm cannot be read in place with `inst` (empty when it can)."""
    reasons = []
    if M % inst.m:
        reasons.append(f"M={M} is not a multiple of {inst.m} rows")
    if N % inst.n:
        reasons.append(f"N={N} is not a multiple of {inst.n}")
    if K % inst.n:  # A is laid out as destination tiles, inst.n columns wide
        reasons.append(f"K={K} is not a multiple of {inst.n}")
    return reasons


def dataflow_of(a_scope: str) -> str:
    if a_scope in FRAGMENT_SCOPES:
        return REGISTER_A
    return DIRECT_GLOBAL if a_scope in GLOBAL_SCOPES else SHARED


@functools.lru_cache(maxsize=8192)  # the autotuner, cost model and analyses ask for the same tilings again and again
def plan_gemm(
    *,
    c_scope: str,
    M: int,
    N: int,
    K: int,
    threads: int,
    policy: int,
    capabilities: TargetCapabilities,
    fragment_ct: bool,
    a_scope: str = "global",
    shared_accumulator: str | None = None,
    group: Selection | None = None,
) -> GemmPlan:
    """The plan of one T.gemm.

    `shared_accumulator` names C when another T.gemm on the same fragment cannot use cooperative
    tensors (one representation per fragment: transform/accumulator_sharing.py); `group` is the
    instruction and partition (`Selection.partition`) the call's fragment group decided
    (transform/fragment_groups.py), used when it fits this launch's simdgroups."""
    policy = int(policy)
    selection = select_inst(
        c_scope=c_scope, M=M, N=N, K=K, threads=threads, policy=policy, capabilities=capabilities,
        fragment_ct=fragment_ct and shared_accumulator is None,
    )
    if shared_accumulator is not None:
        selection = Selection(
            selection.instruction,
            f"C ({shared_accumulator}) is also the accumulator of a T.gemm that cannot use cooperative tensors; "
            "one representation per fragment",
        )
    dataflow = dataflow_of(a_scope)
    num_warps = threads // SIMD_WIDTH
    if group is not None and group.partition is not None and group.partition.simdgroups == num_warps:
        return GemmPlan(group, group.partition, dataflow, threads)
    if dataflow == REGISTER_A:
        blockers = register_a_blockers(M, N, K, selection.instruction) if selection.kind == COOPERATIVE_TENSOR_KIND else []
        if blockers:
            selection = Selection(
                simdgroup_instruction(capabilities.features),
                "A is a register fragment and cooperative tensors cannot read it in place: " + "; ".join(blockers),
            )
        inst = selection.instruction
        part = None if register_a_blockers(M, N, K, inst) else row_partition(M, N, num_warps, inst.m, inst.n, split_n=True)
        return GemmPlan(selection, part, dataflow, threads)
    return GemmPlan(selection, warp_partition(selection, c_scope, policy, M, N, num_warps), dataflow, threads)


def encode_plan(plan: GemmPlan) -> str:
    """The plan as one line of text for the call's annotation ("-" for a missing partition)."""
    part = plan.partition
    split = "- - -" if part is None else f"{part.m_warp} {part.n_warp} {part.replicas}"
    flags = ",".join(plan.flags()) or "-"
    return f"{plan.instruction.key} {split} {plan.dataflow} {plan.threads} {flags}|{plan.selection.reason}"


def decode_plan(text: str) -> GemmPlan:
    head, _, reason = str(text).partition("|")
    key, m_warp, n_warp, replicas, dataflow, threads, flags = head.split()
    part = None if m_warp == "-" else Partition(int(m_warp), int(n_warp), int(replicas))
    set_flags = {name: True for name in flags.split(",") if name != "-"}
    return GemmPlan(Selection(REGISTRY.resolve(key), reason, part), part, dataflow, int(threads), **set_flags)


def plan_call_alone(fields: Any, threads: int, capabilities: TargetCapabilities, fragment_ct: bool, **kernel_wide: Any) -> GemmPlan:
    """The plan of a T.gemm call from its `host.gemm_call_fields` (`kernel_wide`: `shared_accumulator`, `group`)."""
    return plan_gemm(c_scope=str(fields.c_buffer.scope()), M=fields.m, N=fields.n, K=fields.k, threads=threads, policy=fields.policy,
                     capabilities=capabilities, fragment_ct=fragment_ct, a_scope=str(fields.a_buffer.scope()), **kernel_wide)


def plan_of_call(call: Any, fields: Any, threads: int, capabilities: TargetCapabilities, fragment_ct: bool) -> GemmPlan:
    """The plan recorded on a T.gemm call for this launch, or, on a call without one (or whose
    recorded plan has no partition), the plan of the call alone, as GemmMetal plans it."""
    plan = recorded_plan(call)
    if plan is not None and plan.threads == threads and plan.partition is not None:
        return plan
    return plan_call_alone(fields, threads, capabilities, fragment_ct)


def recorded_plan(call: Any) -> GemmPlan | None:
    """The plan recorded on a T.gemm call (transform/gemm_plans.py), or None."""
    recorded = call_annotations(call).get(GEMM_PLAN_ANNOTATION)
    return None if recorded is None else decode_plan(recorded)
