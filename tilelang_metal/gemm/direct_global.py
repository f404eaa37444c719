"""Direct-global cooperative tensor dataflow (the spec's fast path, section 1).

A and B are read straight from device memory into MPP operands: no threadgroup memory and no
barrier. Edge tiles (M, N not multiples of the tile) read zeros outside the buffers and skip
stores there; aligned tiles stay branch-free.
"""

from __future__ import annotations

from typing import Any

from ..selection import Partition
from .cooperative_tensor import CooperativeTensorPlan
from .problem import GLOBAL_SCOPES, GemmProblem


def lower_direct_global(problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any) -> Any:
    assert problem.A.scope in GLOBAL_SCOPES and problem.B.scope in GLOBAL_SCOPES
    return CooperativeTensorPlan(problem, part, analyzer, thread_index).build("tlm_gemm_ct_direct_global")
