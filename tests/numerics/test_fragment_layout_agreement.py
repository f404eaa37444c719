"""T.gemm accumulators combined element by element get agreeing layouts (transform/fragment_groups.py).

Two accumulators with different policies, instructions or shapes added in a `T.Parallel`: the plugin
gives their T.gemm calls one instruction and one partition, run in the emulator against torch under
the race checker. Tiles of different M cannot agree: a one-line error names both T.gemm calls, and
the fix it names (copy one accumulator through shared memory) works.
"""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.emulator import racecheck
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.kernels import metal4_target

SQUARE, FULL_ROW, FULL_COL = T.GemmWarpPolicy.Square, T.GemmWarpPolicy.FullRow, T.GemmWarpPolicy.FullCol


def sum_of_products(M1, N1, M2, N2, K, threads, policy1, policy2, c2_through_shared=False):
    """D = (A1 B1 + A2 B2)[:M, :N] over the common corner (M, N) = (min M, min N), added in registers
    (C1[i, j] + C2[i, j]) or, with c2_through_shared, with C2 read back from threadgroup memory."""
    M, N = min(M1, M2), min(N1, N2)

    @T.prim_func
    def main(
        A1: T.Tensor((M1, K), "float16"),
        B1: T.Tensor((K, N1), "float16"),
        A2: T.Tensor((M2, K), "float16"),
        B2: T.Tensor((K, N2), "float16"),
        D: T.Tensor((M, N), "float32"),
    ):
        with T.Kernel(1, threads=threads) as _:
            A1_s = T.alloc_shared((M1, K), "float16")
            B1_s = T.alloc_shared((K, N1), "float16")
            A2_s = T.alloc_shared((M2, K), "float16")
            B2_s = T.alloc_shared((K, N2), "float16")
            C1 = T.alloc_fragment((M1, N1), "float32")
            C2 = T.alloc_fragment((M2, N2), "float32")
            T.copy(A1, A1_s)
            T.copy(B1, B1_s)
            T.copy(A2, A2_s)
            T.copy(B2, B2_s)
            T.clear(C1)
            T.clear(C2)
            T.gemm(A1_s, B1_s, C1, policy=policy1)
            T.gemm(A2_s, B2_s, C2, policy=policy2)
            if c2_through_shared:
                C2_shared = T.alloc_shared((M2, N2), "float32")
                T.copy(C2, C2_shared)
                for i, j in T.Parallel(M, N):
                    C1[i, j] = C1[i, j] + C2_shared[i, j]
            else:
                for i, j in T.Parallel(M, N):
                    C1[i, j] = C1[i, j] + C2[i, j]
            T.copy(C1[0:M, 0:N], D)

    return main


@functools.lru_cache(maxsize=None)
def sum_kernel(target, *config):
    program = sum_of_products(*config)
    return tilelang.compile(program, target=metal4_target() if target == "metal4" else "metal", execution_backend="emulator")


def run_sum(target, M1, N1, M2, N2, K, threads, *rest):
    kernel = sum_kernel(target, M1, N1, M2, N2, K, threads, *rest)
    torch.manual_seed(M1 + N1 + M2 + N2 + K)
    a1, b1 = torch.randn(M1, K).half(), torch.randn(K, N1).half()
    a2, b2 = torch.randn(M2, K).half(), torch.randn(K, N2).half()
    b2[K - 1, 1] = float("inf")  # column 1 of A2 B2 is +-inf (or NaN): it must stay in column 1
    M, N = min(M1, M2), min(N1, N2)
    d = torch.full((M, N), float("nan"))
    racecheck(kernel, a1, b1, a2, b2, d)
    want = (a1.float() @ b1.float())[:M, :N] + (a2.float() @ b2.float())[:M, :N]
    torch.testing.assert_close(d, want, atol=2e-3, rtol=2e-3, equal_nan=True)
    return kernel


