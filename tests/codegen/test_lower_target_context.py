"""`tilelang.lower(func, target=metal)` on kernels with `T.copy` / `T.Parallel` works without the
caller entering the target (the Metal pipeline enters it), and gives the same MSL as with it."""

from __future__ import annotations

import pytest
import tilelang
import tilelang.language as T

from tilelang_metal import kernels as examples


def _elementwise(n: int, block: int):
    @T.prim_func
    def add(A: T.Tensor((n,), "float32"), B: T.Tensor((n,), "float32"), C: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    C[bx * block + i] = A[bx * block + i] + B[bx * block + i] * 2.0

    return add


@pytest.mark.parametrize(
    "build, target",
    [
        (lambda: examples.gemm_shared(72, 40, 24, 32, 32, 16, threads=64, epilogue="relu"), examples.metal4_target),
        (lambda: examples.gemm_shared(40, 40, 24, 32, 32, 16, threads=64, epilogue="bias"), examples.plain_metal_target),
        (lambda: _elementwise(97, 32), examples.plain_metal_target),
    ],
)
def test_lower_needs_no_target_context(build, target):
    func, tgt = build(), target()
    source = tilelang.lower(func, target=tgt).kernel_source
    with tgt:
        assert tilelang.lower(func, target=tgt).kernel_source == source
    assert "[[kernel" in source


def test_lower_accepts_the_string_target():
    source = tilelang.lower(_elementwise(64, 32), target="metal").kernel_source
    assert "[[kernel" in source
