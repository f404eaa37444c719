"""simdgroup_matrix 8x8 GEMM: the fallback for targets without Metal 4 and for shapes or policies
that cooperative tensors cannot take (spec section 3.2).

Each simdgroup owns a (M/m_warp) x (N/n_warp) block of C in 8x8 fragments. Operands come from
shared or device memory: with `simdgroup_load` when the tile is provably inside its buffer, and
lane by lane (zero-filled outside the buffer) otherwise, which also covers K not a multiple of 8.
"""

from __future__ import annotations

from typing import Any

from .._host import tir, tvm
from ..selection import SG_FRAG, Partition
from . import lane_layout as L
from .accumulator import Accumulator, clear_flag, make_accumulator
from .problem import GemmProblem, Operand
from .tile_access import load_group, store_group, tile_in_bounds
from .tir_build import INT32, SG_LOAD, SG_MMA, SG_STORE, as_block_func, call, local_buffer, seq

E = L.SG_ELEMS_PER_LANE


class SimdgroupPlan:
    def __init__(self, problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any):
        self.p = problem
        self.part = part
        self.analyzer = analyzer
        self.wm = problem.M // part.m_warp
        self.wn = problem.N // part.n_warp
        self.rows = self.wm // SG_FRAG
        self.cols = self.wn // SG_FRAG
        self.k_steps = -(-problem.K // SG_FRAG)
        # lane / simdgroup as functions of the (1-D) thread index: passes can bound them, and the
        # printer emits them as the Metal execution attributes.
        self.lane = tir.floormod(thread_index, 32)
        self.sg = tir.floordiv(thread_index, 32)
        self.warp_m = tir.floormod(self.sg, part.m_warp)
        self.warp_n = tir.floordiv(self.sg, part.m_warp)
        self.lrow = L.sg_row(self.lane)
        self.lcol = L.sg_col(self.lane, 0)
        k_whole = problem.K % SG_FRAG == 0
        self.a_ok = k_whole and tile_in_bounds(problem.A, analyzer)
        self.b_ok = k_whole and tile_in_bounds(problem.B, analyzer)
        self.c_ok = tile_in_bounds(problem.C, analyzer)

    def _load_fragment(self, op: Operand, transposed: bool, frag: Any, index: int, r0: Any, c0: Any, fits: bool) -> Any:
        """Fragment `index` of `frag` = logical 8x8 block at (r0, c0) of the operand."""
        if fits:
            sr, sc = (c0, r0) if transposed else (r0, c0)
            return call(SG_LOAD, frag.data, index, op.address(sr, sc), op.row_stride, tir.const(transposed, "bool"))
        return load_group(op, transposed, r0 + self.lrow, c0 + self.lcol, E, frag, index * E, False, self.analyzer)

    def _c_origin(self, i: int, j: int) -> tuple:
        return self.warp_m * self.wm + i * SG_FRAG, self.warp_n * self.wn + j * SG_FRAG

    def init_accumulator(self, acc: Accumulator) -> Any:
        nfrag = self.rows * self.cols
        zero = seq(tir.BufferStore(acc.buffer, tir.Broadcast(tir.const(0, acc.dtype), E), [tir.Ramp(f * E, 1, E)]) for f in range(nfrag))
        keep = None
        if acc.owned:
            keep = seq(
                load_group(self.p.C, False, r + self.lrow, c + self.lcol, E, acc.buffer, (i * self.cols + j) * E, self.c_ok, self.analyzer)
                for i in range(self.rows)
                for j in range(self.cols)
                for r, c in [self._c_origin(i, j)]
            )
        flag = clear_flag(self.p)
        if flag is True:
            return zero
        if flag is False:
            return keep
        return tir.IfThenElse(self.p.clear_accum, zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        p = self.p
        k0 = ko * SG_FRAG
        loads = [
            self._load_fragment(p.A, p.trans_A, a_frag, i, self.warp_m * self.wm + i * SG_FRAG, k0, self.a_ok) for i in range(self.rows)
        ]
        loads += [
            self._load_fragment(p.B, p.trans_B, b_frag, j, k0, self.warp_n * self.wn + j * SG_FRAG, self.b_ok) for j in range(self.cols)
        ]
        mmas = [
            call(SG_MMA, acc.buffer.data, i * self.cols + j, a_frag.data, i, b_frag.data, j) for i in range(self.rows) for j in range(self.cols)
        ]
        return seq(loads + mmas)

    def write_back(self, acc: Accumulator) -> Any:
        if not acc.owned:
            return None
        stmts = []
        direct = self.c_ok and str(self.p.C.dtype) == acc.dtype
        for i in range(self.rows):
            for j in range(self.cols):
                r, c = self._c_origin(i, j)
                f = i * self.cols + j
                if direct:
                    stmts.append(call(SG_STORE, acc.buffer.data, f, self.p.C.address(r, c, "w"), self.p.C.row_stride))
                else:
                    stmts.append(store_group(self.p.C, r + self.lrow, c + self.lcol, E, acc.buffer, f * E, self.c_ok, self.analyzer))
        return seq(stmts)

    def build(self, name: str) -> Any:
        p = self.p
        a_frag = local_buffer("A_sg", self.rows * E, p.A.dtype)
        b_frag = local_buffer("B_sg", self.cols * E, p.B.dtype)
        acc = make_accumulator(p, self.rows * self.cols * E)
        ko = tir.Var("k_outer", INT32)
        k_loop = tir.For(ko, tir.const(0, INT32), tir.const(self.k_steps, INT32), tir.ForKind.SERIAL, self.k_step(ko, a_frag, b_frag, acc))
        body = seq([self.init_accumulator(acc), k_loop, self.write_back(acc)])
        allocs = [a_frag, b_frag] + ([acc.buffer] if acc.owned else [])
        return as_block_func(body, allocs, name)


def lower_simdgroup(problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any) -> Any:
    return SimdgroupPlan(problem, part, analyzer, thread_index).build("tlm_gemm_simdgroup")
