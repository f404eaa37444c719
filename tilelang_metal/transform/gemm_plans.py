"""Every T.gemm's plan, recorded on its call once the software pipeline is in place.

The pass that owns the plans; it takes every per-call decision once, in this order:
1. each call is planned alone (`planning.plan_gemm`) and that plan is recorded on the call;
2. the two decisions that need the whole kernel read those recorded plans: a fragment accumulated
   by calls whose plans differ in instruction takes the simdgroup path for all of them
   (`accumulator_sharing.py`), and calls whose fragments meet element or row by element agree on
   one instruction and partition (`fragment_groups.py`);
3. each call is planned again with them, and the flags the plan carries are set: the shared-staging
   bypass (`shared_staging.py` marks the calls it rewrote), K-prefetch (the option, direct-global
   operands, two K steps or more, and the register estimate with the second operand set), and
   register staging (the pipelined loop around the call: `register_staging.stage_loops`, from the
   register estimate of these plans);
4. the final plan is written on the call (`planning.GEMM_PLAN_ANNOTATION`).
GemmMetal (asked by layout inference and LowerTileOp) and the later passes read the plan from the
call: nothing passes beside the IR, and nothing after this pass decides these again.

A call this pass cannot plan (a launch whose thread count is symbolic or not whole simdgroups)
carries no plan, nor does a call whose plan has no legal partition keep one GemmMetal lowers with:
GemmMetal plans such a call alone (without the flags) and refuses it with its own message where it must.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from .. import config
from ..target.capabilities import TargetCapabilities
from ..config import LoweringOptions
from ..core.ir_attrs import with_decisions
from ..core.scopes import FRAGMENT_SCOPES, GLOBAL_SCOPES, SIMDGROUP_SCOPES
from ..gemm.accumulator import ACCUM_DTYPE
from ..host import call_annotations, gemm_call_fields, tir, tvm, vocab, with_call_annotations
from ..performance.register_budget import RegisterDecision, gemm_registers
from ..target.isa import SIMD_WIDTH
from ..planning import GEMM_PLAN_ANNOTATION, STAGING_BYPASS_ANNOTATION, GemmPlan, encode_plan, gemm_key, plan_call_alone
from .accumulator_sharing import fragments_needing_simdgroup
from .fragment_groups import fragment_group_plans
from .kernel_launches import rewrite_kernels
from .register_staging import stage_loops


def RecordGemmPlans(mod: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    _each_kernel(mod, lambda kernel, threads, decisions: _annotate(kernel, threads, lambda fields, call, alone: alone, capabilities, options))
    shared = fragments_needing_simdgroup(mod)
    groups = fragment_group_plans(mod, capabilities, options.fragment_ct)

    def final(fields: Any, call: Any, alone: GemmPlan, decisions: list[str]) -> GemmPlan:
        c = fields.c_buffer
        group = groups.get(gemm_key(fields.a_buffer.data, fields.b_buffer.data, c.data))
        planned = plan_call_alone(fields, alone.threads, capabilities, options.fragment_ct, shared_accumulator=c.name if c.data in shared else None,
                              group=None if group is None else group.selection)
        bypassed = STAGING_BYPASS_ANNOTATION in call_annotations(call)
        return replace(planned, staging_bypassed=bypassed, k_prefetch=_k_prefetch(fields, planned, options.k_prefetch, decisions))

    _each_kernel(mod, lambda kernel, threads, decisions: _annotate(kernel, threads, lambda f, call, alone: final(f, call, alone, decisions), capabilities, options))
    return stage_loops(mod, capabilities, options)


def _each_kernel(mod: Any, rewrite: Any) -> None:
    """`rewrite(kernel, threads, decisions)` on every `T.Kernel` block of every PrimFunc of `mod`, in
    place; the texts it adds to `decisions` go on the function for `--explain`."""
    updates = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, tir.PrimFunc):
            decisions: list[str] = []
            body = rewrite_kernels(func.body, lambda kernel, launch: rewrite(kernel, launch.threads, decisions))
            if not body.same_as(func.body) or decisions:
                updates[gvar] = with_decisions(func.with_body(body), decisions)
    for gvar, func in updates.items():
        mod[gvar] = func


def _annotate(kernel: Any, threads: int | None, decide: Any, capabilities: TargetCapabilities, options: LoweringOptions) -> Any:
    """`kernel` with the plan `decide(fields, call, plan of the call alone)` recorded on each T.gemm call."""
    if threads is None or threads % SIMD_WIDTH:
        return kernel  # GemmMetal refuses such a launch with its own message

    def annotate(call: Any) -> Any:
        fields = gemm_call_fields(call)
        if fields is None or fields.a_buffer is None or fields.b_buffer is None:
            return None
        alone = plan_call_alone(fields, threads, capabilities, options.fragment_ct)
        return with_call_annotations(call, {GEMM_PLAN_ANNOTATION: encode_plan(decide(fields, call, alone))})

    return tvm.tirx.stmt_functor.ir_transform(kernel, None, annotate, [vocab.TIRX_CALL])


def _k_prefetch(fields: Any, plan: GemmPlan, mode: str, decisions: list[str]) -> bool:
    """K-prefetch asked for, direct-global operands, two whole K steps or more, a partition, and
    (unless forced) the register estimate with the second operand set within the budget; a refusal
    for registers goes to `decisions`."""
    a, b, c = fields.a_buffer, fields.b_buffer, fields.c_buffer
    if mode == config.OFF or plan.partition is None or str(a.scope()) not in GLOBAL_SCOPES or str(b.scope()) not in GLOBAL_SCOPES:
        return False
    if fields.k // plan.instruction.k < 2:
        return False
    if mode == config.FORCE:
        return True
    acc_dtype = str(c.dtype) if str(c.scope()) in FRAGMENT_SCOPES + SIMDGROUP_SCOPES else ACCUM_DTYPE  # as gemm/accumulator.make_accumulator
    with_it = gemm_registers(M=fields.m, N=fields.n, instruction=plan.instruction, partition=plan.partition, a_dtype=str(a.dtype),
                             b_dtype=str(b.dtype), acc_dtype=acc_dtype, shared=False, prefetch=True)
    if with_it.fits:
        return True
    subject = f"T.gemm {fields.m}x{fields.n}x{fields.k} on {plan.partition.simdgroups} simdgroups"
    decisions.append(RegisterDecision("K-prefetch", subject, config.PREFIX + "K_PREFETCH", with_it).describe())
    return False
