"""A `T.gemm` whose A operand is a register fragment (`local.fragment`), as in attention's P.V.

The fragment is read in place, so its layout must be the one the matrix instruction's left operand
wants. That layout is the instruction's *destination* layout for an (M x K) tile whose rows are
split over `m_warp` simdgroups, every simdgroup holding whole rows (all K columns):

- simdgroup 8x8: left, right and destination matrices share one lane map (isa.SIMDGROUP_8x8_MAP), so the 8x8
  block (i, k) of A is elements [2f, 2f+2) of the lane, f = i * (K/8) + k.
- cooperative tensors 16x32x16: the left operand (16x16) uses the destination formula restricted to
  e < 8, and a 16x32 destination tile's elements 8..15 are the next 16x16 block with the same
  pattern (docs/lane_layouts.md). So the left operand of K step s in row block i is elements
  [8 (i * K/16 + s), +8): a straight copy, no lane exchange.

`m_warp` is as many simdgroups as M has whole instruction rows for (`selection.row_partition`):
all of them when M allows (M = 64 on 4 simdgroups), fewer for short tiles (decoding's 16 query
heads on 4 or 8 simdgroups). The other simdgroups split C along N and hold A *replicated*: the
A layout is replicated `simdgroups / m_warp` times, simdgroup warp_m + m_warp * q holding the rows
of block warp_m for every q.

Hence a GEMM accumulator produced with the same rows split, no N split and the same replication
(transform/fragment_groups.py gives the producing T.gemm that partition) feeds the next GEMM's A
with no data movement; `T.copy(acc_s, acc_s_cast)` is a per-lane cast.
Layout inference decides: GemmMetal proposes this layout for A; if the producing op gave A another
one, lowering stops with a `GemmLoweringError` (never a silent reinterpretation).
"""

from __future__ import annotations

from typing import Any

from ..host import fragments_agree
from ..errors import GemmLoweringError
from ..target.isa import SIMD_WIDTH, MatrixInstruction
from ..core.scopes import FRAGMENT_SCOPES
from ..planning import register_a_blockers
from ..selection import Partition, row_partition
from .problem import GemmProblem, Operand


def has_register_a(problem: GemmProblem) -> bool:
    return problem.A.scope in FRAGMENT_SCOPES


def register_a_partition(problem: GemmProblem, inst: MatrixInstruction, num_warps: int) -> Partition:
    """The rows of A (and C) over as many simdgroups as whole tiles allow, N split over the others
    as far as it goes, the rest replicated (`selection.row_partition`)."""
    reasons = register_a_blockers(problem.M, problem.N, problem.K, inst)
    part = row_partition(problem.M, problem.N, num_warps, inst.m, inst.n, split_n=True) if not reasons else None
    if part is None:
        a = problem.A.buffer
        raise GemmLoweringError(
            f"T.gemm with A in a register fragment ({a.name}, {problem.M}x{problem.K}) needs whole {inst.m}x{inst.n} "
            f"{inst.kind} tiles: " + "; ".join(reasons) + f". Use block sizes that are multiples of {inst.m} (M) and "
            f"{inst.n} (N, K)."
        )
    return part


def register_a_replicas(part: Partition) -> int:
    """How many simdgroups hold each row block of A: all that share its warp_m."""
    return part.simdgroups // part.m_warp


def validate_register_a(problem: GemmProblem) -> None:
    A = problem.A
    if problem.trans_A:
        raise GemmLoweringError(
            f"T.gemm with A in a register fragment ({A.buffer.name}) cannot transpose A on Metal; "
            "store A in the order the product needs (transpose_A=False)."
        )
    if A.rows != int(A.buffer.shape[-2]) or A.cols != int(A.buffer.shape[-1]) or len(A.buffer.shape) != 2:
        raise GemmLoweringError(
            f"T.gemm register-fragment operand A ({A.buffer.name}) must be a whole 2-D fragment, got a "
            f"{A.rows}x{A.cols} region of {list(A.buffer.shape)}"
        )


def register_a_elements(problem: GemmProblem, inst: MatrixInstruction, part: Partition) -> int:
    """Elements of A each lane holds: its row blocks times K's destination tiles."""
    return (problem.M // part.m_warp // inst.m) * (problem.K // inst.n) * inst.dest_elems


def register_a_layout(problem: GemmProblem, inst: MatrixInstruction, part: Partition, make_fragment_layout: Any) -> Any:
    """The Fragment layout A must have: the destination layout of an M x K tile (see module doc)."""
    wm = problem.M // part.m_warp
    tiles_per_row = problem.K // inst.n
    replicas = register_a_replicas(part)

    def thread(i: Any, k: Any, rep: Any = 0) -> Any:
        return (i // wm + part.m_warp * rep) * SIMD_WIDTH + inst.lane_of((i % wm) % inst.m, k % inst.n)

    def index(i: Any, k: Any) -> Any:
        tile = ((i % wm) // inst.m) * tiles_per_row + k // inst.n
        return tile * inst.dest_elems + inst.elem_of((i % wm) % inst.m, k % inst.n)

    return make_fragment_layout([problem.M, problem.K], thread, index, replicas)


def left_operand_offset(inst: MatrixInstruction, problem: GemmProblem, row_block: int, k_step: Any) -> Any:
    """Offset in the lane's A elements of the left operand for row block `row_block`, K step `k_step`.

    Per row block there are K/inst.k left operands of inst.left_elems elements each, stored in order
    (a destination tile holds inst.n/inst.k of them back to back)."""
    steps = problem.K // inst.k
    return (row_block * steps + k_step) * inst.left_elems


def check_register_a_layout(problem: GemmProblem, expected: Any, layout_map: Any) -> None:
    """Lower-time guard: the layout inference gave A the layout this lowering reads."""
    buf = problem.A.buffer
    actual = layout_map[buf] if buf in layout_map else None
    if actual is None or not fragments_agree(expected, actual):
        raise GemmLoweringError(
            f"T.gemm reads register fragment {buf.name} as its A operand in the matrix instruction's lane layout, "
            f"but layout inference gave {buf.name} a different layout"
            + ("" if actual is None else f" ({actual})")
            + ". Produce it from a T.gemm accumulator of the same shape and threads (or copy it through shared memory)."
        )

