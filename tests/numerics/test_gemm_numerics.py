"""Every GEMM path of the plugin, executed in the emulator and compared with torch (CPU, fp32)."""

from __future__ import annotations

import pytest
import tilelang
import torch
from gemm_support import TORCH_DTYPES, assert_close, compile_emulated, operands

from tilelang_metal import kernels as E


def run_direct(M, N, K, target, **kw) -> str:
    """Compile, run and check against torch; returns the kernel's MSL (no second lowering needed)."""
    dtype = kw.get("dtype", "float16")
    out_dtype = kw.get("out_dtype", "float16")
    func = E.gemm_direct_global(M, N, K, **kw)
    a, b, ref = operands(M, N, K, dtype, kw.get("trans_A", False), kw.get("trans_B", False))
    kernel = compile_emulated(func, target)
    assert_close(kernel(a, b), ref, dtype, out_dtype, K, f"direct {M}x{N}x{K} {kw}")
    return kernel.get_kernel_source()


def run_shared(M, N, K, target, epilogue="none", **kw) -> str:
    """Compile, run and check against torch; returns the kernel's MSL."""
    dtype = kw.get("dtype", "float16")
    out_dtype = kw.get("out_dtype", "float32")
    func = E.gemm_shared(M, N, K, epilogue=epilogue, **kw)
    a, b, ref = operands(M, N, K, dtype, kw.get("trans_A", False), kw.get("trans_B", False))
    bias = torch.randn(N)
    ref = {
        "none": lambda x: x,
        "relu": torch.relu,
        "bias": lambda x: x + bias,
        "scale": lambda x: x * 0.5 + 1.0,
        "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
        "silu": torch.nn.functional.silu,
        "alpha_beta": lambda x: x,  # applied below, it needs C
    }[epilogue](ref)
    if epilogue == "alpha_beta":  # C is read and written: pass it in (no out_idx)
        c = torch.randn(M, N).to(TORCH_DTYPES[out_dtype])
        ref = E.ALPHA * ref + E.BETA * c.float()
        out = c.clone()
        kernel = tilelang.compile(func, target=target, execution_backend="emulator")
        kernel(a, b, bias, out)
    else:
        kernel = compile_emulated(func, target)
        out = kernel(a, b, bias)
    assert_close(out, ref, dtype, out_dtype, K, f"shared {M}x{N}x{K} {epilogue} {kw}")
    return kernel.get_kernel_source()


# ---------------------------------------------------------------- direct-global cooperative tensor
@pytest.mark.parametrize("out_dtype", ["float16", "float32"])
@pytest.mark.parametrize("M,N,K", [(128, 256, 128), (64, 128, 32), (256, 128, 256)])
def test_direct_global_cooperative_tensor(metal4, M, N, K, out_dtype):
    run_direct(M, N, K, metal4, out_dtype=out_dtype)


@pytest.mark.parametrize("threads,block", [(128, (64, 128)), (256, (64, 128)), (256, (128, 128)), (64, (32, 64))])
def test_direct_global_simdgroup_counts(metal4, threads, block):
    run_direct(256, 256, 64, metal4, block_M=block[0], block_N=block[1], threads=threads)


def test_direct_global_accumulates_into_c(metal4):
    M, N, K = 128, 128, 64
    func = E.gemm_direct_global(M, N, K, out_dtype="float32", accumulate=True)
    a, b, ref = operands(M, N, K, "float16")
    c = torch.randn(M, N)
    kernel = tilelang.compile(func, target=metal4, execution_backend="emulator")  # C is an in/out argument
    c_out = c.clone()
    kernel(a, b, c_out)
    assert_close(c_out, ref + c, "float16", "float32", K, "C += A B")


# ---------------------------------------------------------------- simdgroup fallback
@pytest.mark.parametrize("dtype,out_dtype", [("float16", "float16"), ("float32", "float32"), ("bfloat16", "float32")])
def test_direct_global_simdgroup_without_metal4(plain_metal, dtype, out_dtype):
    run_direct(128, 256, 64, plain_metal, dtype=dtype, out_dtype=out_dtype)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_shared_simdgroup(plain_metal, dtype):
    run_shared(128, 128, 96, plain_metal, dtype=dtype)


# ---------------------------------------------------------------- shared cooperative tensor
@pytest.mark.parametrize("c_in_shared", [False, True])
@pytest.mark.parametrize("scope", ["shared.dyn", "shared"])
def test_shared_cooperative_tensor(metal4, c_in_shared, scope):
    run_shared(128, 128, 128, metal4, c_in_shared=c_in_shared, shared_scope=scope)


def test_shared_pipelined(metal4):
    run_shared(128, 128, 256, metal4, num_stages=2)


