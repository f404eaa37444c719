"""simdgroup_matrix 8x8 GEMM: the fallback for targets without Metal 4 and for shapes or policies
that cooperative tensors cannot take (spec section 3.2).

Each simdgroup owns a (M/m_warp) x (N/n_warp) block of C in fragments of the plan's instruction
(simdgroup_matrix 8x8, the only shape MSL has). Operands come from
shared or device memory: with `simdgroup_load` when the tile is provably inside its buffer, and
lane by lane (zero-filled outside the buffer) otherwise, which also covers K not a multiple of k.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir
from ..target.isa import MatrixInstruction
from ..selection import Partition
from .accumulator import Accumulator
from .problem import GemmProblem, Operand
from .tile_access import load_group, store_group
from .tiling import SimdgroupTiling
from .tir_build import seq


class SimdgroupPlan(SimdgroupTiling):
    names = ("A_sg", "B_sg")

    def __init__(self, problem: GemmProblem, inst: MatrixInstruction, part: Partition, analyzer: Any, thread_index: Any):
        super().__init__(problem, inst, part, analyzer, thread_index)
        # the lane's first element in each role's fragment (its others follow in the same row)
        self.origins = {role.role: (role.row(self.lane, 0), role.col(self.lane, 0)) for role in (inst.left, inst.right, inst.destination)}
        self.lrow, self.lcol = self.origins["destination"]

    def _load_fragment(self, op: Operand, role: Any, transposed: bool, frag: Any, index: int, r0: Any, c0: Any, fits: bool) -> Any:
        """Fragment `index` of `frag` = logical block of `role`'s shape at (r0, c0) of the operand."""
        if fits and not op.remapped:
            sr, sc = (c0, r0) if transposed else (r0, c0)
            return intrinsics.build_sg_load(frag.data, index, op.address(sr, sc), op.row_stride, transposed, role.rows, role.cols)
        lrow, lcol = self.origins[role.role]
        e = role.elems
        return load_group(op, transposed, r0 + lrow, c0 + lcol, e, frag, index * e, False, self.analyzer)

    def _c_origin(self, i: int, j: int) -> tuple:
        return self.warp_m * self.wm + i * self.inst.m, self.warp_n * self.wn + j * self.inst.n

    def init_accumulator(self, acc: Accumulator) -> Any:
        E = self.inst.dest_elems
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
        return self.clear_or_keep(zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        p, inst = self.p, self.inst
        k0 = ko * inst.k
        if self.register_a is not None:
            loads = [self.load_register_a(ko, a_frag, i) for i in range(self.rows)]
        else:
            loads = [
                self._load_fragment(p.A, inst.left, p.trans_A, a_frag, i, self.warp_m * self.wm + i * inst.m, k0, self.a_ok)
                for i in range(self.rows)
            ]
        loads += [
            self._load_fragment(p.B, inst.right, p.trans_B, b_frag, j, k0, self.warp_n * self.wn + j * inst.n, self.b_ok)
            for j in range(self.cols)
        ]
        mmas = [
            intrinsics.build_sg_mma(acc.buffer.data, i * self.cols + j, a_frag.data, i, b_frag.data, j)
            for i in range(self.rows)
            for j in range(self.cols)
        ]
        return seq(loads + mmas)

    def write_back(self, acc: Accumulator) -> Any:
        if not acc.owned:
            return None
        E, dest = self.inst.dest_elems, self.inst.destination
        stmts = []
        direct = self.c_ok and str(self.p.C.dtype) == acc.dtype and not self.p.C.remapped
        for i in range(self.rows):
            for j in range(self.cols):
                r, c = self._c_origin(i, j)
                f = i * self.cols + j
                if direct:
                    stmts.append(intrinsics.build_sg_store(acc.buffer.data, f, self.p.C.address(r, c, "w"), self.p.C.row_stride, dest.rows, dest.cols))
                else:
                    stmts.append(store_group(self.p.C, r + self.lrow, c + self.lcol, E, acc.buffer, f * E, self.c_ok, self.analyzer))
        return seq(stmts)


def lower_simdgroup(problem: GemmProblem, inst: MatrixInstruction, part: Partition, analyzer: Any, thread_index: Any, *, k_prefetch: bool = False) -> Any:
    return SimdgroupPlan(problem, inst, part, analyzer, thread_index).build("tlm_gemm_simdgroup", k_prefetch=k_prefetch)
