"""T.import_source on Metal: MSL is printed into the kernel file once, before the kernels, and its
functions are called through T.call_extern; CUDA (qualifiers, inline PTX, CUDA headers) is refused
when lowering begins, in one line naming T.import_source (transform/imported_sources.py)."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import MetalLoweringError

N = 64

# A comment and a string that name CUDA words are not code: only code is checked.
CUBE = r"""
#include <metal_stdlib>
// unlike CUDA's version, no __device__ and no asm("...") here
inline float cube_plus(float x, float y) {
    constant char* note = "goto";
    return x * x * x + y + 0.0f * float(note[0] == 'g');
}
"""
NEGATE = """
template <typename T> inline T negated(T x) { return -x; }
"""


@functools.lru_cache(maxsize=None)
def importing_kernels():
    """Two kernels import CUBE (printed once), a third imports NEGATE (tilelang takes one
    T.import_source per block)."""

    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32"), C: T.Tensor((N,), "float32")):
        with T.Kernel(N // 32, threads=32) as bx:
            T.import_source(CUBE)
            for i in T.Parallel(32):
                B[bx * 32 + i] = T.call_extern("float32", "cube_plus", A[bx * 32 + i], 1.0)
        with T.Kernel(N // 16, threads=16) as bx:
            T.import_source(CUBE)
            for i in T.Parallel(16):
                C[bx * 16 + i] = T.call_extern("float32", "cube_plus", B[bx * 16 + i], -2.0)
        with T.Kernel(N // 32, threads=32) as bx:
            T.import_source(NEGATE)
            for i in T.Parallel(32):
                C[bx * 32 + i] = T.call_extern("float32", "negated", C[bx * 32 + i])

    return tilelang.compile(main, out_idx=[-2, -1], target=E.plain_metal_target(), execution_backend="emulator")


def test_imported_msl_is_printed_once_before_the_kernels():
    source = importing_kernels().get_kernel_source()
    assert source.count("inline float cube_plus(") == 1 and source.count("inline T negated(") == 1
    first_kernel = source.index("[[kernel")
    assert source.index("inline float cube_plus(") < source.index("inline T negated(") < first_kernel


def test_imported_functions_compute_as_written():
    a = torch.randn(N)
    b, c = importing_kernels()(a)
    want_b = a**3 + 1
    torch.testing.assert_close(b, want_b, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(c, -(want_b**3 - 2), rtol=1e-5, atol=1e-5)


def test_imported_functions_under_racecheck():
    a = torch.randn(N)
    b, c = racecheck(importing_kernels(), a)
    torch.testing.assert_close(c, -((a**3 + 1) ** 3 - 2), rtol=1e-5, atol=1e-5)


def importing(source: str):
    @T.prim_func
    def main(A: T.Tensor((N,), "float32"), B: T.Tensor((N,), "float32")):
        with T.Kernel(N // 32, threads=32) as bx:
            T.import_source(source)
            for i in T.Parallel(32):
                B[bx * 32 + i] = T.call_extern("float32", "imported", A[bx * 32 + i])

    return main


CUDA_SOURCES = {
    "cuda-qualifier": ("__device__ inline float imported(float x) { return x; }", r"line 1 uses __device__, a CUDA qualifier"),
    "inline-ptx": ('inline float imported(float x) {\n  float y;\n  asm volatile("mov.b32 %0, %1;" : "=f"(y) : "f"(x));\n  return y;\n}',
                   r"line 3 uses asm \(inline assembly, which MSL does not have\)"),
    "cuda-header": ("#include <cuda_fp16.h>\ninline float imported(float x) { return x; }", r"line 1 includes cuda_fp16.h, which is not a Metal header"),
}


@pytest.mark.parametrize("source,reason", CUDA_SOURCES.values(), ids=CUDA_SOURCES.keys())
def test_cuda_source_is_refused_when_lowering_begins(source, reason):
    with pytest.raises(MetalLoweringError, match=rf"^kernel main: T.import_source on Metal takes MSL, but the imported source {reason}; import an MSL version[^\n]*$"):
        tilelang.lower(importing(source), target=E.plain_metal_target())
