"""Shared-staging bypass (issue 10, item 5): TileLang's standard GEMM (128x128x32 tiles, 3 pipeline
stages: 48 KiB of staging) runs on Metal 4 with no threadgroup memory, and fits plain Metal, with
results equal to torch's."""

from __future__ import annotations

import pytest
import torch

from tilelang_metal import kernels as E
from tilelang_metal.emulator import counters


def _run(target, M, N, K, bk=32, stages=3):
    import tilelang

    kern = tilelang.compile(E.gemm_shared(M, N, K, 128, 128, bk, num_stages=stages, out_dtype="float16"), out_idx=[-1], target=target, execution_backend="emulator")
    torch.manual_seed(M + N + K)
    a = torch.randn(M, K, dtype=torch.float16)
    b = torch.randn(K, N, dtype=torch.float16)
    bias = torch.zeros(N)
    out = kern(a, b, bias)
    torch.testing.assert_close(out.float(), a.float() @ b.float(), rtol=2e-2, atol=5e-2)
    return counters(kern, a, b, bias).total


@pytest.mark.parametrize("M, N, K", [(256, 256, 96), (200, 136, 100)])
def test_metal4_standard_gemm_without_staging(M, N, K):
    t = _run(E.metal4_target(), M, N, K)
    assert t["threadgroup_barriers"] == t["threadgroup_load_bytes"] == t["threadgroup_store_bytes"] == 0
    assert t["matmul2d_16x32x16"] > 0


def test_plain_metal_standard_gemm_with_two_stages():
    t = _run(E.plain_metal_target(), 256, 256, 96)
    assert t["threadgroup_store_bytes"] > 0 and t["threadgroup_barriers"] > 0  # staging kept, 2 stages fit 32 KiB
    assert t["simdgroup_multiply_accumulate_8x8x8"] == 256 * 256 * 96 // 512


def test_plain_metal_simdgroup_loads_from_device_when_staging_cannot_fit():
    t = _run(E.plain_metal_target(), 136, 256, 200, bk=128, stages=2)  # one stage is 64 KiB
    assert t["threadgroup_barriers"] == t["threadgroup_store_bytes"] == 0
    assert t["simdgroup_multiply_accumulate_8x8x8"] > 0


@pytest.mark.slow
def test_metal4_bypass_with_transposed_staging_and_ragged_edges():
    import tilelang

    from tilelang_metal.core.ir_attrs import decisions_of

    M, N, K = 136, 200, 72
    func = E.gemm_shared(M, N, K, 64, 64, 32, num_stages=2, trans_A=True, trans_B=True)
    kern = tilelang.compile(func, out_idx=[-1], target=E.metal4_target(), execution_backend="emulator")
    assert any(d.startswith("shared staging bypass") for d in decisions_of(kern.artifact.host_mod.functions.values()))
    torch.manual_seed(1)
    a = torch.randn(K, M, dtype=torch.float16)  # stored K x M
    b = torch.randn(N, K, dtype=torch.float16)  # stored N x K
    torch.testing.assert_close(kern(a, b, torch.zeros(N)), a.float().T @ b.float().T, rtol=1e-3, atol=1e-3)


# A T.gemm operand staged from a 4-D tensor with a unit dim between the tile's rows and columns
# (X of shape (B, L, G, D) read as X[b, rows, g, cols]: TileLang's Mamba chunk-scan layout). Issue 32,
# item A: the metal4 bypass put that view into the T.gemm and the operand check refused it ("T.gemm
# operand A (X) must be a 2-D tile"), naming a tensor the user never passed to T.gemm; plain metal
# was exact. L, D and N are not multiples of the tiles (ragged rows, K steps and columns).
_GROUPED = dict(batch=2, L=40, G=3, D=40, N=24, bm=32, bn=32, bk=16)


