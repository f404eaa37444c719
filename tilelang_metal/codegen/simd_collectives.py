"""Warp reductions as MSL simdgroup collectives (a Metal simdgroup is 32 lanes wide, like a CUDA
warp). Shuffles with CUDA's `width` semantics are TIR by the time the printer runs
(legalize/segmented_shuffles.py)."""

from __future__ import annotations

WARP_REDUCTIONS = {
    "sum": "simd_sum",
    "max": "simd_max",
    "min": "simd_min",
    "bitand": "simd_and",
    "bitor": "simd_or",
    "bitxor": "simd_xor",
}


def warp_reduce(kind: str, value: str) -> str:
    return f"{WARP_REDUCTIONS[kind]}({value})"
