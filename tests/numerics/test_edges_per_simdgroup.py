"""Edges and pitches (issue #21 item 3, in part): a run whose alignment holds only for half its
width becomes two narrower vector accesses instead of elements, a run with no vector alignment at
all (an odd pitch) one packed vector access, and simdgroups whose block of C lies past the matrix
skip their loads and matrix operations; in edge tiles, the runs inside the matrix stay vector
accesses. Counted in the emulator, checked against
torch under the race checker."""

from __future__ import annotations

import pytest
import tilelang.language as T
import torch
from gemm_support import assert_close, compile_emulated, k_loops, operands, scalar_device_loads

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters, racecheck


def _run(target, M, N, K, dtype="float16"):
    kernel = compile_emulated(E.gemm_direct_global(M, N, K, dtype=dtype, out_dtype="float32"), target)
    a, b, ref = operands(M, N, K, dtype, seed=M * N + K)
    assert_close(racecheck(kernel, a, b), ref, dtype, "float32", K, f"{M}x{N}x{K}")
    return kernel, counters(kernel, a, b).total


@pytest.mark.slow
def test_a_pitch_of_two_mod_four_loads_half2_pairs(metal4):
    """N = 130 (B and C pitch 2 mod 4): in the interior threadgroups B's runs of 4 become two half2
    loads (elements before), and C (float32) is stored in float2 pairs."""
    kernel, total = _run(metal4, 128, 130, 64)
    source = kernel.get_kernel_source()
    interior = k_loops(source)[0]
    assert not scalar_device_loads(source, interior) and "device half2*)" in interior
    assert "*(device float2*)(C + " in source
    assert total["narrow_device_loads"] < total["device_load_instructions"] // 2, total


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_an_odd_pitch_keeps_vector_loads(metal4, dtype):
    """N = 131 (B's and C's row pitch odd): the interior threadgroup's K loop reads B in packed
    vectors (element-aligned, one access per run) where it read elements, and C is stored the same
    way; half of the load instructions were narrow before."""
    kernel, total = _run(metal4, 64, 131, 48, dtype)
    source = kernel.get_kernel_source()
    interior = k_loops(source)[0]
    packed = "packed_half4" if dtype == "float16" else "packed_float4"
    assert not scalar_device_loads(source, interior) and f"*(const device {packed}*)(" in interior, interior
    assert "*(device packed_float4*)(C + " in source or "*(device packed_float2*)(C + " in source
    assert total["narrow_device_loads"] * 8 < total["device_load_instructions"], total


