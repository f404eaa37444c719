"""NT, TN and TT GEMMs: what the emulator counts (vector loads in storage order, as many as NN) and
numerics against torch under the race checker (ragged and prime shapes, K of one step or less,
NaN and inf)."""

from __future__ import annotations

import pytest
import torch
from gemm_support import assert_close, compile_emulated, operands

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters, racecheck

LAYOUTS = {"nn": (False, False), "nt": (False, True), "tn": (True, False), "tt": (True, True)}


def _kernel(target, dataflow, M, N, K, layout, dtype="float16"):
    trans_A, trans_B = LAYOUTS[layout]
    build = E.gemm_direct_global if dataflow == "direct" else E.gemm_shared
    return compile_emulated(build(M, N, K, dtype=dtype, out_dtype="float32", trans_A=trans_A, trans_B=trans_B), target)


def _args(dataflow, a, b, N):
    return (a, b) if dataflow == "direct" else (a, b, torch.zeros(N))


@pytest.mark.slow
def test_nt_and_tn_load_like_nn_on_metal4(metal4):
    """One 64x128 tile, two K steps: the transposed operand arrives in as many vector loads as an
    untransposed one, none of them narrow (before the descriptor flags, B^T took 32 scalar loads
    per lane and K step)."""
    M, N, K = 64, 128, 32
    loads = {}
    for layout in ("nn", "nt", "tn"):
        kernel = _kernel(metal4, "direct", M, N, K, layout)
        a, b, ref = operands(M, N, K, "float16", *LAYOUTS[layout])
        assert_close(kernel(a, b), ref, "float16", "float32", K, layout)
        total = counters(kernel, a, b).total
        assert total["narrow_device_loads"] == 0, f"{layout}: {total['narrow_device_loads']} narrow device loads"
        loads[layout] = total["device_load_instructions"]
    assert loads["nt"] == loads["tn"] == loads["nn"], loads


@pytest.mark.slow
@pytest.mark.parametrize("dataflow,bypass,dtype", [("direct", "1", "bfloat16"), ("shared", "1", "float16"), ("shared", "0", "bfloat16")])
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_aligned_transposed_counts_match_nn(monkeypatch, metal4, dataflow, bypass, layout, dtype):
    monkeypatch.setenv("TILELANG_METAL_STAGING_BYPASS", bypass)
    M, N, K = 128, 256, 64
    totals = {}
    for lay in ("nn", layout):
        kernel = _kernel(metal4, dataflow, M, N, K, lay, dtype)
        a, b, ref = operands(M, N, K, dtype, *LAYOUTS[lay])
        assert_close(racecheck(kernel, *_args(dataflow, a, b, N)), ref, dtype, "float32", K, lay)
        totals[lay] = counters(kernel, *_args(dataflow, a, b, N)).total
    assert totals[layout]["narrow_device_loads"] == 0
    for key in ("device_load_instructions", "device_load_bytes", "threadgroup_load_instructions", "threadgroup_barriers"):
        assert totals[layout][key] == totals["nn"][key], (key, totals[layout][key], totals["nn"][key])


# prime and odd shapes, tiles that do not divide, K below one step (7) and of exactly one (16)
RAGGED = [
    ("metal4", "direct", "nt", "float16", (97, 101, 71)),
    ("metal4", "direct", "tn", "bfloat16", (61, 131, 7)),
    ("metal4", "direct", "tt", "float16", (131, 67, 113)),
    ("metal4", "shared", "nt", "bfloat16", (97, 101, 71)),
    ("metal4", "shared", "tn", "float16", (64, 128, 16)),
    ("metal", "direct", "nt", "float16", (61, 131, 7)),
    ("metal", "direct", "tn", "bfloat16", (97, 101, 71)),
    ("metal", "shared", "nt", "float16", (131, 67, 113)),
    ("metal", "shared", "tt", "bfloat16", (97, 101, 71)),
]


@pytest.mark.slow
@pytest.mark.parametrize("target_name,dataflow,layout,dtype,shape", RAGGED)
def test_transposed_ragged_numerics_under_racecheck(request, target_name, dataflow, layout, dtype, shape):
    M, N, K = shape
    target = request.getfixturevalue("metal4" if target_name == "metal4" else "plain_metal")
    kernel = _kernel(target, dataflow, M, N, K, layout, dtype)
    a, b, ref = operands(M, N, K, dtype, *LAYOUTS[layout], seed=M + N + K)
    out = racecheck(kernel, *_args(dataflow, a, b, N))
    assert_close(out, ref, dtype, "float32", K, f"{target_name} {dataflow} {layout} {M}x{N}x{K}")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["nt", "tn"])
@pytest.mark.parametrize("target_name", ["metal4", "metal"])
def test_transposed_nan_and_inf_propagate_like_torch(request, target_name, layout):
    """A NaN in A poisons its row of C, an inf in B its column (and NaN where it meets a zero or the
    NaN): same places as torch, nothing lost in the transposed gathers."""
    target = request.getfixturevalue("metal4" if target_name == "metal4" else "plain_metal")
    M, N, K = 97, 101, 71
    trans_A, trans_B = LAYOUTS[layout]
    kernel = _kernel(target, "direct", M, N, K, layout)
    a, b, _ = operands(M, N, K, "float16", trans_A, trans_B)
    a[(40, 5) if trans_A else (5, 40)] = float("nan")  # logical A[5, 40]
    b[(77, 60) if trans_B else (60, 77)] = float("inf")  # logical B[60, 77]
    b[(3, 70) if trans_B else (70, 3)] = float("-inf")  # logical B[70, 3]
    ref = (a.float().T if trans_A else a.float()) @ (b.float().T if trans_B else b.float())
    out = racecheck(kernel, a, b)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)), "NaN positions differ from torch"
    assert torch.equal(torch.isinf(out), torch.isinf(ref)) and torch.equal(out[torch.isinf(out)], ref[torch.isinf(ref)])
    finite = torch.isfinite(ref)
    assert (out[finite] - ref[finite]).abs().max().item() <= 0.01 * K**0.5


def _nn_plus_nt(M, N, K, bm=64, bn=128):
    import tilelang.language as T

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), Bt: T.Tensor((N, K), "float16"),
             C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            acc = T.alloc_fragment((bm, bn), "float32")
            T.gemm(A[by * bm:(by + 1) * bm, 0:K], B[0:K, bx * bn:(bx + 1) * bn], acc, clear_accum=True)
            T.gemm(A[by * bm:(by + 1) * bm, 0:K], Bt[bx * bn:(bx + 1) * bn, 0:K], acc, transpose_B=True)
            T.copy(acc, C[by * bm, bx * bn])

    return main


@pytest.mark.slow
def test_one_accumulator_fed_by_nn_and_nt_runs(metal4):
    """Two descriptors (no transposes, transpose_right) accumulate into one fragment: the printer
    keeps it in a thread array and gives each run its own op's destination tensor."""
    M, N, K = 128, 128, 48
    kernel = compile_emulated(_nn_plus_nt(M, N, K), metal4)
    source = kernel.get_kernel_source()
    assert "16, 32, 16, false, false," in source and "16, 32, 16, false, true," in source
    g = torch.Generator().manual_seed(3)
    a, b, bt = (torch.randn(shape, generator=g).half() for shape in ((M, K), (K, N), (N, K)))
    ref = a.float() @ b.float() + a.float() @ bt.float().T
    assert_close(racecheck(kernel, a, b, bt), ref, "float16", "float32", 2 * K, "NN + NT")
