"""A module with several T.Kernel blocks prints as one MSL file with one header that carries every
kernel's includes, even when only a later kernel uses MetalPerformancePrimitives."""

import tilelang
import tilelang.language as T

from tilelang_metal import kernels as E
from tilelang_metal.emulator import split_kernels

M = N = K = 64


def scale_then_gemm():
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), As: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float16")):
        with T.Kernel(M, threads=64) as bx:  # first kernel: elementwise, no cooperative tensor
            for j in T.Parallel(K):
                As[bx, j] = A[bx, j] * T.float16(2.0)
        with T.Kernel(T.ceildiv(N, 64), T.ceildiv(M, 64), threads=128) as (bx, by):  # second: direct-global GEMM
            T.gemm(As[by * 64 : (by + 1) * 64, 0:K], B[0:K, bx * 64 : (bx + 1) * 64], C[by * 64 : (by + 1) * 64, bx * 64 : (bx + 1) * 64], clear_accum=True)

    return main


def test_later_kernel_includes_reach_the_shared_header():
    kernel = tilelang.compile(scale_then_gemm(), target=E.metal4_target(), execution_backend="emulator")
    source = kernel.get_kernel_source()
    header = source[: source.index("[[kernel")]
    assert source.count("[[kernel") == 2
    assert "#include <MetalPerformancePrimitives/MetalPerformancePrimitives.h>" in header
    assert header.index("MetalPerformancePrimitives") < header.index("using namespace metal;")
    kernels = split_kernels(source)
    assert len(kernels) == 2 and all(text.startswith(header) for text in kernels.values())