def _grouped_gemm():
    import tilelang.language as T

    Bt, L, G, D, N, bm, bn, bk = (_GROUPED[k] for k in ("batch", "L", "G", "D", "N", "bm", "bn", "bk"))

    @T.prim_func
    def main(X: T.Tensor((Bt, L, G, D), "float16"), W: T.Tensor((D, N), "float16"), Y: T.Tensor((Bt, G, L, N), "float32")):
        with T.Kernel(T.ceildiv(N, bn), T.ceildiv(L, bm), Bt * G, threads=128) as (bx, by, bz):
            X_s = T.alloc_shared((bm, bk), "float16")
            W_s = T.alloc_shared((bk, bn), "float16")
            acc = T.alloc_fragment((bm, bn), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(D, bk), num_stages=2):
                T.copy(X[bz // G, by * bm : (by + 1) * bm, bz % G, ko * bk : (ko + 1) * bk], X_s)
                T.copy(W[ko * bk : (ko + 1) * bk, bx * bn : (bx + 1) * bn], W_s)
                T.gemm(X_s, W_s, acc)
            T.copy(acc, Y[bz // G, bz % G, by * bm : (by + 1) * bm, bx * bn : (bx + 1) * bn])

    return main


@pytest.mark.parametrize("which, bypassed", [("metal4", True), ("plain", False)])
def test_operand_staged_from_a_4d_view_with_a_unit_dim_between_rows_and_columns(which, bypassed):
    import tilelang

    from tilelang_metal.emulator import racecheck
    from tilelang_metal.core.ir_attrs import decisions_of

    target = E.metal4_target() if which == "metal4" else E.plain_metal_target()
    kern = tilelang.compile(_grouped_gemm(), target=target, execution_backend="emulator")
    decisions = decisions_of(kern.artifact.host_mod.functions.values())
    assert any(d.startswith("shared staging bypass") for d in decisions) == bypassed, decisions
    g = _GROUPED
    torch.manual_seed(3)
    x = torch.randn(g["batch"], g["L"], g["G"], g["D"], dtype=torch.float16)
    w = torch.randn(g["D"], g["N"], dtype=torch.float16)
    y = torch.full((g["batch"], g["G"], g["L"], g["N"]), float("nan"))
    if bypassed:  # a new direct-global addressing: also under the race checker
        racecheck(kern, x, w, y)
    else:
        kern(x, w, y)
    torch.testing.assert_close(y, torch.einsum("blgd,dn->bgln", x.float(), w.float()), rtol=1e-3, atol=1e-3)


def test_metal4_keeps_the_staging_of_an_operand_it_cannot_read_in_place():
    """A column-major A (innermost stride M) staged into shared memory: the bypass would hand the
    T.gemm a view it refuses, naming A where the user passed A_s; the staging is kept (and says why)."""
    import tilelang
    import tilelang.language as T

    from tilelang_metal.core.ir_attrs import decisions_of

    M, N, K = 40, 24, 40

    @T.prim_func
    def main(A: T.StridedTensor((M, K), (1, M), "float16"), B: T.Tensor((K, N), "float16"), C: T.Tensor((M, N), "float32")):
        with T.Kernel(T.ceildiv(N, 32), T.ceildiv(M, 32), threads=128) as (bx, by):
            A_s = T.alloc_shared((32, 16), "float16")
            B_s = T.alloc_shared((16, 32), "float16")
            acc = T.alloc_fragment((32, 32), "float32")
            T.clear(acc)
            for ko in T.Pipelined(T.ceildiv(K, 16), num_stages=2):
                T.copy(A[by * 32, ko * 16], A_s)
                T.copy(B[ko * 16, bx * 32], B_s)
                T.gemm(A_s, B_s, acc)
            T.copy(acc, C[by * 32, bx * 32])

    kern = tilelang.compile(main, target=E.metal4_target(), execution_backend="emulator")
    decisions = decisions_of(kern.artifact.host_mod.functions.values())
    assert any("shared staging kept" in d and "innermost stride" in d and "A_s" in d for d in decisions), decisions
    torch.manual_seed(4)
    a = torch.randn(K, M, dtype=torch.float16).T  # column-major M x K
    b = torch.randn(K, N, dtype=torch.float16)
    c = torch.full((M, N), float("nan"))
    kern(a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float(), rtol=1e-3, atol=1e-3)
