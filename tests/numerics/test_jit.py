"""@tilelang.jit kernels with target="metal" run through the plugin (emulator on Linux)."""

import tilelang
import tilelang.language as T
import torch


@tilelang.jit(out_idx=[-1], target="metal", execution_backend="emulator")
def matmul(M, N, K, block_M=64, block_N=64, block_K=32, dtype="float16", accum_dtype="float32"):
    @T.prim_func
    def main(A: T.Tensor((M, K), dtype), B: T.Tensor((K, N), dtype), C: T.Tensor((M, N), dtype)):
        with T.Kernel(T.ceildiv(N, block_N), T.ceildiv(M, block_M), threads=128) as (bx, by):
            A_s = T.alloc_shared((block_M, block_K), dtype)
            B_s = T.alloc_shared((block_K, block_N), dtype)
            C_l = T.alloc_fragment((block_M, block_N), accum_dtype)
            T.clear(C_l)
            for ko in T.Pipelined(T.ceildiv(K, block_K), num_stages=2):
                T.copy(A[by * block_M, ko * block_K], A_s)
                T.copy(B[ko * block_K, bx * block_N], B_s)
                T.gemm(A_s, B_s, C_l)
            for i, j in T.Parallel(block_M, block_N):
                C_l[i, j] = T.max(C_l[i, j], 0)
            T.copy(C_l, C[by * block_M, bx * block_N])

    return main


def test_jit_kernel_on_plain_metal_target_runs_in_emulator():
    kernel = matmul(200, 192, 96)
    assert kernel.get_kernel_source().startswith("// tilelang_metal")
    assert "simdgroup_multiply_accumulate" in kernel.get_kernel_source()  # Linux: no metal4 key
    a, b = torch.randn(200, 96).half(), torch.randn(96, 192).half()
    out = kernel(a, b)
    torch.testing.assert_close(out.float(), torch.relu(a.float() @ b.float()), rtol=1e-2, atol=5e-2)


def test_auto_execution_backend_is_the_emulator_on_linux():
    from tilelang_metal import kernels as examples

    kernel = tilelang.compile(examples.gemm_shared(128, 128, 64), out_idx=[-1], target="metal")
    assert kernel.execution_backend == "emulator"
