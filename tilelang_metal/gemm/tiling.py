"""What every GEMM dataflow shares: the per-simdgroup tiling of C and the K-loop skeleton.

Simdgroup `sg` owns the (M/m_warp) x (N/n_warp) block (warp_m, warp_n) = (sg % m_warp,
sg // m_warp % n_warp) of C, covered by `rows x cols` instruction fragments; replicas of the grid
compute the same blocks, and only the first stores a C it owns. Subclasses say how big a fragment
is, how a K step gathers operands and runs the MMAs, and how the accumulator is cleared and
written back.
"""

from __future__ import annotations

from typing import Any

from ..host import tir, tvm
from ..target.isa import SIMD_WIDTH, MatrixInstruction
from ..selection import Partition
from .accumulator import Accumulator, clear_flag, make_accumulator
from .problem import GemmProblem, const_int
from ..core.scopes import GLOBAL_SCOPES
from .edge_split import interior_condition, uniform_branch
from .prefetch import prefetched_k_loop
from .register_operand import has_register_a, left_operand_offset, register_a_elements
from .tile_access import dim_in_bounds, tile_in_bounds
from .tir_build import INT32, as_block_func, flat_view, local_buffer, seq


class SimdgroupTiling:
    names: tuple[str, str]  # thread-array names of the A and B fragments

    def __init__(self, problem: GemmProblem, inst: MatrixInstruction, part: Partition, analyzer: Any, thread_index: Any):
        self.inst = inst  # the plan's instruction: fragment shapes, per-lane element counts, lane maps
        self.p = problem
        self.part = part
        self.analyzer = analyzer
        self.wm = problem.M // part.m_warp
        self.wn = problem.N // part.n_warp
        self.rows = self.wm // self.inst.m
        self.cols = self.wn // self.inst.n
        self.k_steps = -(-problem.K // self.inst.k)
        # lane / simdgroup as functions of the (1-D) thread index: passes can bound them, and the
        # printer emits them as the Metal execution attributes.
        self.lane = tir.floormod(thread_index, SIMD_WIDTH)
        self.sg = tir.floordiv(thread_index, SIMD_WIDTH)
        self.warp_m = tir.floormod(self.sg, part.m_warp)
        self.warp_n = tir.floordiv(self.sg, part.m_warp)
        if part.replicas > 1:  # replica r of the grid is simdgroups [r * m_warp * n_warp, ...)
            self.warp_n = tir.floormod(self.warp_n, part.n_warp)
        self.thread_index = thread_index
        self.whole_k_steps = problem.K // self.inst.k  # steps that need no K guard
        self._check_bounds()
        self.register_a = None  # the lane's A elements when A is a register fragment
        if has_register_a(problem):
            self.register_a = flat_view(problem.A.buffer, register_a_elements(problem, self.inst, part), f"{problem.A.buffer.name}_flat")

    def load_register_a(self, ko: Any, a_frag: Any, row_block: int) -> Any:
        """Left operand of row block `row_block`, K step `ko`, copied from the register fragment A
        (whose layout already is the left operand's lane layout: gemm/register_operand.py)."""
        n = self.inst.left_elems
        src = left_operand_offset(self.inst, self.p, row_block, ko)
        value = tir.BufferLoad(self.register_a, [tir.Ramp(src, 1, n)])
        return tir.BufferStore(a_frag, value, [tir.Ramp(tir.const(row_block * n, INT32), 1, n)])

    def _check_bounds(self) -> None:
        """Which tiles provably lie inside their buffers (under the analyzer's current constraints):
        their K steps need no guard; the flags are reset for the last step of a ragged K."""
        self.a_ok = tile_in_bounds(self.p.A, self.analyzer)
        self.b_ok = tile_in_bounds(self.p.B, self.analyzer)
        self.c_ok = tile_in_bounds(self.p.C, self.analyzer)

    def init_accumulator(self, acc: Accumulator) -> Any:
        raise NotImplementedError

    def clear_or_keep(self, zero: Any, keep: Any) -> Any:
        """The accumulator's start: zeros (clear_accum), its current value, or either at run time."""
        flag = clear_flag(self.p)
        if flag is True:
            return zero
        if flag is False:
            return keep
        return tir.IfThenElse(self.p.clear_accum, zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        raise NotImplementedError

    def write_back(self, acc: Accumulator) -> Any:
        raise NotImplementedError

    def _k_loop(self, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        """The whole K steps as a loop (the analyzer knows the step range, so no K guard), then the
        last, partial step (ragged K) with its K guards."""
        steps = []
        if self.next_frags is not None and self.whole_k_steps >= 2:
            frags = ((a_frag, b_frag), self.next_frags)
            steps.append(prefetched_k_loop(self.k_step, self.analyzer, self.whole_k_steps, frags, acc))
        elif self.whole_k_steps:
            ko = tir.Var("k_outer", INT32)
            self.analyzer.bind(ko, tvm.ir.Range(0, self.whole_k_steps))
            body = self.k_step(ko, a_frag, b_frag, acc)
            steps.append(tir.For(ko, tir.const(0, INT32), tir.const(self.whole_k_steps, INT32), tir.ForKind.SERIAL, body))
        if self.k_steps > self.whole_k_steps:
            a_ok, b_ok = self.a_ok, self.b_ok
            self.a_ok = self.b_ok = False
            steps.append(self.k_step(tir.const(self.whole_k_steps, INT32), a_frag, b_frag, acc))
            self.a_ok, self.b_ok = a_ok, b_ok
        return seq(steps)

    def _inside_matrix(self) -> Any | None:
        """The condition that this simdgroup's block of C starts inside the matrix (rows and columns),
        read from an operand in device memory that spans that dimension (A or C for M, B or C for N);
        None when it holds for every simdgroup. It depends on the simdgroup and the threadgroup only,
        so a whole simdgroup takes the same side of it."""
        p = self.p
        m0, n0 = self.warp_m * self.wm, self.warp_n * self.wn
        rows = [(p.A.col0, p.A.col_extent) if p.trans_A else (p.A.row0, p.A.row_extent)] if p.A.scope in GLOBAL_SCOPES else []
        cols = [(p.B.row0, p.B.row_extent) if p.trans_B else (p.B.col0, p.B.col_extent)] if p.B.scope in GLOBAL_SCOPES else []
        if p.C.scope in GLOBAL_SCOPES:
            rows.append((p.C.row0, p.C.row_extent))
            cols.append((p.C.col0, p.C.col_extent))
        conds = []
        for offset, spans in ((m0, rows), (n0, cols)):
            for start, extent in spans:
                if const_int(extent) is None:
                    continue
                cond = start + offset < extent
                if not self.analyzer.can_prove(cond):
                    conds.append(cond)
                break
        if not conds:
            return None
        return conds[0] if len(conds) == 1 else tir.And(conds[0], conds[1])

    def _body(self, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        store = self.write_back(acc)
        if store is not None and self.part.replicas > 1:  # one replica stores C; the others hold the same values
            store = tir.IfThenElse(self.sg < self.part.m_warp * self.part.n_warp, store, None)
        k_loop = self._k_loop(a_frag, b_frag, acc)
        inside = self._inside_matrix()
        if inside is not None:
            # a simdgroup whose whole block lies past the matrix's edge skips its loads and matrix
            # operations: they would add products of zero-filled operands to elements never stored
            k_loop = tir.IfThenElse(inside, k_loop, None)
        return seq([self.init_accumulator(acc), k_loop, store])

    def build(self, name: str, *, k_prefetch: bool = False) -> Any:
        """The lowered T.gemm; `k_prefetch` is the plan's flag (decided by transform/gemm_plans.py)."""
        p = self.p
        a_frag = local_buffer(self.names[0], self.rows * self.inst.left_elems, p.A.dtype)
        b_frag = local_buffer(self.names[1], self.cols * self.inst.right_elems, p.B.dtype)
        acc = make_accumulator(p, self.rows * self.cols * self.inst.dest_elems)
        self.next_frags = None  # the second operand set of the register prefetch (gemm/prefetch.py)
        if k_prefetch:
            self.next_frags = (
                local_buffer(self.names[0] + "_next", self.rows * self.inst.left_elems, p.A.dtype),
                local_buffer(self.names[1] + "_next", self.cols * self.inst.right_elems, p.B.dtype),
            )
        interior = interior_condition(p, self.analyzer, self.thread_index, lambda s, n, e: dim_in_bounds(s, n, e, self.analyzer))
        if interior is None:
            body = self._body(a_frag, b_frag, acc)
        else:  # interior threadgroups run the aligned body, edge ones the guarded body
            with self.analyzer.constraint_scope(interior):
                self._check_bounds()
                inside = self._body(a_frag, b_frag, acc)
            self._check_bounds()
            body = uniform_branch(interior, inside, self._body(a_frag, b_frag, acc))
        allocs = [a_frag, b_frag] + list(self.next_frags or ()) + ([acc.buffer] if acc.owned else [])
        return as_block_func(body, allocs, name)
