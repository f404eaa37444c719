"""GemmMetal: layout inference and lowering of `T.gemm` for Metal targets.

Stage 1 (`selection.select_inst`, asked only by `planning.plan_gemm`) picks the instruction (from `isa.REGISTRY`, by the target's
features); the plan carries it, and every later step reads sizes and lane maps from it. Stage 2 picks the dataflow from the
scopes of A and B (direct-global or shared for cooperative tensors; simdgroup takes either).
Both the layout-inference hook and the lowering hook go through `plan()`, which reads the plan
recorded on the call (transform/gemm_plans.py), so they always agree.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from ..host import layout_is_row_major, make_fragment_layout, tvm
from ..target.capabilities import capabilities_of
from ..errors import GemmLoweringError
from ..core.ir_attrs import mark_decisions
from ..target.isa import COOPERATIVE_TENSOR_KIND, SIMD_WIDTH
from ..config import current_options
from ..core.scopes import FRAGMENT_SCOPES
from .cooperative_tensor import lower_cooperative_tensor
from .problem import GemmProblem
from ..planning import REGISTER_A, GemmPlan, plan_gemm, recorded_plan
from .register_operand import (
    check_register_a_layout,
    has_register_a,
    register_a_layout,
    register_a_partition,
    validate_register_a,
)
from .simdgroup import lower_simdgroup
from .guard_marks import assumptions, mark_guarded

logger = logging.getLogger("tilelang_metal")


_observers: list[list[Any]] = []  # the lists of the open `recorded_plans()` blocks (tests only)


@contextlib.contextmanager
def recorded_plans() -> Iterator[list[Any]]:
    """Observe the `GemmPlan` objects the lowerings make inside the block (tests read their
    partitions and instructions). The decisions `--explain` prints are on the lowered IR
    (`ir_attrs.DECISIONS_ATTR`), and the plans GemmMetal lowers with on the calls
    (`planning.GEMM_PLAN_ANNOTATION`); nothing of the lowering reads this list."""
    plans: list[Any] = []
    _observers.append(plans)
    try:
        yield plans
    finally:
        _observers.remove(plans)


def plans_are_recorded() -> bool:
    """Whether a `recorded_plans()` block is open (the lowering cache then lowers afresh, so the
    block sees every plan)."""
    return bool(_observers)


def record(decision: Any) -> None:
    """Add a plan to every open `recorded_plans()` list."""
    for plans in _observers:
        plans.append(decision)


def _threads(thread_bounds: Any) -> int:
    extent = thread_bounds.extent
    threads = int(extent.value if hasattr(extent, "value") else extent)
    if threads % SIMD_WIDTH:
        raise GemmLoweringError(
            f"T.gemm on Metal needs whole simdgroups: threads={threads} is not a multiple of {SIMD_WIDTH}. "
            f"Launch the kernel with threads={max(SIMD_WIDTH, threads // SIMD_WIDTH * SIMD_WIDTH)} or another multiple of 32."
        )
    return threads


def plan(node: Any, target: Any, thread_bounds: Any) -> GemmPlan:
    options = current_options()  # the lowering's, fixed before LayoutInference called this hook
    problem = GemmProblem.from_node(node)
    threads = _threads(thread_bounds)
    if has_register_a(problem):
        validate_register_a(problem)
    planned = recorded_plan(node)  # transform/gemm_plans.py, with the kernel-wide decisions and the flags
    if planned is None or planned.threads != threads or planned.partition is None:
        # not planned for this launch before layout inference: this call alone decides, without the flags
        planned = plan_gemm(
            c_scope=problem.c_scope, M=problem.M, N=problem.N, K=problem.K, threads=threads, policy=problem.policy,
            capabilities=capabilities_of(target), fragment_ct=options.fragment_ct, a_scope=problem.A.scope,
        )
    result = replace(planned, problem=problem)
    if result.partition is None:
        num_warps = threads // SIMD_WIDTH
        if result.dataflow == REGISTER_A:
            register_a_partition(problem, result.instruction, num_warps)  # raises its own message
        fm, fn = result.instruction.m, result.instruction.n
        raise GemmLoweringError(
            f"no legal warp partition for T.gemm tile {problem.M}x{problem.N} with {num_warps} simdgroups: every "
            f"simdgroup needs a whole number of {fm}x{fn} fragments (M divisible by m_warp*{fm}, N by n_warp*{fn}, "
            f"m_warp*n_warp={num_warps}). Use block sizes that are multiples of {fm}*simdgroups or fewer threads."
        )
    record(result)
    if options.debug:
        logger.warning("tilelang_metal: %s", result.describe())
    else:
        logger.debug("%s", result.describe())
    return result


def _fragment_layout(gp: GemmPlan, buffer: Any) -> Any:
    """Thread/element layout of a register accumulator, matching the lowering's lane layout."""
    part, inst = gp.partition, gp.instruction
    wm, wn = gp.problem.M // part.m_warp, gp.problem.N // part.n_warp
    cols = wn // inst.n

    def thread(i: Any, j: Any, rep: Any = 0) -> Any:
        sg = i // wm + (j // wn + rep * part.n_warp) * part.m_warp
        return sg * SIMD_WIDTH + inst.lane_of((i % wm) % inst.m, (j % wn) % inst.n)

    def index(i: Any, j: Any) -> Any:
        frag = ((i % wm) // inst.m) * cols + (j % wn) // inst.n
        return frag * inst.dest_elems + inst.elem_of((i % wm) % inst.m, (j % wn) % inst.n)

    return make_fragment_layout(list(buffer.shape), thread, index, part.replicas)


def infer_layout(node: Any, target: Any, thread_bounds: Any) -> dict:
    gp = plan(node, target, thread_bounds)
    c = gp.problem.C
    layouts = {}
    if c.scope in FRAGMENT_SCOPES:
        layouts[c.buffer] = _fragment_layout(gp, c.buffer)
    if has_register_a(gp.problem):
        layouts[gp.problem.A.buffer] = register_a_layout(gp.problem, gp.instruction, gp.partition, make_fragment_layout)
    return layouts


def lower(node: Any, layout_map: Any, target: Any, thread_bounds: Any, thread_index: Any) -> Any:
    gp = plan(node, target, thread_bounds)
    if int(getattr(thread_bounds.min, "value", thread_bounds.min)) != 0:
        raise GemmLoweringError(
            "T.gemm on Metal must run on threads starting at 0 (no warp-specialized thread ranges): run it on the "
            "whole threadgroup, without T.ws and its barriers (Metal has no mbarrier; T.Pipelined's num_stages overlaps the loads)"
        )
    analyzer = tvm.arith.Analyzer()
    analyzer.bind(thread_index, tvm.ir.Range(0, gp.threads))
    if has_register_a(gp.problem):
        expected = register_a_layout(gp.problem, gp.instruction, gp.partition, make_fragment_layout)
        check_register_a_layout(gp.problem, expected, layout_map)
    problem = gp.problem.with_storage_layouts(lambda buf: buf in layout_map and not layout_is_row_major(layout_map[buf]))
    if gp.selection.kind == COOPERATIVE_TENSOR_KIND:
        body = lower_cooperative_tensor(problem, gp.instruction, gp.partition, analyzer, thread_index, gp.dataflow, k_prefetch=gp.k_prefetch)
    else:
        body = lower_simdgroup(problem, gp.instruction, gp.partition, analyzer, thread_index, k_prefetch=gp.k_prefetch)
    # every device access of the body is guarded or proven in bounds, under conditions the mark holds
    # (legalize_unguarded proves them in context, then tilelang's safe-memory pass skips the body)
    # the plan goes on the IR with the body (ir_attrs.DECISION_MARK), for `--explain`
    return mark_decisions(mark_guarded(body, assumptions(analyzer)), [gp.describe()])
