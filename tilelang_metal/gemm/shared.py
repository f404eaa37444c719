"""Shared cooperative tensor dataflow (spec section 3.1).

A and B already live in threadgroup memory (T.alloc_shared, `shared` or `shared.dyn`), staged by
the kernel's own T.copy; the lowering keeps that staging, because shared memory may carry layout,
padding, zero-fill or reuse semantics. Lanes gather their operand elements from threadgroup memory.
"""

from __future__ import annotations

from typing import Any

from ..selection import Partition
from .cooperative_tensor import CooperativeTensorPlan
from .problem import SHARED_SCOPES, GemmProblem


def lower_shared(problem: GemmProblem, part: Partition, analyzer: Any, thread_index: Any) -> Any:
    assert problem.A.scope in SHARED_SCOPES and problem.B.scope in SHARED_SCOPES
    return CooperativeTensorPlan(problem, part, analyzer, thread_index).build("tlm_gemm_ct_shared")
