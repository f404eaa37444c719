"""Cooperative-tensor GEMM (MPP matmul2d), for both dataflows of the spec.

- direct-global (section 1): A and B are read straight from device memory into MPP operands, no
  threadgroup memory and no barrier;
- shared (section 3.1): A and B already live in threadgroup memory, staged by the kernel's own
  T.copy (shared memory may carry layout, padding, zero-fill or reuse semantics, so it is kept).

Each simdgroup owns a (M/m_warp) x (N/n_warp) block of C, covered by `rows x cols` destination
fragments of the plan's instruction (an `isa.MatrixInstruction`). Per K step, every lane gathers its elements
of the left and right operands into thread arrays, in runs of `inst.run` consecutive columns, and
one `tlm_ct_mma` per fragment runs the MPP op. A transposed operand (`transpose_A` / `transpose_B`)
is handed to the op as stored, with the descriptor's transpose flag (`MatrixInstruction.transposed`),
so its runs are consecutive in storage too and load as vectors. The accumulator keeps its lane layout from first
clear to final store, so the printer can keep it in destination cooperative tensors for the whole
K loop. Edge tiles read zeros outside the buffers and skip stores there; aligned tiles stay
branch-free.
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir
from ..target.isa import MatrixInstruction
from ..selection import Partition
from .accumulator import Accumulator
from .problem import GemmProblem
from .tile_access import load_group, store_group
from .tiling import SimdgroupTiling
from .tir_build import seq


class CooperativeTensorPlan(SimdgroupTiling):
    names = ("A_frag", "B_frag")

    def __init__(self, problem: GemmProblem, inst: MatrixInstruction, part: Partition, analyzer: Any, thread_index: Any):
        super().__init__(problem, inst, part, analyzer, thread_index)
        inst = self.inst
        # Element runs of each lane: run g starts at element g * inst.run of every fragment.
        self.a_runs = inst.left_elems // inst.run
        self.b_runs = inst.right_elems // inst.run
        self.c_runs = inst.dest_elems // inst.run

    def run_origin(self, g: int, role: Any = None) -> tuple:
        """(row, col) inside a fragment of `role` (default: the destination) of the first element
        of this lane's run g."""
        role = role or self.inst.destination
        e = g * self.inst.run
        return role.row(self.lane, e), role.col(self.lane, e)

    def c_runs_of_tile(self) -> list:
        """(fragment, run, row, col) of every destination run of this lane, in C tile coordinates."""
        out = []
        for i in range(self.rows):
            for j in range(self.cols):
                for g in range(self.c_runs):
                    r, c = self.run_origin(g)
                    row = self.warp_m * self.wm + i * self.inst.m + r
                    col = self.warp_n * self.wn + j * self.inst.n + c
                    out.append((i * self.cols + j, g, row, col))
        return out

    def init_accumulator(self, acc: Accumulator) -> Any:
        run, elems = self.inst.run, self.inst.dest_elems
        zero = seq(
            tir.BufferStore(acc.buffer, tir.Broadcast(tir.const(0, acc.dtype), run), [tir.Ramp(chunk * elems + run * g, 1, run)])
            for chunk, g, _, _ in self.c_runs_of_tile()
        )
        if acc.owned:
            keep = seq(
                load_group(self.p.C, False, row, col, run, acc.buffer, chunk * elems + run * g, self.c_ok, self.analyzer)
                for chunk, g, row, col in self.c_runs_of_tile()
            )
        else:
            keep = None  # a register fragment already holds its running sum
        return self.clear_or_keep(zero, keep)

    def k_step(self, ko: Any, a_frag: Any, b_frag: Any, acc: Accumulator) -> Any:
        p, inst = self.p, self.inst
        loads = []
        for i in range(self.rows):
            if self.register_a is not None:
                loads.append(self.load_register_a(ko, a_frag, i))
                continue
            for g in range(self.a_runs):
                r, c = self.run_origin(g, inst.left)
                m_off, k_off = (c, r) if inst.transpose_left else (r, c)
                m = self.warp_m * self.wm + i * inst.m + m_off
                k = ko * inst.k + k_off
                dst = i * inst.left_elems + inst.run * g
                loads.append(self._gather(p.A, p.trans_A, inst.transpose_left, m, k, a_frag, dst, self.a_ok))
        for j in range(self.cols):
            for g in range(self.b_runs):
                r, c = self.run_origin(g, inst.right)
                n_off, k_off = (r, c) if inst.transpose_right else (c, r)
                k = ko * inst.k + k_off
                n = self.warp_n * self.wn + j * inst.n + n_off
                dst = j * inst.right_elems + inst.run * g
                loads.append(self._gather(p.B, p.trans_B, inst.transpose_right, k, n, b_frag, dst, self.b_ok))
        mmas = [
            intrinsics.build_ct_mma(
                inst, acc.buffer.data, i * self.cols + j, a_frag.data, i * inst.left_elems, b_frag.data, j * inst.right_elems
            )
            for i in range(self.rows)
            for j in range(self.cols)
        ]
        return seq(loads + mmas)

    def _gather(self, op: Any, transposed: bool, held_transposed: bool, row: Any, col: Any, frag: Any, dst: int, ok: bool) -> Any:
        """One run of `frag` from logical element (row, col) on. A role the instruction holds
        transposed (descriptor flag) runs along the operand's storage rows: read it in storage
        order; otherwise the run is a logical row, strided in storage when the operand is transposed."""
        if held_transposed:
            return load_group(op, False, col, row, self.inst.run, frag, dst, ok, self.analyzer)
        return load_group(op, transposed, row, col, self.inst.run, frag, dst, ok, self.analyzer)

    def write_back(self, acc: Accumulator) -> Any:
        if not acc.owned:
            return None
        run, elems = self.inst.run, self.inst.dest_elems
        return seq(
            store_group(self.p.C, row, col, run, acc.buffer, chunk * elems + run * g, self.c_ok, self.analyzer)
            for chunk, g, row, col in self.c_runs_of_tile()
        )


def lower_cooperative_tensor(
    problem: GemmProblem, inst: MatrixInstruction, part: Partition, analyzer: Any, thread_index: Any, dataflow: str, *, k_prefetch: bool = False
) -> Any:
    if (problem.trans_A or problem.trans_B) and inst.can_transpose(problem.trans_A, problem.trans_B):
        # the descriptor transposes: each lane reads its runs in the operands' storage order
        inst = inst.transposed(problem.trans_A, problem.trans_B)
    return CooperativeTensorPlan(problem, inst, part, analyzer, thread_index).build(f"tlm_gemm_ct_{dataflow}", k_prefetch=k_prefetch)
