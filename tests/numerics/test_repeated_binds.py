"""A value named inside a `T.Parallel` body (`row = Index[i]`) becomes a `Bind`. When the loop walks
a simdgroup-matrix accumulator, TileLang unrolls it in TIR, so every copy binds the same variable:
each copy must declare its own constant (a second `const int row` in one scope does not compile)
and later uses must read their own copy's value. (Found by the routed-MoE port, which scatters GEMM
rows to token rows.)"""

import functools

import tilelang
import tilelang.language as T
import torch

M, N, K = 16, 8, 8


@functools.lru_cache(maxsize=None)
def gemm_then_scatter_rows():
    @T.prim_func
    def main(Index: T.Tensor((M,), "int32"), A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), Y: T.Tensor((M, N), "float32")):
        with T.Kernel(1, threads=32):  # one simdgroup: two 8x8 matrices, two row values per lane
            a = T.alloc_shared((M, K), "float16")
            b = T.alloc_shared((K, N), "float16")
            c = T.alloc_fragment((M, N), "float32")
            T.copy(A, a)
            T.copy(B, b)
            T.gemm(a, b, c, clear_accum=True)
            for i, j in T.Parallel(M, N):
                row = Index[i]
                if row >= 0:
                    Y[row, j] = c[i, j]

    return tilelang.compile(main, target="metal", execution_backend="emulator")


def test_unrolled_copies_of_a_bind_each_read_their_own_value():
    kernel = gemm_then_scatter_rows()
    index = torch.tensor([3, -1, 0, 15, 7, 8, -1, 2, 5, 1, 10, 4, 13, 12, -1, 6], dtype=torch.int32)  # distinct rows
    a, b = torch.randn(M, K).half(), torch.randn(K, N).half()
    y = torch.full((M, N), -1.0)
    kernel(index, a, b, y)
    want = torch.full((M, N), -1.0)
    c = a.float() @ b.float()
    for i, row in enumerate(index.tolist()):
        if row >= 0:
            want[row] = c[i]
    torch.testing.assert_close(y, want, rtol=1e-3, atol=1e-3)
    assert "const int row_1 =" in kernel.get_kernel_source()  # the second copy was renamed