@pytest.mark.parametrize(
    "target,M1,N1,M2,N2,K,threads,policy1,policy2",
    [
        ("metal", 64, 64, 64, 64, 32, 128, SQUARE, FULL_ROW),  # 1x4 vs 4x1 simdgroups: the first's for both
        ("metal4", 64, 64, 64, 64, 32, 128, SQUARE, FULL_ROW),  # cooperative tensors 2x2 vs 4x1
        ("metal", 32, 64, 32, 40, 16, 128, SQUARE, SQUARE),  # same M, different N: whole rows for both
        ("metal4", 32, 64, 32, 128, 32, 128, FULL_COL, SQUARE),  # cooperative tensors would need replicas
    ],
)
def test_accumulators_added_element_by_element(target, M1, N1, M2, N2, K, threads, policy1, policy2):
    run_sum(target, M1, N1, M2, N2, K, threads, policy1, policy2)


def test_cooperative_tensors_kept_when_both_can_take_them():
    source = sum_kernel("metal4", 64, 64, 64, 64, 32, 128, SQUARE, FULL_ROW).get_kernel_source()
    assert "matmul2d" in source and "simdgroup_multiply_accumulate" not in source


def test_accumulators_of_different_m_are_refused_naming_both_gemms():
    with pytest.raises(MetalLoweringError) as info:
        tilelang.lower(sum_of_products(32, 32, 64, 32, 16, 128, SQUARE, FULL_ROW), target="metal")
    message = str(info.value)
    assert "\n" not in message
    assert "T.gemm(A1_s, B1_s, C1) (32x32x16)" in message and "T.gemm(A2_s, B2_s, C2) (64x32x16)" in message
    assert "different M (64 vs 32 rows)" in message and "T.copy(C2, C2_shared)" in message


def test_the_named_fix_for_different_m_works():
    run_sum("metal", 32, 32, 64, 32, 16, 128, SQUARE, FULL_ROW, True)


