"""Bad input gets a clear error at lower time: what is wrong and how to fix it."""

# no `from __future__ import annotations`: TileLang evaluates the T.Tensor annotations

import pytest
import tilelang.language as T
from gemm_support import lower_source

from tilelang_metal import kernels as E


def _gemm_kernel(M, N, K, bM, bN, *, threads=128, dtype="float16", a_scope="global", b_scope="global", out_dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            if b_scope == "shared":
                B_s = T.alloc_shared((K, bN), dtype)
                T.copy(B[0, bx * bN], B_s)
                T.gemm(A[by * bM : (by + 1) * bM, 0:K], B_s, C[by * bM : (by + 1) * bM, bx * bN : (bx + 1) * bN], clear_accum=True)
            else:
                T.gemm(A[by * bM : (by + 1) * bM, 0:K], B[0:K, bx * bN : (bx + 1) * bN], C[by * bM : (by + 1) * bM, bx * bN : (bx + 1) * bN], clear_accum=True)

    return main


def _lower_fails(func, target, *needles):
    with pytest.raises(Exception) as info:
        lower_source(func, target)
    text = str(info.value)
    for needle in needles:
        assert needle in text, f"{needle!r} not in error: {text[-600:]}"
    # the message is ours, not a TVM internal check
    assert "Check failed" not in text and "InternalError" not in type(info.value).__name__


@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_threads_not_multiple_of_32(metal4, plain_metal, which):
    target = metal4 if which == "metal4" else plain_metal
    _lower_fails(_gemm_kernel(128, 128, 64, 64, 128, threads=100), target, "threads=100 is not a multiple of 32", "threads=96")


def test_unsupported_dtype(metal4):
    _lower_fails(_gemm_kernel(128, 128, 64, 64, 128, dtype="int8", out_dtype="int32"), metal4, "int8", "float16, bfloat16, float32")


def test_mixed_scopes_are_refused(metal4):
    _lower_fails(_gemm_kernel(128, 128, 64, 64, 128, b_scope="shared"), metal4, "A is global", "B is shared", "both")


def test_no_legal_warp_partition(plain_metal):
    _lower_fails(_gemm_kernel(96, 80, 64, 48, 40, threads=128), plain_metal, "no legal warp partition", "48x40", "4 simdgroups")


def test_non_contiguous_innermost_stride(metal4):
    M, N, K = 64, 128, 64

    @T.prim_func
    def main(A: T.StridedTensor((M, K), (1, M), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            T.gemm(A[0:M, 0:K], B[0:K, 0:N], C[0:M, 0:N], clear_accum=True)

    _lower_fails(main, metal4, "innermost stride", "contiguous")


def test_float64_has_no_metal_type(metal4):
    @T.prim_func
    def main(A: T.Tensor((128,), "float64"), B: T.Tensor((128,), "float64")):
        with T.Kernel(1, threads=128) as bx:
            for i in T.Parallel(128):
                B[i] = A[i] * 2.0

    _lower_fails(main, metal4, "float64", "no Metal equivalent")


def test_bad_swizzle_panel(metal4):
    _lower_fails(E.gemm_direct_global(256, 256, 64, swizzle_panel=3), metal4, "power-of-two panel", "3")


def test_tile_ops_next_to_a_thread_allreduce_on_a_2d_launch_are_refused(plain_metal):
    """A 2-D launch with tile ops runs as one linear thread index (transform/thread_linearization.py);
    TVM's allreduce needs its own thread variables, so the mix is refused naming the launch."""

    @T.prim_func
    def main(A: T.Tensor((4, 32), "float32"), B: T.Tensor((4, 32), "float32"), S: T.Tensor((4,), "float32")):
        with T.Kernel(1, threads=(32, 4)):
            tk, tr = T.get_thread_binding(0), T.get_thread_binding(1)
            T.copy(A, B)
            part = T.alloc_local((1,), "float32")
            total = T.alloc_local((1,), "float32")
            part[0] = A[tr, tk]
            with T.attr(T.comm_reducer(lambda a, b: a + b, [T.Cast("float32", 0)]), "reduce_scope", T.reinterpret(T.uint64(0), dtype="handle")):
                T.evaluate(T.tvm_thread_allreduce(T.uint32(1), part[0], True, total[0], tk, dtype="handle"))
            S[tr] = total[0]

    _lower_fails(main, plain_metal, "threadIdx.x=32, threadIdx.y=4", "tvm_thread_allreduce", "threads=128")


def test_simdgroup_accumulator_without_split_is_refused(plain_metal):
    @T.prim_func
    def main(A: T.Tensor((8, 32), "float16"), B: T.Tensor((32, 40), "float16"), C: T.Tensor((8, 40), "float32")):
        with T.Kernel(1, 1, threads=128) as (bx, by):
            C_sg = T.alloc_buffer((8, 40), "float32", scope="metal.simdgroup")
            T.gemm(A[0:8, 0:32], B[0:32, 0:40], C_sg, clear_accum=True)
            T.copy(C_sg, C[0, 0])

    _lower_fails(main, plain_metal, "no legal warp partition", "8x40")


def test_errors_keep_their_type_across_tvm():
    import tilelang_metal

    with pytest.raises(tilelang_metal.GemmLoweringError, match="not a multiple of 32"):
        lower_source(_gemm_kernel(128, 128, 64, 64, 128, threads=100), E.metal4_target())


def test_dynamic_shapes_lower_and_launch(metal4):
    import tilelang

    m = T.dynamic("m")

    @T.prim_func
    def main(A: T.Tensor((m,), "float32"), B: T.Tensor((m,), "float32")):
        with T.Kernel(T.ceildiv(m, 128), threads=128) as bx:
            for i in T.Parallel(128):
                if bx * 128 + i < m:
                    B[bx * 128 + i] = A[bx * 128 + i] + 1.0

    import torch

    source = lower_source(main, metal4)
    assert "constant int& m [[ buffer(" in source
    kernel = tilelang.compile(main, out_idx=[-1], target=metal4, execution_backend="emulator")
    for n in (1, 130):  # the grid follows m per call (docs/calling_convention.md)
        a = torch.randn(n)
        assert torch.equal(kernel(a), a + 1.0)


def test_pointer_tables_name_the_construct(metal4):
    """A tensor made from a pointer read in the kernel (a T.ptr / uint64 table) was refused as an
    'unsupported pointer binding' naming neither T.ptr nor T.make_tensor."""

    @T.prim_func
    def main(Ptrs: T.Tensor((2,), "uint64"), Out: T.Tensor((2, 32), "float32")):
        with T.Kernel(2, threads=32) as bx:
            src = T.make_tensor(Ptrs[bx], (32,), "float32")
            Out[bx, T.get_thread_binding()] = src[T.get_thread_binding()]

    _lower_fails(main, metal4, "T.ptr", "T.make_tensor", "pass each tensor as its own T.Tensor parameter")
