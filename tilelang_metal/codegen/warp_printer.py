"""Printing of warp-level calls (CUDA-style shuffles, warp reductions, votes) as simdgroup
collectives. A mixin of the kernel printer; the MSL text is built in simd_collectives.py."""

from __future__ import annotations

from typing import Any

from ..host import tir
from ..errors import CodegenError
from . import simd_collectives as simd
from ..host import vocab


class WarpPrinting:
    """Needs from the host printer: `expr`, `used_positions`, `position_names`."""

    WARP_SHUFFLES = {
        # op -> (collective, value arg, lane / delta / mask arg, width arg or None for a whole simdgroup)
        vocab.TL_SHFL_XOR_SYNC: ("xor", 1, 2, 3),
        vocab.TL_SHFL_DOWN_SYNC: ("down", 1, 2, 3),
        vocab.TL_SHFL_UP_SYNC: ("up", 1, 2, 3),
        vocab.TL_SHFL_SYNC: ("index", 1, 2, 3),
        vocab.TIRX_TVM_WARP_SHUFFLE: ("index", 1, 2, 3),
        vocab.TIRX_TVM_WARP_SHUFFLE_DOWN: ("down", 1, 2, 3),
        vocab.TIRX_TVM_WARP_SHUFFLE_UP: ("up", 1, 2, 3),
        vocab.TIRX_METAL_SIMD_SHUFFLE: ("index", 0, 1, None),
        vocab.TIRX_METAL_SIMD_SHUFFLE_DOWN: ("down", 0, 1, None),
        vocab.TIRX_METAL_SIMD_SHUFFLE_UP: ("up", 0, 1, None),
    }

    def warp_call(self, op: str, e: Any) -> str | None:
        """CUDA-style warp shuffles / reductions / votes as simdgroup collectives (simd_collectives.py);
        None when `op` is not one of them."""
        args = e.args
        if op in self.WARP_SHUFFLES:
            kind, value_at, arg_at, width_at = self.WARP_SHUFFLES[op]
            dtype = str(args[value_at].dtype)
            if dtype.endswith("64"):
                raise CodegenError(f"{op} on {dtype}: Metal simd shuffles take 8- to 32-bit values; shuffle the halves as 32-bit values")
            width: int | str = simd.SIMD_WIDTH
            if width_at is not None:
                w = args[width_at]
                if isinstance(w, tir.IntImm):
                    try:
                        simd.check_width(int(w.value))
                    except ValueError as err:
                        raise CodegenError(f"{op}: {err}") from None
                    width = int(w.value)
                else:
                    width = f"({self.expr(w)})"
            lane_attr = "thread_index_in_simdgroup"
            self.used_positions.add(lane_attr)
            lane = f"((int){self.position_names[lane_attr]})"
            build = {"xor": simd.shuffle_xor, "down": simd.shuffle_down, "up": simd.shuffle_up, "index": simd.shuffle_index}[kind]
            return build(self.expr(args[value_at]), self.expr(args[arg_at]), width, lane)
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