def _padded_shared_gemm(M, N, K, pad, bm=64, bn=64, bk=32):
    """Shared tiles with `pad` extra elements per row (an odd pitch in threadgroup memory)."""

    @T.prim_func
    def main(A: T.Tensor((M, K), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(M, bm), threads=128) as (bx, by):
            A_s = T.alloc_shared((bm, bk + pad), "float16")
            B_s = T.alloc_shared((bk, bn + pad), "float16")
            C_f = T.alloc_fragment((bm, bn), "float32")
            T.clear(C_f)
            for ko in T.Pipelined(T.ceildiv(K, bk), num_stages=0):
                T.copy(A[by * bm, ko * bk], A_s[:, 0:bk])
                T.copy(B[ko * bk, bx * bn], B_s[:, 0:bn])
                T.gemm(A_s[:, 0:bk], B_s[:, 0:bn], C_f)
            T.copy(C_f, C[by * bm, bx * bn])

    return main


def test_an_odd_threadgroup_pitch_reads_packed_vectors(metal4):
    """Shared tiles padded by 3 halves per row: the cooperative-tensor operands are read from
    threadgroup memory through packed vectors (elements before), ragged edges and NaN / inf included,
    equal to torch under the race checker."""
    M, N, K = 100, 70, 45
    kernel = compile_emulated(_padded_shared_gemm(M, N, K, pad=3), metal4)
    assert "*(threadgroup packed_half" in kernel.get_kernel_source()
    a, b, _ = operands(M, N, K, "float16", seed=7)
    a[2, 3], b[4, 5] = float("nan"), float("inf")
    ref = a.float() @ b.float()
    out = racecheck(kernel, a, b)
    assert torch.equal(torch.isnan(out), torch.isnan(ref))
    finite = torch.isfinite(ref)  # row 2 and column 5 hold the NaN / inf; the rest must match
    assert_close(torch.where(finite, out, 0), torch.where(finite, ref, 0), "float16", "float32", K, "padded shared tiles")


@pytest.mark.parametrize(
    "target_name,N,out_dtype", [("metal4", 72, "float32"), ("metal4", 70, "float16"), pytest.param("metal", 70, "float32", marks=pytest.mark.slow)]
)
def test_edge_tiles_access_the_runs_inside_as_vectors(request, target_name, N, out_dtype):
    """37 x N x 48 on 64 x 128 tiles: every threadgroup is an edge tile, yet each run of 4 that lies
    inside the matrix is one vector access under one branch; only the runs the edge cuts go element
    by element (before: every load and store of an edge tile was an element, 10464 narrow loads of
    10464 at N = 72 on metal4). N = 72 puts the column edge on a run boundary: no narrow load, and C
    is stored in exactly M x N / 4 accesses. NaN and inf in the last row and column reach C where
    torch puts them, under the race checker."""
    target = request.getfixturevalue("metal4" if target_name == "metal4" else "plain_metal")
    M, K = 37, 48
    kernel = compile_emulated(E.gemm_direct_global(M, N, K, out_dtype=out_dtype), target)
    a, b, _ = operands(M, N, K, "float16", seed=N)
    a[M - 1, K - 1], b[K - 1, N - 1] = float("nan"), float("inf")
    ref = a.float() @ b.float()
    out = racecheck(kernel, a, b).float()
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.equal(torch.isinf(out), torch.isinf(ref))
    finite = torch.isfinite(ref)  # row M-1 and column N-1 hold the NaN / inf; the rest must match
    assert_close(torch.where(finite, out, 0), torch.where(finite, ref, 0), "float16", out_dtype, K, f"37x{N}x48")
    total = counters(kernel, a, b).total
    if N % 4 == 0:
        assert total["narrow_device_loads"] == 0 and total["device_store_instructions"] == M * N // 4, total
    else:
        assert total["narrow_device_loads"] * 8 < total["device_load_instructions"], total


def test_bfloat16_at_an_odd_pitch_reads_elements_and_matches_torch(metal4):
    """The plugin does not rely on a packed bfloat type: bfloat16 odd-pitch runs stay element accesses
    (never a misaligned bfloat4), still equal to torch under the race checker."""
    kernel, _ = _run(metal4, 64, 131, 48, "bfloat16")
    source = kernel.get_kernel_source()
    assert "packed_bfloat" not in source and scalar_device_loads(source, k_loops(source)[0])


@pytest.mark.slow
@pytest.mark.parametrize("target_name,layout", [("metal4", "nn"), ("metal4", "nt"), ("metal", "tn")])
def test_simdgroups_past_the_matrix_skip_their_matrix_operations(request, target_name, layout):
    """70 x 40 x 64 on 64 x 128 tiles (two threadgroups): simdgroups whose block of C starts past row
    70 or column 40 run no loads and no MMAs. With the cooperative-tensor 2 x 2 partition (32 x 64
    blocks) 3 of the 8 simdgroups are inside: 3 x 16 matmul2d instead of 8 x 16; the same two
    threadgroups at 128 x 128 x 64 (all inside) count the full number."""
    target = request.getfixturevalue("metal4" if target_name == "metal4" else "plain_metal")
    trans_A, trans_B = layout == "tn", layout == "nt"
    counts = []
    for M, N in ((70, 40), (128, 128)):
        func = E.gemm_direct_global(M, N, 64, out_dtype="float32", trans_A=trans_A, trans_B=trans_B)
        kernel = compile_emulated(func, target)
        a, b, ref = operands(M, N, 64, "float16", trans_A, trans_B, seed=M)
        assert_close(racecheck(kernel, a, b), ref, "float16", "float32", 64, f"{M}x{N}x64 {layout}")
        total = counters(kernel, a, b).total
        counts.append(total["matmul2d_16x32x16"] + total["simdgroup_multiply_accumulate_8x8x8"])
    ragged, full = counts
    if target_name == "metal4":
        assert (ragged, full) == (48, 128)
    else:
        assert 0 < ragged <= full // 2, (ragged, full)
