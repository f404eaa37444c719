"""GemmMetal: layout inference and lowering of `T.gemm` for Metal targets.

Stage 1 (`selection.select_inst`) picks the instruction kind; stage 2 picks the dataflow from the
scopes of A and B (direct-global or shared for cooperative tensors; simdgroup takes either).
Both the layout-inference hook and the lowering hook go through `plan()`, so they always agree.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from .. import config
from .._host import tvm
from ..errors import GemmLoweringError
from ..selection import (
    COOPERATIVE_TENSOR,
    CT_FRAG_M,
    CT_FRAG_N,
    SG_FRAG,
    SIMD_WIDTH,
    Partition,
    Selection,
    choose_partition,
    copy_compatible_square_partition,
    select_inst,
)
from ..target import has_metal4
from . import lane_layout as L
from .direct_global import lower_direct_global
from .problem import FRAGMENT_SCOPES, GLOBAL_SCOPES, SIMDGROUP_SCOPES, GemmProblem
from .shared import lower_shared
from .simdgroup import lower_simdgroup

logger = logging.getLogger("tilelang_metal")


@dataclass(frozen=True)
class GemmPlan:
    problem: GemmProblem
    selection: Selection
    partition: Partition
    dataflow: str  # "direct_global" | "shared"
    threads: int

    def describe(self) -> str:
        p = self.problem
        return (
            f"T.gemm {p.M}x{p.N}x{p.K} (A {p.A.scope} {p.A.dtype}{' T' if p.trans_A else ''}, "
            f"B {p.B.scope} {p.B.dtype}{' T' if p.trans_B else ''}, C {p.C.scope} {p.C.dtype}), threads={self.threads}: "
            f"{self.selection.kind} / {self.dataflow}, warps {self.partition.m_warp}x{self.partition.n_warp}; "
            f"because {self.selection.reason}"
        )


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
    problem = GemmProblem.from_node(node)
    threads = _threads(thread_bounds)
    selection = select_inst(
        c_scope=problem.c_scope,
        M=problem.M,
        N=problem.N,
        K=problem.K,
        threads=threads,
        policy=problem.policy,
        has_metal4=has_metal4(target),
        route_fragments_to_cooperative_tensor=config.fragment_ct(),  # read per lowering: docs/configuration.md
    )
    num_warps = threads // SIMD_WIDTH
    if selection.kind == COOPERATIVE_TENSOR:
        part = selection.partition
    else:
        if problem.c_scope in SIMDGROUP_SCOPES:
            part = copy_compatible_square_partition(problem.M, problem.N, num_warps)
        else:
            part = choose_partition(problem.policy, problem.M, problem.N, num_warps, SG_FRAG, SG_FRAG)
        if part is None:
            raise GemmLoweringError(
                f"no legal warp partition for T.gemm tile {problem.M}x{problem.N} with {num_warps} simdgroups: every "
                f"simdgroup needs a whole number of 8x8 fragments (M divisible by m_warp*8, N by n_warp*8, "
                f"m_warp*n_warp={num_warps}). Use block sizes that are multiples of 8*simdgroups or fewer threads."
            )
    dataflow = "direct_global" if problem.A.scope in GLOBAL_SCOPES else "shared"
    result = GemmPlan(problem, selection, part, dataflow, threads)
    if config.debug():
        logger.warning("tilelang_metal: %s", result.describe())
    else:
        logger.info("%s", result.describe())
    return result


def _fragment_layout(gp: GemmPlan, buffer: Any) -> Any:
    """Thread/element layout of a register accumulator, matching the lowering's lane layout."""
    from tilelang.layout import Fragment

    part = gp.partition
    wm, wn = gp.problem.M // part.m_warp, gp.problem.N // part.n_warp
    cooperative = gp.selection.kind == COOPERATIVE_TENSOR
    fm, fn = (CT_FRAG_M, CT_FRAG_N) if cooperative else (SG_FRAG, SG_FRAG)
    cols = wn // fn

    def thread(i: Any, j: Any) -> Any:
        sg = i // wm + (j // wn) * part.m_warp
        r, c = (i % wm) % fm, (j % wn) % fn
        lane = L.ct_lane_of(r, c) if cooperative else L.sg_lane_of(r, c)
        return sg * SIMD_WIDTH + lane

    def index(i: Any, j: Any) -> Any:
        frag = ((i % wm) // fm) * cols + (j % wn) // fn
        r, c = (i % wm) % fm, (j % wn) % fn
        if cooperative:
            return frag * L.CT_DEST_ELEMS + L.ct_elem_of(r, c)
        return frag * L.SG_ELEMS_PER_LANE + L.sg_elem_of(r, c)

    return Fragment(list(buffer.shape), forward_thread_fn=thread, forward_index_fn=index)


def infer_layout(node: Any, target: Any, thread_bounds: Any) -> dict:
    gp = plan(node, target, thread_bounds)
    c = gp.problem.C
    if c.scope in FRAGMENT_SCOPES:
        return {c.buffer: _fragment_layout(gp, c.buffer)}
    return {}


def lower(node: Any, layout_map: Any, target: Any, thread_bounds: Any, thread_index: Any) -> Any:
    gp = plan(node, target, thread_bounds)
    if int(getattr(thread_bounds.min, "value", thread_bounds.min)) != 0:
        raise GemmLoweringError("T.gemm on Metal must run on threads starting at 0 (no warp-specialized thread ranges)")
    analyzer = tvm.arith.Analyzer()
    analyzer.bind(thread_index, tvm.ir.Range(0, gp.threads))
    if gp.selection.kind == COOPERATIVE_TENSOR:
        lower_fn = lower_direct_global if gp.dataflow == "direct_global" else lower_shared
    else:
        lower_fn = lower_simdgroup
    return lower_fn(gp.problem, gp.partition, analyzer, thread_index)