def mla_decode(heads, seqlen, dim, pe_dim, block_N, block_H, threads, p_in_registers):
    """MLA-decode-shaped attention (issue 32, item B1): scores over a latent and a rotary part, the
    output accumulator wider than the scores, both with FullCol; they meet only row by row, through
    the row maximum / rescale fragments. On 8 simdgroups FullCol splits the 16x32 scores 2x4 and the
    16x64 output 1x8, and layout inference stopped with `register fragments m and alpha are used
    together element by element but have different thread layouts`. p_in_registers: P goes back from
    threadgroup memory into a fragment that is the A operand of P . V (the split variant's dataflow)."""
    scale = (1.0 / (dim + pe_dim)) ** 0.5 * 1.44269504  # log2(e): exp2 below

    @T.prim_func
    def main(
        Q: T.Tensor((heads, dim), "float16"),
        Q_pe: T.Tensor((heads, pe_dim), "float16"),
        KV: T.Tensor((seqlen, 1, dim), "float16"),
        K_pe: T.Tensor((seqlen, 1, pe_dim), "float16"),
        Out: T.Tensor((heads, dim), "float16"),
    ):
        with T.Kernel(heads // block_H, threads=threads) as hb:
            q_s = T.alloc_shared((block_H, dim), "float16")
            q_pe_s = T.alloc_shared((block_H, pe_dim), "float16")
            kv_s = T.alloc_shared((block_N, dim), "float16")
            k_pe_s = T.alloc_shared((block_N, pe_dim), "float16")
            p_s = T.alloc_shared((block_H, block_N), "float16")
            scores = T.alloc_fragment((block_H, block_N), "float32")
            p_frag = T.alloc_fragment((block_H, block_N), "float16")
            acc = T.alloc_fragment((block_H, dim), "float32")
            m = T.alloc_fragment((block_H,), "float32")
            m_prev = T.alloc_fragment((block_H,), "float32")
            alpha = T.alloc_fragment((block_H,), "float32")
            row_sum = T.alloc_fragment((block_H,), "float32")
            denom = T.alloc_fragment((block_H,), "float32")
            T.copy(Q[hb * block_H, 0], q_s)
            T.copy(Q_pe[hb * block_H, 0], q_pe_s)
            T.fill(acc, 0)
            T.fill(denom, 0)
            T.fill(m, -T.infinity("float32"))
            for t in T.Pipelined(seqlen // block_N, num_stages=1):
                T.copy(KV[t * block_N : (t + 1) * block_N, 0, :], kv_s)
                T.copy(K_pe[t * block_N : (t + 1) * block_N, 0, :], k_pe_s)
                T.gemm(q_s, kv_s, scores, transpose_B=True, policy=FULL_COL, clear_accum=True)
                T.gemm(q_pe_s, k_pe_s, scores, transpose_B=True, policy=FULL_COL)
                T.copy(m, m_prev)
                T.fill(m, -T.infinity("float32"))
                T.reduce_max(scores, m, dim=1, clear=False)
                for i in T.Parallel(block_H):
                    alpha[i] = T.exp2(m_prev[i] * scale - m[i] * scale)
                for i, j in T.Parallel(block_H, block_N):
                    scores[i, j] = T.exp2(scores[i, j] * scale - m[i] * scale)
                T.reduce_sum(scores, row_sum, dim=1)
                T.copy(scores, p_s)
                for i in T.Parallel(block_H):
                    denom[i] = denom[i] * alpha[i] + row_sum[i]
                for i, j in T.Parallel(block_H, dim):
                    acc[i, j] *= alpha[i]
                if p_in_registers:
                    T.copy(p_s, p_frag)
                    T.gemm(p_frag, kv_s, acc, policy=FULL_COL)
                else:
                    T.gemm(p_s, kv_s, acc, policy=FULL_COL)
            for i, j in T.Parallel(block_H, dim):
                acc[i, j] /= denom[i]
            T.copy(acc, Out[hb * block_H, 0])

    return main


MLA_SHAPE = dict(heads=32, seqlen=96, dim=64, pe_dim=16)


@functools.lru_cache(maxsize=None)
def mla_decode_kernel(target, p_in_registers):
    program = mla_decode(**MLA_SHAPE, block_N=32, block_H=16, threads=256, p_in_registers=p_in_registers)
    return tilelang.compile(program, target=metal4_target() if target == "metal4" else "metal", execution_backend="emulator")


@pytest.mark.parametrize("target, p_in_registers", [("metal", False), ("metal4", False), ("metal", True)])
def test_mla_decode_accumulators_meeting_through_row_fragments(target, p_in_registers):
    heads, seqlen, dim, pe_dim = MLA_SHAPE.values()
    kernel = mla_decode_kernel(target, p_in_registers)
    torch.manual_seed(7)
    q, q_pe = torch.randn(heads, dim).half(), torch.randn(heads, pe_dim).half()
    kv, k_pe = torch.randn(seqlen, 1, dim).half(), torch.randn(seqlen, 1, pe_dim).half()
    out = torch.full((heads, dim), float("nan")).half()
    racecheck(kernel, q, q_pe, kv, k_pe, out)
    query, key = torch.cat([q, q_pe], -1).float(), torch.cat([kv[:, 0], k_pe[:, 0]], -1).float()
    want = torch.softmax(query @ key.T / (dim + pe_dim) ** 0.5, -1) @ kv[:, 0].float()
    torch.testing.assert_close(out.float(), want, atol=2e-3, rtol=2e-3)


def test_reduction_scratch_is_named_in_program_order():
    """The pipelined loop reduces into `m` and `row_sum` twice: four threadgroup scratch buffers, the two
    of `m` merged at one offset. Each op's scratch is named when it is lowered, in program order; with
    two `m_red_scratch` tilelang's merge ordered them by address, so the MSL differed between processes
    (PYTHONHASHSEED 1 against 2) and two xdist workers both missed the emulator cache."""
    import re

    source = mla_decode_kernel("metal4", False).get_kernel_source()
    used = re.findall(r"(\w+_red_scratch\w*)\[", source)
    assert list(dict.fromkeys(used)) == ["m_red_scratch", "row_sum_red_scratch", "m_red_scratch_1", "row_sum_red_scratch_1"]
