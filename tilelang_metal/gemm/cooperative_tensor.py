"""The cooperative-tensor GEMM skeleton shared by the direct-global and shared dataflows.

Each simdgroup owns a (M/m_warp) x (N/n_warp) block of C, covered by `rows x cols` destination
fragments of matmul2d(16, 32, 16). Per K step of 16, every lane gathers its elements of the left
(16x16) and right (16x32) operands into thread arrays, and one `tlm_ct_mma` per fragment runs the
MPP op. The accumulator keeps its lane layout from first clear to final store, so the printer can
keep it in destination cooperative tensors for the whole K loop.
"""

from __future__ import annotations

from typing import Any

from .._host import tir
from ..selection import CT_FRAG_K, CT_FRAG_M, CT_FRAG_N, Partition
from . import lane_layout as L
from .accumulator import Accumulator
from .problem import GemmProblem
from .tile_access import load_group, store_group
from .tiling import SimdgroupTiling
from .tir_build import CT_MMA, call, seq

GROUP = 4  # consecutive columns one lane owns in every layout row


class CooperativeTensorPlan(SimdgroupTiling):
    frag_m, frag_n, frag_k = CT_FRAG_M, CT_FRAG_N, CT_FRAG_K
    a_elems, b_elems, c_elems = L.CT_LEFT_ELEMS, L.CT_RIGHT_ELEMS, L.CT_DEST_ELEMS
    names = ("A_frag", "B_frag")

    def __init__(self, problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any):
        super().__init__(problem, part, analyzer, thread_index)
        self.brow = L.ct_base_row(self.lane)
        self.bcol = L.ct_base_col(self.lane)

    # Destination element group g (0..3) of fragment (i, j): 4 consecutive columns of one row.
    def c_group_origin(self, i: int, j: int, g: int) -> tuple:
        row = self.warp_m * self.wm + i * CT_FRAG_M + self.brow + 8 * (g % 2)
        col = self.warp_n * self.wn + j * CT_FRAG_N + 16 * (g // 2) + self.bcol
        return row, col

    def c_groups(self) -> list:
        return [(i * self.cols + j, g, *self.c_group_origin(i, j, g)) for i in range(self.rows) for j in range(self.cols) for g in range(4)]

    def init_accumulator(self, acc: Accumulator) -> Any:
        zero = seq(
            tir.BufferStore(acc.buffer, tir.Broadcast(tir.const(0, acc.dtype), GROUP), [tir.Ramp(chunk * 16 + 4 * g, 1, GROUP)])
            for chunk, g, _, _ in self.c_groups()
        )
        if acc.owned:
            keep = seq(
                load_group(self.p.C, False, row, col, GROUP, acc.buffer, chunk * 16 + 4 * g, self.c_ok, self.analyzer)
                for chunk, g, row, col in self.c_groups()
            )
        else:
            keep = None  # a register fragment already holds its running sum
        return self.clear_or_keep(zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        p = self.p
        loads = []
        for i in range(self.rows):
            for g in range(2):
                m = self.warp_m * self.wm + i * CT_FRAG_M + self.brow + 8 * g
                k = ko * CT_FRAG_K + self.bcol
                loads.append(load_group(p.A, p.trans_A, m, k, GROUP, a_frag, i * L.CT_LEFT_ELEMS + 4 * g, self.a_ok, self.analyzer))
        for j in range(self.cols):
            for g in range(4):
                k = ko * CT_FRAG_K + self.brow + 8 * (g % 2)
                n = self.warp_n * self.wn + j * CT_FRAG_N + 16 * (g // 2) + self.bcol
                loads.append(load_group(p.B, p.trans_B, k, n, GROUP, b_frag, j * L.CT_RIGHT_ELEMS + 4 * g, self.b_ok, self.analyzer))
        mmas = [
            call(CT_MMA, acc.buffer.data, i * self.cols + j, a_frag.data, i * L.CT_LEFT_ELEMS, b_frag.data, j * L.CT_RIGHT_ELEMS)
            for i in range(self.rows)
            for j in range(self.cols)
        ]
        return seq(loads + mmas)

    def write_back(self, acc: Accumulator) -> Any:
        if not acc.owned:
            return None
        return seq(
            store_group(self.p.C, row, col, GROUP, acc.buffer, chunk * 16 + 4 * g, self.c_ok, self.analyzer)
            for chunk, g, row, col in self.c_groups()
        )
