"""Lowering-time properties of the plugin's reductions and scans (MSL text and refusals)."""

from __future__ import annotations

import pytest
import tilelang
import tilelang.language as T
from tilelang import tvm


def lower(func) -> str:
    target = tvm.target.Target("metal")
    with tvm.transform.PassContext(), target:
        return tilelang.lower(func, target=target).kernel_source


def test_negative_infinity_start_prints_as_metal_macro():
    @T.prim_func
    def main(A: T.Tensor((8, 16), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=32):
            a = T.alloc_fragment((8, 16), "float32")
            b = T.alloc_fragment((8,), "float32")
            T.copy(A, a)
            T.fill(b, -T.infinity("float32"))
            T.reduce_max(a, b, dim=1, clear=False)
            T.copy(b, B)

    source = lower(main)
    assert "(-INFINITY)" in source  # Metal's <metal_math> macro (the shim defines it too)
    # the reduction itself starts from each thread's first element, not from -inf (fast math)
    assert "b_part[0] = (-INFINITY)" not in source


def _row_sum(threads):
    @T.prim_func
    def main(A: T.Tensor((8, 16), "float32"), B: T.Tensor((8,), "float32")):
        with T.Kernel(1, threads=threads):
            a = T.alloc_fragment((8, 16), "float32")
            b = T.alloc_fragment((8,), "float32")
            T.copy(A, a)
            T.reduce_sum(a, b, dim=1)
            T.copy(b, B)

    return main


def test_reduction_over_a_two_dimensional_threadgroup_lowers_as_its_linear_launch():
    """Tile ops partition over threadIdx.x only: threads=(16, 2) runs as threads=32 (LinearizeThreadLaunch)."""
    assert lower(_row_sum((16, 2))) == lower(_row_sum(32))


def test_reduction_of_a_fragment_slice_is_refused_clearly():
    @T.prim_func
    def main(A: T.Tensor((8, 16), "float32"), B: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=32):
            a = T.alloc_fragment((8, 16), "float32")
            b = T.alloc_fragment((4,), "float32")
            T.copy(A, a)
            T.reduce_sum(a[0:4, :], b, dim=1)
            T.copy(b, B)

    with pytest.raises(Exception, match="whole buffer|not supported"):
        lower(main)
