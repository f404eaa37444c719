"""Silent wrong results that once passed unnoticed, each fixed at its mechanism:

- an annotated shared layout (`make_swizzled_layout`, or any explicit Layout) on GEMM operands was
  ignored by matrix loads (plain metal) or crashed lowering (metal4);
- a `T.gemm(clear_accum=False)` into a global C that other threads had just written (a `T.Parallel`
  bias store, or a previous `T.gemm` with another thread mapping) read stale values;
- two `T.gemm` calls into one fragment where only one could use cooperative tensors failed with a
  layout conflict.
"""

import pytest
import tilelang.language as T
import torch
from gemm_support import assert_close, compile_emulated, lower_source
from tilelang.layout import Layout, make_swizzled_layout

from tilelang_metal import kernels as E

DEVICE_BARRIER = "threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);"


def _targets():
    return {"metal": E.plain_metal_target(), "metal4": E.metal4_target()}


def shared_gemm_with_layouts(M, N, K, layout_of, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=threads) as (bx, by):
            A_s = T.alloc_shared((M, K), "float16")
            B_s = T.alloc_shared((K, N), "float16")
            C_f = T.alloc_fragment((M, N), "float32")
            T.annotate_layout({A_s: layout_of(A_s), B_s: layout_of(B_s)})
            T.clear(C_f)
            T.copy(A, A_s)
            T.copy(B, B_s)
            T.gemm(A_s, B_s, C_f)
            T.copy(C_f, C)

    return main


def _column_major(buf):
    rows, cols = (int(d) for d in buf.shape)
    return Layout([rows, cols], lambda i, j: j * rows + i)


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
@pytest.mark.parametrize("layout_name", ["swizzled", "column_major"])
def test_annotated_shared_layouts_are_honoured(target_name, layout_name):
    layout_of = make_swizzled_layout if layout_name == "swizzled" else _column_major
    M, N, K = 64, 64, 32
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(M, K, generator=g).half(), torch.randn(K, N, generator=g).half()
    out = compile_emulated(shared_gemm_with_layouts(M, N, K, layout_of), _targets()[target_name])(a, b)
    assert_close(out, a.float() @ b.float(), "float16", "float32", K, f"{layout_name} on {target_name}")


def bias_then_accumulate(M, N, K, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), bias: T.Tensor((N,), "float32"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=threads) as (bx, by):
            for i, j in T.Parallel(M, N):
                C[i, j] = bias[j]
            T.gemm(A, B, C, clear_accum=False)

    return main


def gemm_then_gemm(M, N, K1, K2, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K1), "float16"), B: T.Tensor((K1, N), "float16"), A2: T.Tensor((M, K2), "float16"), B2: T.Tensor((K2, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=threads) as (bx, by):
            T.gemm(A, B, C, clear_accum=True)
            T.gemm(A2, B2, C, clear_accum=False)

    return main


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
def test_accumulating_into_c_initialised_by_other_threads(target_name):
    M, N, K = 64, 128, 32
    g = torch.Generator().manual_seed(2)
    a, b, bias = torch.randn(M, K, generator=g).half(), torch.randn(K, N, generator=g).half(), torch.randn(N, generator=g)
    kernel = compile_emulated(bias_then_accumulate(M, N, K), _targets()[target_name])
    assert DEVICE_BARRIER in kernel.get_kernel_source()
    assert_close(kernel(a, b, bias), a.float() @ b.float() + bias, "float16", "float32", K, f"bias + gemm on {target_name}")


@pytest.mark.parametrize("target_name", ["metal", "metal4"])
def test_second_gemm_accumulates_what_the_first_stored(target_name):
    # on metal4 the first GEMM (K=32) uses cooperative tensors, the second (K=8) simdgroup matrices:
    # different lanes own each element of C
    M, N, K1, K2 = 64, 128, 32, 8
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(M, K1, generator=g).half(), torch.randn(K1, N, generator=g).half()
    a2, b2 = torch.randn(M, K2, generator=g).half(), torch.randn(K2, N, generator=g).half()
    kernel = compile_emulated(gemm_then_gemm(M, N, K1, K2), _targets()[target_name])
    ref = a.float() @ b.float() + a2.float() @ b2.float()
    assert_close(kernel(a, b, a2, b2), ref, "float16", "float32", K1 + K2, f"gemm; gemm on {target_name}")


def test_no_device_barrier_where_no_thread_exchanges_data():
    source = lower_source(E.gemm_direct_global(128, 128, 64), E.metal4_target())
    assert DEVICE_BARRIER not in source


def two_gemms_into_one_fragment(M, N, K1, K2, threads=128):
    @T.prim_func
    def main(A: T.Tensor((M, K1), "float16"), B: T.Tensor((K1, N), "float16"), A2: T.Tensor((M, K2), "float16"), B2: T.Tensor((K2, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=threads) as (bx, by):
            C_f = T.alloc_fragment((M, N), "float32")
            T.clear(C_f)
            T.gemm(A, B, C_f)
            T.gemm(A2, B2, C_f)
            T.copy(C_f, C)

    return main


@pytest.mark.parametrize("K2", [8, 64])
def test_two_gemms_into_one_fragment_on_metal4(K2):
    """K2=8 cannot use cooperative tensors: both calls take the simdgroup path (one representation
    of the fragment); K2=64 can, and both stay on cooperative tensors."""
    M, N, K1 = 64, 64, 64
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(M, K1, generator=g).half(), torch.randn(K1, N, generator=g).half()
    a2, b2 = torch.randn(M, K2, generator=g).half(), torch.randn(K2, N, generator=g).half()
    kernel = compile_emulated(two_gemms_into_one_fragment(M, N, K1, K2), E.metal4_target())
    source = kernel.get_kernel_source()
    assert ("matmul2d" in source) == (K2 == 64)
    assert ("simdgroup_multiply_accumulate" in source) == (K2 == 8)
    ref = a.float() @ b.float() + a2.float() @ b2.float()
    assert_close(kernel(a, b, a2, b2), ref, "float16", "float32", K1 + K2, f"two gemms K2={K2}")
