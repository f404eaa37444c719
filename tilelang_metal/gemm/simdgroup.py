"""simdgroup_matrix 8x8 GEMM: the fallback for targets without Metal 4 and for shapes or policies
that cooperative tensors cannot take (spec section 3.2).

Each simdgroup owns a (M/m_warp) x (N/n_warp) block of C in 8x8 fragments. Operands come from
shared or device memory: with `simdgroup_load` when the tile is provably inside its buffer, and
lane by lane (zero-filled outside the buffer) otherwise, which also covers K not a multiple of 8.
"""

from __future__ import annotations

from typing import Any

from .. import intrinsics
from ..host import tir
from ..isa import SIMDGROUP_8x8x8
from ..selection import Partition
from .accumulator import Accumulator
from .problem import GemmProblem, Operand
from .tile_access import load_group, store_group
from .tiling import SimdgroupTiling
from .tir_build import seq

SG_FRAG = SIMDGROUP_8x8x8.m
E = SIMDGROUP_8x8x8.dest_elems


class SimdgroupPlan(SimdgroupTiling):
    inst = SIMDGROUP_8x8x8
    names = ("A_sg", "B_sg")

    def __init__(self, problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any):
        super().__init__(problem, part, analyzer, thread_index)
        self.lrow = self.inst.row(self.lane, 0)
        self.lcol = self.inst.col(self.lane, 0)

    def _load_fragment(self, op: Operand, transposed: bool, frag: Any, index: int, r0: Any, c0: Any, fits: bool) -> Any:
        """Fragment `index` of `frag` = logical 8x8 block at (r0, c0) of the operand."""
        if fits and not op.remapped:
            sr, sc = (c0, r0) if transposed else (r0, c0)
            return intrinsics.build_sg_load(frag.data, index, op.address(sr, sc), op.row_stride, transposed)
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
        return self.clear_or_keep(zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        p = self.p
        k0 = ko * SG_FRAG
        if self.register_a is not None:
            loads = [self.load_register_a(ko, a_frag, i) for i in range(self.rows)]
        else:
            loads = [
                self._load_fragment(p.A, p.trans_A, a_frag, i, self.warp_m * self.wm + i * SG_FRAG, k0, self.a_ok) for i in range(self.rows)
            ]
        loads += [
            self._load_fragment(p.B, p.trans_B, b_frag, j, k0, self.warp_n * self.wn + j * SG_FRAG, self.b_ok) for j in range(self.cols)
        ]
        mmas = [
            intrinsics.build_sg_mma(acc.buffer.data, i * self.cols + j, a_frag.data, i, b_frag.data, j) for i in range(self.rows) for j in range(self.cols)
        ]
        return seq(loads + mmas)

    def write_back(self, acc: Accumulator) -> Any:
        if not acc.owned:
            return None
        stmts = []
        direct = self.c_ok and str(self.p.C.dtype) == acc.dtype and not self.p.C.remapped
        for i in range(self.rows):
            for j in range(self.cols):
                r, c = self._c_origin(i, j)
                f = i * self.cols + j
                if direct:
                    stmts.append(intrinsics.build_sg_store(acc.buffer.data, f, self.p.C.address(r, c, "w"), self.p.C.row_stride))
                else:
                    stmts.append(store_group(self.p.C, r + self.lrow, c + self.lcol, E, acc.buffer, f * E, self.c_ok, self.analyzer))
        return seq(stmts)


def lower_simdgroup(problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any) -> Any:
    return SimdgroupPlan(problem, part, analyzer, thread_index).build("tlm_gemm_simdgroup")
