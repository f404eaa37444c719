"""One accumulator representation per register fragment, decided before layout inference.

Several `T.gemm` calls may accumulate into the same `local.fragment` (C += A1 B1; C += A2 B2).
Layout inference asks GemmMetal for C's layout once per call, and the answers must agree: when one
of the calls can use cooperative tensors and another cannot (K = 8 on a metal4 target, say), every
call on that fragment takes the simdgroup path. This analysis finds those fragments from the plans
`gemm_plans.RecordGemmPlans` first records for each call alone;
`gemm_plans.RecordGemmPlans` plans their calls accordingly and records the plans on the calls.
"""

from __future__ import annotations

from typing import Any

from ..host import gemm_call_fields, tir
from ..core.scopes import FRAGMENT_SCOPES
from ..planning import recorded_plan
from ..core.ir_attrs import find_nodes
from .kernel_launches import kernels
from ..host import vocab


def fragments_needing_simdgroup(mod: Any) -> set:
    """Data variables of fragments written by T.gemm calls whose recorded plans (each call planned
    alone, `gemm_plans.RecordGemmPlans`) differ in instruction."""
    forced: set = set()
    for func in mod.functions.values():
        if not isinstance(func, tir.PrimFunc):
            continue
        instructions: dict[Any, set[str]] = {}
        for kernel, launch in kernels(func.body):  # each kernel with its own thread count
            for call in find_nodes(kernel, [vocab.TIRX_CALL]):
                fields = gemm_call_fields(call)
                if fields is None or str(fields.c_buffer.scope()) not in FRAGMENT_SCOPES:
                    continue
                plan = recorded_plan(call)
                if plan is None or plan.threads != launch.threads:
                    continue  # not planned: GemmMetal refuses this launch with its own message
                # another instruction, even of the same kind, is another lane layout
                instructions.setdefault(fields.c_buffer.data, set()).add(plan.instruction.name)
        forced |= {var for var, seen in instructions.items() if len(seen) > 1}
    return forced