# ---------------------------------------------------------------- swizzle
@pytest.mark.parametrize("M,panel", [(256, 2), (200, 2), (448, 4), (1000, 8)])
def test_mlx_swizzle_with_padded_grid(metal4, M, panel):
    source = run_direct(M, 256, 32, metal4, swizzle_panel=panel)
    padded = -(-M // 64) % panel != 0  # tile rows not a multiple of the panel: padding threadgroups
    assert "__physical_blockIdx" in source and ("return;" in source) == padded


@pytest.mark.parametrize("order", ["row", "column"])
def test_row_and_column_swizzle(metal4, order):
    run_direct(320, 384, 32, metal4, swizzle_panel=2, swizzle_order=order)


# ---------------------------------------------------------------- transposes and dtypes
@pytest.mark.parametrize("trans_A,trans_B", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_transposes(metal4, plain_metal, trans_A, trans_B, which):
    target = metal4 if which == "metal4" else plain_metal
    run_direct(128, 128, 64, target, trans_A=trans_A, trans_B=trans_B)
    run_shared(128, 128, 64, target, trans_A=trans_A, trans_B=trans_B)


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_bfloat16(metal4, plain_metal, out_dtype, which):
    target = metal4 if which == "metal4" else plain_metal
    run_direct(128, 128, 64, target, dtype="bfloat16", out_dtype=out_dtype)
    run_shared(64, 128, 64, target, dtype="bfloat16", out_dtype=out_dtype)


# ---------------------------------------------------------------- partial tiles
@pytest.mark.parametrize("M,N,K", [(100, 200, 72), (65, 129, 48), (1, 256, 16), pytest.param(100, 200, 64, marks=pytest.mark.slow)])
@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_partial_tiles_direct(metal4, plain_metal, M, N, K, which):
    run_direct(M, N, K, metal4 if which == "metal4" else plain_metal)


@pytest.mark.parametrize("M,N,K", [pytest.param(100, 200, 72, marks=pytest.mark.slow), (65, 129, 48), (1, 256, 16)])  # 100x200x72: ~3 s warm
@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_partial_tiles_shared(metal4, plain_metal, M, N, K, which):
    run_shared(M, N, K, metal4 if which == "metal4" else plain_metal)
    run_shared(M, N, K, metal4 if which == "metal4" else plain_metal, epilogue="alpha_beta")


# ---------------------------------------------------------------- epilogues (standard idiom)
@pytest.mark.parametrize("epilogue", ["relu", "bias", "scale", "alpha_beta", "gelu_tanh", "silu"])
@pytest.mark.parametrize("which", ["metal4", "plain"])
def test_epilogues_on_register_accumulators(metal4, plain_metal, epilogue, which):
    target = metal4 if which == "metal4" else plain_metal
    source = run_shared(128, 128, 64, target, epilogue=epilogue, out_dtype="float16")
    if which == "metal4":
        # the accumulator stays in destination cooperative tensors through the epilogue
        assert "get_destination_cooperative_tensor" in source and "C_acc_ct0" in source
        assert "float C_acc[" not in source
    else:
        assert "simdgroup_float8x8 C_acc[" in source


# ---------------------------------------------------------------- fused bias + GELU (kernels.gemm_bias_gelu)
@pytest.mark.parametrize("which,M,N,K,dtype", [
    ("metal4", 128, 256, 64, "float16"),  # aligned: destination cooperative tensors through the epilogue
    pytest.param("metal4", 100, 200, 64, "bfloat16", marks=pytest.mark.slow),  # partial tiles in M and N
    ("plain", 97, 130, 40, "float16"),  # simdgroup matrices; K not a multiple of 16
])
def test_fused_bias_gelu(metal4, plain_metal, which, M, N, K, dtype):
    from tilelang_metal.emulator import racecheck

    target = metal4 if which == "metal4" else plain_metal
    a, b, _ = operands(M, N, K, dtype, False, False)
    bias = torch.randn(N)
    bias[3] = float("nan")  # a NaN bias poisons its column, and only that one
    ref = torch.nn.functional.gelu(a.float() @ b.float() + bias, approximate="tanh")
    kernel = compile_emulated(E.gemm_bias_gelu(M, N, K, dtype=dtype, out_dtype=dtype), target)
    out = racecheck(kernel, a, b, bias)
    assert out[:, 3].isnan().all() and not out[:, torch.arange(N) != 3].isnan().any()
    keep = torch.arange(N) != 3
    assert_close(out[:, keep], ref[:, keep], dtype, dtype, K, f"bias+gelu {M}x{N}x{K} {which}")
    source = kernel.get_kernel_source()
    assert source.count("[[kernel") == 1 and "tanh(" in source  # one kernel: the epilogue is fused
    if which == "metal4" and M % 64 == 0:
        assert "get_destination_cooperative_tensor" in source and "float acc[" not in source


# ---------------------------------------------------------------- explicit simdgroup accumulator
def _simdgroup_accumulator_kernel(M, N, K, bM=64, bN=64, bK=32, threads=128):
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(N // bN, M // bM, threads=threads) as (bx, by):
            A_s = T.alloc_shared((bM, bK), "float16")
            B_s = T.alloc_shared((bK, bN), "float16")
            C_sg = T.alloc_buffer((bM, bN), "float32", scope="metal.simdgroup")
            for ko in T.Pipelined(K // bK, num_stages=0):
                T.copy(A[by * bM, ko * bK], A_s)
                T.copy(B[ko * bK, bx * bN], B_s)
                T.gemm(A_s, B_s, C_sg, clear_accum=(ko == 0))
            T.copy(C_sg, C[by * bM, bx * bN])

    return main


@pytest.mark.parametrize("which", ["metal4", "plain"])
@pytest.mark.parametrize("shape", [(128, 128, 64, 64, 64, 128), (128, 256, 64, 64, 128, 256), (64, 64, 32, 32, 64, 64)])
def test_explicit_simdgroup_accumulator_stays_simdgroup(metal4, plain_metal, which, shape):
    M, N, K, bM, bN, threads = shape
    target = metal4 if which == "metal4" else plain_metal
    func = _simdgroup_accumulator_kernel(M, N, K, bM, bN, threads=threads)
    kernel = compile_emulated(func, target)
    source = kernel.get_kernel_source()
    assert "simdgroup_multiply_accumulate" in source and "mpp::" not in source
    a, b, ref = operands(M, N, K, "float16")
    out = kernel(a, b)
    assert_close(out, ref, "float16", "float32", K, f"metal.simdgroup accumulator {shape}")
