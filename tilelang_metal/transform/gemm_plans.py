"""Every T.gemm's plan, recorded on its call once the software pipeline is in place.

The two decisions that need the whole kernel are taken here: a fragment accumulated by calls that
would pick different instructions takes the simdgroup path for all of them
(`accumulator_sharing.py`), and calls whose fragments meet element or row by element agree on one
instruction and partition (`fragment_groups.py`). With them, each call is planned
(`planning.plan_gemm`) and the plan is written on the call as an annotation
(`planning.GEMM_PLAN_ANNOTATION`). MarkRegisterStaging's register estimate (`plan_of_call`) and
GemmMetal, asked by layout inference and LowerTileOp, read the plan from the call: nothing passes
beside the IR.

A call this pass cannot plan (a launch whose thread count is symbolic or not whole simdgroups, a
tile with no legal partition) carries no plan; GemmMetal plans it alone and refuses it with its
own message where it must.
"""

from __future__ import annotations

from typing import Any

from ..target.capabilities import TargetCapabilities
from ..config import LoweringOptions
from ..host import call_annotations, gemm_call_fields, tir, tvm, vocab, with_call_annotations
from ..target.isa import SIMD_WIDTH
from ..planning import GEMM_PLAN_ANNOTATION, GemmPlan, decode_plan, encode_plan, gemm_key, plan_gemm
from .accumulator_sharing import fragments_needing_simdgroup
from .fragment_groups import fragment_group_plans
from .kernel_launches import rewrite_kernels


def RecordGemmPlans(mod: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    shared = fragments_needing_simdgroup(mod, capabilities, options.fragment_ct)
    groups = fragment_group_plans(mod, capabilities, options.fragment_ct)
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc):
            body = rewrite_kernels(func.body, lambda kernel, launch: _record(kernel, launch.threads, shared, groups, capabilities, options))
            if not body.same_as(func.body):
                updates[gvar] = func.with_body(body)
    for gvar, func in updates.items():
        mod[gvar] = func
    return mod


def _record(kernel: Any, threads: int | None, shared: set, groups: dict, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    if threads is None or threads % SIMD_WIDTH:
        return kernel  # GemmMetal refuses such a launch with its own message

    def annotate(call: Any) -> Any:
        fields = gemm_call_fields(call)
        if fields is None or fields.a_buffer is None or fields.b_buffer is None:
            return None
        c = fields.c_buffer
        group = groups.get(gemm_key(fields.a_buffer.data, fields.b_buffer.data, c.data))
        plan = plan_gemm(
            c_scope=str(c.scope()), M=fields.m, N=fields.n, K=fields.k, threads=threads, policy=fields.policy,
            capabilities=capabilities, fragment_ct=options.fragment_ct, a_scope=str(fields.a_buffer.scope()),
            shared_accumulator=c.name if c.data in shared else None, group=None if group is None else group.selection,
        )
        if plan.partition is None:
            return None
        return with_call_annotations(call, {GEMM_PLAN_ANNOTATION: encode_plan(plan)})

    return tvm.tirx.stmt_functor.ir_transform(kernel, None, annotate, [vocab.TIRX_CALL])


def plan_of_call(call: Any, fields: Any, threads: int, capabilities: TargetCapabilities, fragment_ct: bool) -> GemmPlan:
    """The plan recorded on a T.gemm call (`fields`: its `gemm_call_fields`) for this launch, or, on a
    call without one, the plan of the call alone."""
    recorded = call_annotations(call).get(GEMM_PLAN_ANNOTATION)
    if recorded is not None:
        plan = decode_plan(recorded)
        if plan.threads == threads:
            return plan
    return plan_gemm(c_scope=str(fields.c_buffer.scope()), M=fields.m, N=fields.n, K=fields.k, threads=threads, policy=fields.policy,
                     capabilities=capabilities, fragment_ct=fragment_ct, a_scope=str(fields.a_buffer.scope()))
