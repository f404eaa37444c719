"""Where a GEMM accumulates: the user's register fragment, or a thread array the lowering owns.

Either way the accumulator is a flat per-thread array whose element order is the lane layout of
the matrix instruction (see isa.py). The MSL printer turns such an array into destination
cooperative tensors or simdgroup matrices (storage elision) when every access allows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..core.scopes import FRAGMENT_SCOPES, SIMDGROUP_SCOPES
from .problem import GemmProblem
from .tir_build import flat_view, local_buffer

ACCUM_DTYPE = "float32"


@dataclass(frozen=True)
class Accumulator:
    buffer: Any  # flat local buffer, `count` elements per thread
    owned: bool  # True: allocated by the lowering (C lives in global or shared memory)

    @property
    def dtype(self) -> str:
        return str(self.buffer.dtype)


def make_accumulator(problem: GemmProblem, count: int) -> Accumulator:
    c = problem.C
    if c.scope in FRAGMENT_SCOPES + SIMDGROUP_SCOPES:
        return Accumulator(flat_view(c.buffer, count, f"{c.buffer.name}_flat"), owned=False)
    return Accumulator(local_buffer(f"{c.buffer.name}_accum", count, ACCUM_DTYPE), owned=True)


def clear_flag(problem: GemmProblem) -> bool | None:
    """clear_accum as a Python bool when it is a constant, else None (decided at run time)."""
    flag = problem.clear_accum
    if isinstance(flag, bool):
        return flag
    value = getattr(flag, "value", None)
    return bool(value) if value is not None else None
