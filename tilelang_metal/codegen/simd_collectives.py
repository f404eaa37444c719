"""Warp-level calls (CUDA-style shuffles and warp reductions) as MSL simdgroup collectives.

A Metal simdgroup is 32 lanes wide, like a CUDA warp. A shuffle with `width < 32` works in
segments of `width` lanes (CUDA semantics): a lane whose source falls past the end of its segment
keeps its own value (xor, down), a lane whose source falls before its segment start keeps its own
value (up), and an indexed shuffle reads lane `srcLane % width` of its own segment. Every shuffle is
executed by all lanes (`select` evaluates both operands) and only its result is masked, because a
Metal simd collective must be reached by the whole simdgroup. Widths are powers of two <= 32.

Functions take the already printed operand texts and return MSL text; `lane` is the caller's lane id.
"""

from __future__ import annotations

SIMD_WIDTH = 32

WARP_REDUCTIONS = {
    "sum": "simd_sum",
    "max": "simd_max",
    "min": "simd_min",
    "bitand": "simd_and",
    "bitor": "simd_or",
    "bitxor": "simd_xor",
}


def check_width(width: int) -> None:
    if width <= 0 or width > SIMD_WIDTH or width & (width - 1):
        raise ValueError(f"shuffle width {width} is not a power of two in [1, 32] (a Metal simdgroup has 32 lanes)")


def shuffle_xor(value: str, mask: str, width: int | str, lane: str) -> str:
    shuffled = f"simd_shuffle_xor({value}, (ushort)({mask}))"
    if width == SIMD_WIDTH:
        return shuffled
    segment_end = f"(({lane} | ({width} - 1)) + 1)"
    return f"select({value}, {shuffled}, (({lane} ^ ({mask})) < {segment_end}))"


def shuffle_down(value: str, delta: str, width: int | str, lane: str) -> str:
    shuffled = f"simd_shuffle_down({value}, (ushort)({delta}))"
    if width == SIMD_WIDTH:
        return shuffled  # Metal leaves the top `delta` lanes unchanged, as CUDA does
    return f"select({value}, {shuffled}, ((({lane} & ({width} - 1)) + ({delta})) < {width}))"


def shuffle_up(value: str, delta: str, width: int | str, lane: str) -> str:
    shuffled = f"simd_shuffle_up({value}, (ushort)({delta}))"
    if width == SIMD_WIDTH:
        return shuffled  # Metal leaves the bottom `delta` lanes unchanged, as CUDA does
    return f"select({value}, {shuffled}, (({lane} & ({width} - 1)) >= ({delta})))"


def shuffle_index(value: str, src_lane: str, width: int | str, lane: str) -> str:
    if width == SIMD_WIDTH:
        return f"simd_shuffle({value}, (ushort)(({src_lane}) & 31))"
    source = f"(({lane} & ~({width} - 1)) + (({src_lane}) & ({width} - 1)))"
    return f"simd_shuffle({value}, (ushort){source})"


def warp_reduce(kind: str, value: str) -> str:
    return f"{WARP_REDUCTIONS[kind]}({value})"
