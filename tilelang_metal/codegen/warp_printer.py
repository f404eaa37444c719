"""Printing of warp-level calls (warp reductions, votes, warp sync) as simdgroup collectives. A mixin
of the kernel printer; the MSL text is built in simd_collectives.py. Shuffles were rewritten before
(legalize/segmented_shuffles.py) into Metal's shuffles and `select`, which print as ordinary calls."""

from __future__ import annotations

from typing import Any

from ..errors import CodegenError
from . import simd_collectives as simd
from ..host import vocab


class WarpPrinting:
    """Needs from the host printer: `expr`."""

    def warp_call(self, op: str, e: Any) -> str | None:
        """CUDA-style warp reductions / votes as simdgroup collectives (simd_collectives.py); None when
        `op` is not one of them. Shuffles arrive as Metal's own calls (legalize/segmented_shuffles.py)."""
        args = e.args
        if op.startswith(vocab.TL_WARP_REDUCE_PREFIX):
            kind = op[len(vocab.TL_WARP_REDUCE_PREFIX) :]
            if kind not in simd.WARP_REDUCTIONS:
                raise CodegenError(f"{op} has no Metal simdgroup equivalent")
            return simd.warp_reduce(kind, self.expr(args[0]))
        if op in (vocab.TL_ANY_SYNC, vocab.TL_ALL_SYNC):
            vote = "simd_any" if op == vocab.TL_ANY_SYNC else "simd_all"
            return f"((int){vote}(({self.expr(args[1])}) != 0))"
        if op in (vocab.TL_BALLOT_SYNC, vocab.TL_BALLOT):
            predicate = self.expr(args[-1])
            return f"((ulong)((simd_vote::vote_t)simd_ballot(({predicate}) != 0)))"
        if op == vocab.TL_SYNC_WARP:  # CUDA's __syncwarp also orders the lanes' memory accesses
            return "simdgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup)"
        if op in (vocab.TIRX_TVM_WARP_ACTIVEMASK, vocab.TL_ACTIVEMASK):
            return "0xffffffffu"
        if op == vocab.TIRX_TVM_THREAD_ALLREDUCE:
            raise CodegenError("tvm_thread_allreduce reached the Metal printer unlowered (LowerThreadAllreduce must run first)")
        return None
