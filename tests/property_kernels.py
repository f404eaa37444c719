"""Kernels of the wider GEMM property test: the idioms beyond one plain GEMM that once gave silent
wrong results or lowering failures. Each builder returns (prim_func, make_inputs, reference) where
`make_inputs(generator)` gives the host tensors (outputs included, in parameter order) and
`reference(inputs)` the expected values of the output tensors, in the same order as `outputs`.
"""

import tilelang.language as T
import torch
from tilelang.layout import make_swizzled_layout

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


def _randn(shape, dtype, g):
    return torch.randn(shape, generator=g).to(TORCH[dtype])


def two_outputs(M, N, K, bM, bN, bK, threads, dtype, out_dtype):
    """Shared-staged GEMM whose epilogue writes two outputs: C = acc, D = relu(acc + bias)."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        Bias: T.Tensor((N,), "float32"),
        C: T.Tensor((M, N), out_dtype),
        D: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bM, bK), dtype)
            B_s = T.alloc_shared((bK, bN), dtype)
            acc = T.alloc_fragment((bM, bN), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, bK), num_stages=0):
                T.copy(A[by * bM, ko * bK], A_s)
                T.copy(B[ko * bK, bx * bN], B_s)
                T.gemm(A_s, B_s, acc)
            for i, j in T.Parallel(bM, bN):
                if by * bM + i < M and bx * bN + j < N:
                    C[by * bM + i, bx * bN + j] = acc[i, j]
                    D[by * bM + i, bx * bN + j] = T.max(acc[i, j] + Bias[bx * bN + j], 0)

    def inputs(g):
        return [_randn((M, K), dtype, g), _randn((K, N), dtype, g), torch.randn(N, generator=g), torch.zeros(M, N, dtype=TORCH[out_dtype]), torch.zeros(M, N, dtype=TORCH[out_dtype])]

    def reference(x):
        acc = x[0].float() @ x[1].float()
        return [acc, torch.relu(acc + x[2])]

    return main, inputs, reference, (3, 4)


def two_gemms_one_accumulator(M, N, K, K2, bM, bN, threads, dtype, out_dtype):
    """C = A B + A2 B2 through one register fragment, both GEMMs straight from device memory."""

    @T.prim_func
    def main(
        A: T.Tensor((M, K), dtype),
        B: T.Tensor((K, N), dtype),
        A2: T.Tensor((M, K2), dtype),
        B2: T.Tensor((K2, N), dtype),
        C: T.Tensor((M, N), out_dtype),
    ):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            acc = T.alloc_fragment((bM, bN), "float32")
            T.clear(acc)
            T.gemm(A[by * bM : (by + 1) * bM, 0:K], B[0:K, bx * bN : (bx + 1) * bN], acc)
            T.gemm(A2[by * bM : (by + 1) * bM, 0:K2], B2[0:K2, bx * bN : (bx + 1) * bN], acc)
            T.copy(acc, C[by * bM, bx * bN])

    def inputs(g):
        return [_randn((M, K), dtype, g), _randn((K, N), dtype, g), _randn((M, K2), dtype, g), _randn((K2, N), dtype, g), torch.zeros(M, N, dtype=TORCH[out_dtype])]

    def reference(x):
        return [x[0].float() @ x[1].float() + x[2].float() @ x[3].float()]

    return main, inputs, reference, (4,)


def annotated_shared(M, N, K, bM, bN, bK, threads, dtype, out_dtype):
    """The usual CUDA port: swizzled layouts annotated on the shared operands."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            A_s = T.alloc_shared((bM, bK), dtype)
            B_s = T.alloc_shared((bK, bN), dtype)
            acc = T.alloc_fragment((bM, bN), "float32")
            T.annotate_layout({A_s: make_swizzled_layout(A_s), B_s: make_swizzled_layout(B_s)})
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, bK), num_stages=0):
                T.copy(A[by * bM, ko * bK], A_s)
                T.copy(B[ko * bK, bx * bN], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * bM, bx * bN])

    def inputs(g):
        return [_randn((M, K), dtype, g), _randn((K, N), dtype, g), torch.zeros(M, N, dtype=TORCH[out_dtype])]

    def reference(x):
        return [x[0].float() @ x[1].float()]

    return main, inputs, reference, (2,)


def strided_views(M, N, K, bM, bN, threads, dtype, out_dtype, a_col, c_pad):
    """Direct-global GEMM on views of wider tensors: A[:, a_col : a_col + K] of an (M, K + a_col + 1)
    tensor into C[:, :N] of an (M, N + c_pad) tensor; the columns outside the view stay untouched.
    N is a multiple of bN: a T.gemm region is the columns it names, so an edge tile reaching past
    N into the padding would (rightly) write there."""
    assert N % bN == 0
    a_width, c_width = K + a_col + 1, N + c_pad

    @T.prim_func
    def main(A: T.Tensor((M, a_width), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, c_width), out_dtype)):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            T.gemm(
                A[by * bM : (by + 1) * bM, a_col : a_col + K],
                B[0:K, bx * bN : (bx + 1) * bN],
                C[by * bM : (by + 1) * bM, bx * bN : (bx + 1) * bN],
                clear_accum=True,
            )

    def inputs(g):
        return [_randn((M, a_width), dtype, g), _randn((K, N), dtype, g), torch.full((M, c_width), 3.0).to(TORCH[out_dtype])]

    def reference(x):
        out = x[2].float().clone()
        out[:, :N] = x[0][:, a_col : a_col + K].float() @ x[1].float()
        return [out]

    return main, inputs, reference, (2,)


def accumulate_into_initialised_c(M, N, K, bM, bN, threads, dtype, out_dtype):
    """C += A B on a C that holds values before the launch (clear_accum=False, no out_idx)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), out_dtype)):
        with T.Kernel(T.ceildiv(N, bN), T.ceildiv(M, bM), threads=threads) as (bx, by):
            T.gemm(A[by * bM : (by + 1) * bM, 0:K], B[0:K, bx * bN : (bx + 1) * bN], C[by * bM : (by + 1) * bM, bx * bN : (bx + 1) * bN], clear_accum=False)

    def inputs(g):
        return [_randn((M, K), dtype, g), _randn((K, N), dtype, g), torch.randn(M, N, generator=g).to(TORCH[out_dtype])]

    def reference(x):
        return [x[2].float() + x[0].float() @ x[1].float()]

    return main, inputs, reference, (2,)
