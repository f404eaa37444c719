"""What every GEMM dataflow shares: the per-simdgroup tiling of C and the K-loop skeleton.

Simdgroup `sg` owns the (M/m_warp) x (N/n_warp) block (warp_m, warp_n) = (sg % m_warp, sg // m_warp)
of C, covered by `rows x cols` instruction fragments. Subclasses say how big a fragment is, how a
K step gathers operands and runs the MMAs, and how the accumulator is cleared and written back.
"""

from __future__ import annotations

from typing import Any

from .._host import tir
from ..isa import SIMD_WIDTH, MatrixInstruction
from ..selection import Partition
from .accumulator import Accumulator, clear_flag, make_accumulator
from .problem import GemmProblem
from .tile_access import tile_in_bounds
from .register_operand import has_register_a, left_operand_offset, register_a_elements
from .tir_build import INT32, as_block_func, flat_view, local_buffer, seq


class SimdgroupTiling:
    inst: MatrixInstruction  # the fragment shape and per-lane element counts
    names: tuple[str, str]  # thread-array names of the A and B fragments

    def __init__(self, problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any):
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
        k_whole = problem.K % self.inst.k == 0
        self.a_ok = k_whole and tile_in_bounds(problem.A, analyzer)
        self.b_ok = k_whole and tile_in_bounds(problem.B, analyzer)
        self.c_ok = tile_in_bounds(problem.C, analyzer)
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

    def build(self, name: str) -> Any:
        p = self.p
        a_frag = local_buffer(self.names[0], self.rows * self.inst.left_elems, p.A.dtype)
        b_frag = local_buffer(self.names[1], self.cols * self.inst.right_elems, p.B.dtype)
        acc = make_accumulator(p, self.rows * self.cols * self.inst.dest_elems)
        ko = tir.Var("k_outer", INT32)
        k_loop = tir.For(ko, tir.const(0, INT32), tir.const(self.k_steps, INT32), tir.ForKind.SERIAL, self.k_step(ko, a_frag, b_frag, acc))
        body = seq([self.init_accumulator(acc), k_loop, self.write_back(acc)])
        allocs = [a_frag, b_frag] + ([acc.buffer] if acc.owned else [])
        return as_block_func(body, allocs, name)
