"""Register prefetch in the K loop (`TILELANG_METAL_K_PREFETCH=1`): the operands of step k+1 are
loaded into a second set of thread arrays while step k's matrix operations run.

The loop is unrolled by 2 so that each of the two operand sets has constant indices (no dynamic
array indexing, which would push the arrays out of registers):

    load(0) -> X0
    for kp in [0, P):                       P = (steps - 1) // 2
        load(2kp+1) -> X1;  mma(X0);  load(2kp+2) -> X0;  mma(X1)
    steps odd:  mma(X0)
    steps even: load(steps-1) -> X1;  mma(X0);  mma(X1)

Loads and MMAs of a step come from the dataflow's own `k_step` (split apart here), so the loads
are the same instructions, guards and vector widths as without prefetch; only their order changes.
Register cost: one more copy of the per-step operand arrays (`A_frag`/`B_frag` or `A_sg`/`B_sg`):
for the default 64x128 tile on 128 threads, 48 halves (96 bytes) per thread on the
cooperative-tensor path, 12 simdgroup matrices of 2 halves (48 bytes) per thread on the simdgroup path.
Applies to direct-global operands only (threadgroup memory is close enough not to need it).
"""

from __future__ import annotations

from typing import Any

from ..core import intrinsics
from ..host import tir, tvm
from .tir_build import INT32, seq


def _is_mma(stmt: Any) -> bool:
    if not isinstance(stmt, tir.Evaluate):
        return False
    call = stmt.value
    return intrinsics.match_ct_mma(call) is not None or intrinsics.op_name(call) == intrinsics.SG_MMA


def split_step(step: Any) -> tuple[list[Any], list[Any]]:
    """(loads, matrix operations) of one K step built by a dataflow's `k_step`."""
    parts = list(step.seq) if isinstance(step, tir.SeqStmt) else [step]
    return [s for s in parts if not _is_mma(s)], [s for s in parts if _is_mma(s)]


def prefetched_k_loop(k_step: Any, analyzer: Any, steps: int, frags: tuple, acc: Any) -> Any:
    """`steps` whole K steps (steps >= 2) with the next step's operands loaded ahead.

    `k_step(ko, a_frag, b_frag, acc)` builds one step; `frags` = ((A0, B0), (A1, B1))."""
    (a0, b0), (a1, b1) = frags

    def loads(ko: Any, a: Any, b: Any) -> list[Any]:
        return split_step(k_step(ko, a, b, acc))[0]

    def mmas(a: Any, b: Any) -> list[Any]:
        return split_step(k_step(tir.const(0, INT32), a, b, acc))[1]

    out = loads(tir.const(0, INT32), a0, b0)
    pairs = (steps - 1) // 2
    if pairs:
        kp = tir.Var("k_pair", INT32)
        analyzer.bind(kp, tvm.ir.Range(0, pairs))
        body = seq(loads(kp * 2 + 1, a1, b1) + mmas(a0, b0) + loads(kp * 2 + 2, a0, b0) + mmas(a1, b1))
        out.append(tir.For(kp, tir.const(0, INT32), tir.const(pairs, INT32), tir.ForKind.SERIAL, body))
    if steps % 2:
        out += mmas(a0, b0)
    else:
        out += loads(tir.const(steps - 1, INT32), a1, b1) + mmas(a0, b0) + mmas(a1, b1)
    return seq(out)
