"""Ports of more of TileLang's example kernels (mhc Sinkhorn, KDA chunk cumsum, online log-sum-exp
with `T.Pipelined` over a dynamic length, uint4 dequantize GEMM, split-K GEMV, casts, an index
gather, a histogram), run in the emulator
under the race checker and compared with torch on CPU. Kernels are in `example_ports2.py`. Shapes
are small and ragged; runtime trip counts of 0 and 1; strided views; NaN / inf; wrong inputs."""

import math

import pytest
import torch

import example_ports2 as E
from tilelang_metal.emulator import racecheck

SEEDS = (0, 1)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def sinkhorn_reference(L: torch.Tensor, iters: int) -> torch.Tensor:
    p = torch.exp(L - L.amax(-1, keepdim=True))
    for _ in range(iters):
        p = p / p.sum(-1, keepdim=True)
        p = p / p.sum(-2, keepdim=True)
    return p


@pytest.mark.parametrize("iters", [0, 1, 2, 7])
def test_sinkhorn_with_a_runtime_trip_count_matches_torch(iters):
    L = torch.randn(3, 4, 4, generator=gen(iters)) * 3
    P = torch.full((3, 4, 4), -1.0)
    racecheck(E.sinkhorn(3, 4), L, P, iters, seeds=SEEDS)
    torch.testing.assert_close(P, sinkhorn_reference(L, iters), rtol=1e-5, atol=1e-6)
    if iters:
        torch.testing.assert_close(P.sum(-2), torch.ones(3, 4))  # the last step normalizes columns


def test_sinkhorn_refuses_a_fractional_trip_count():
    with pytest.raises(TypeError, match="iters"):
        E.sinkhorn(3, 4)(torch.zeros(3, 4, 4), torch.zeros(3, 4, 4), 2.5)


def chunk_cumsum_reference(G: torch.Tensor, chunk: int, reverse: bool) -> torch.Tensor:
    parts = G.split(chunk, dim=1)
    return torch.cat([p.flip(1).cumsum(1).flip(1) if reverse else p.cumsum(1) for p in parts], dim=1)


@pytest.mark.parametrize("reverse", [False, True])
def test_chunk_local_cumsum_with_a_partial_last_chunk_matches_torch(reverse):
    B, S, H, chunk = 2, 37, 5, 16  # 37 = 2 full chunks + 5 steps; 5 heads
    G = torch.randn(B, S, H, generator=gen(int(reverse)))
    G[1, 33, 2] = math.inf  # inf propagates along its own scan only (forward: t >= 33, reverse: t <= 33)
    out = torch.full_like(G, -1.0)
    racecheck(E.chunk_cumsum(B, S, H, chunk, reverse), G, out, seeds=SEEDS)
    torch.testing.assert_close(out, chunk_cumsum_reference(G, chunk, reverse), rtol=1e-5, atol=1e-5)


def test_chunk_local_cumsum_reads_a_strided_view():
    G = torch.randn(2, 5, 37, generator=gen(5)).transpose(1, 2)  # (2, 37, 5), strides (185, 1, 37)
    out = torch.full((2, 37, 5), -1.0)
    E.chunk_cumsum(2, 37, 5, 16, False)(G, out)
    torch.testing.assert_close(out, chunk_cumsum_reference(G, 16, False), rtol=1e-5, atol=1e-5)


# the dynamic-length kernel takes ~13 s to lower (tilelang's LayoutInference on symbolic shapes): slow tier
@pytest.mark.slow
@pytest.mark.parametrize("N", [0, 1, 32, 33, 91])  # pipeline trip counts 0, 1, 1, 2, 3
def test_pipelined_logsumexp_over_a_dynamic_length_matches_torch(N):
    X = torch.randn(11, N, generator=gen(N)) * 4  # 11 rows: a partial 8-row block
    out = torch.full((11,), 7.0)
    racecheck(E.pipelined_logsumexp(), X, out, seeds=SEEDS)
    torch.testing.assert_close(out, torch.logsumexp(X, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_pipelined_logsumexp_follows_torch_on_nan_and_inf_rows():
    X = torch.randn(9, 45, generator=gen(9))
    X[0, :] = -math.inf  # all -inf: -inf (not NaN from -inf - -inf)
    X[1, 3] = math.inf  # +inf: +inf (not NaN from inf - inf)
    X[2, 40] = math.nan  # NaN in the second tile
    X[3, 5], X[3, 6] = math.inf, -math.inf
    X[4, :33] = -math.inf  # -inf for the whole first tile, finite after
    out = torch.full((9,), 7.0)
    racecheck(E.pipelined_logsumexp(), X, out, seeds=SEEDS)
    torch.testing.assert_close(out, torch.logsumexp(X, 1), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.slow
def test_pipelined_logsumexp_reads_strided_views():
    kernel = E.pipelined_logsumexp()
    for X in (torch.randn(45, 9, generator=gen(10)).t(), torch.randn(9, 64, generator=gen(11))[:, 3:48]):
        out = torch.full((9,), 7.0)
        kernel(X, out)
        torch.testing.assert_close(out, torch.logsumexp(X, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_pipelined_logsumexp_refuses_wrong_inputs_in_one_line():
    kernel, X, out = E.pipelined_logsumexp(), torch.zeros(9, 45), torch.zeros(9)
    for args, error, words in (
        ((X.half(), out), TypeError, "X: expected dtype float32"),
        ((X[None], out), ValueError, "X: expected 2 dims"),
        ((X, torch.zeros(8)), ValueError, "X has 9 but Lse has 8"),
    ):
        with pytest.raises(error, match=words) as info:
            kernel(*args)
        assert "\n" not in str(info.value)


def test_uint4_dequantize_gemm_with_group_scales_matches_torch():
    M, N, K, group = 37, 45, 96, 32  # partial tiles along M and N, three K steps
    A = torch.randn(M, K, generator=gen(12)).half()
    q = torch.randint(0, 16, (N, K), generator=gen(13), dtype=torch.uint8)
    q[0], q[1] = 0, 15  # the extreme codes -8 and +7
    B = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()  # low nibble first
    scale = (torch.rand(N, K // group, generator=gen(14)) * 0.1 + 0.01).half()
    C = torch.full((M, N), -1.0)
    racecheck(E.uint4_dequant_gemm(M, N, K, group), A, B, scale, C, seeds=SEEDS)
    W = ((q.float() - 8) * scale.float().repeat_interleave(group, 1)).half()
    torch.testing.assert_close(C, A.float() @ W.float().T, rtol=1e-4, atol=1e-3)


def test_uint4_dequantize_gemm_refuses_a_k_that_does_not_tile():
    with pytest.raises(ValueError, match="multiple of bk"):
        E.uint4_dequant_gemm(16, 16, 80, 32)


@pytest.mark.parametrize("splits", [1, 3, 5])
def test_splitk_gemv_with_atomic_adds_matches_torch(splits):
    N, K = 13, 211  # prime K: the last slice and the last tile are partial
    x = torch.randn(K, generator=gen(splits)).half()
    W = torch.randn(N, K, generator=gen(splits + 1)).half()
    y = torch.zeros(N)
    racecheck(E.splitk_gemv(N, K, splits), x, W, y, seeds=SEEDS)
    torch.testing.assert_close(y, W.float() @ x.float(), rtol=1e-4, atol=1e-4)


def test_splitk_gemv_reads_strided_views():
    N, K = 13, 211
    x = torch.randn(2 * K, generator=gen(20)).half()[::2]
    W = torch.randn(K, N, generator=gen(21)).half().t()
    y = torch.zeros(N)
    E.splitk_gemv(N, K, 3)(x, W, y)
    torch.testing.assert_close(y, W.float() @ x.float(), rtol=1e-4, atol=1e-4)


# fp32 values at the edges of fp16 / bf16: halfway cases (ties to even), overflow, NaN, inf, subnormals, signed zero
CAST_EDGES = [0.0, -0.0, 1.0, 1 + 2**-8, 1 + 3 * 2**-8, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65520.0, 70000.0, 3.4e38,
              -3.4e38, math.inf, -math.inf, math.nan, 1e-8, 6e-8, 2**-24, 2**-25, 3 * 2**-26, 1e-40, -1e-45, 2**-126, 2**-133]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
def test_cast_rounds_and_saturates_like_torch(dtype):
    X = torch.tensor(CAST_EDGES).repeat(5, 1)  # 5 rows: a partial 4-row block
    X[1] = torch.randn(24, generator=gen(30)) * 1e3
    Y = torch.zeros(5, 24, dtype=dtype)
    racecheck(E.cast_rows(5, 24, str(dtype).split(".")[1]), X, Y, seeds=SEEDS)
    torch.testing.assert_close(Y, X.to(dtype), rtol=0, atol=0, equal_nan=True)
    numbers = ~X.isnan()  # a NaN's sign bit carries no meaning (torch's bf16 cast sets it)
    assert torch.equal(torch.signbit(Y)[numbers], torch.signbit(X.to(dtype))[numbers])  # -0.0 stays negative


def test_masked_index_gather_matches_torch():
    src = torch.randn(23, 40, generator=gen(31)).half()
    idx = torch.tensor([3, -1, 22, 0, 0, 7, -5, 11, 19, 2, 22], dtype=torch.int32)  # repeats, negatives, the last row
    out = torch.full((11, 40), 9.0).half()
    racecheck(E.gather_rows(23, 40, 11), src, idx, out, seeds=SEEDS)
    want = torch.where((idx >= 0)[:, None], src[idx.clamp(min=0).long()], torch.zeros((), dtype=torch.float16))
    assert torch.equal(out, want)


def test_masked_index_gather_refuses_int64_indices_in_one_line():
    with pytest.raises(TypeError, match="Idx: expected dtype int32") as info:
        E.gather_rows(23, 40, 11)(torch.zeros(23, 40).half(), torch.zeros(11, dtype=torch.int64), torch.zeros(11, 40).half())
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("numel, blocks", [(997, 3), (5, 2), (0, 2)])  # prime; fewer values than threads; none
def test_two_level_atomic_histogram_matches_torch(numel, blocks):
    X = torch.randint(-2, 19, (numel,), generator=gen(40 + numel), dtype=torch.int32)  # some values outside [0, 16)
    if numel:
        X[0] = 15  # the last bin is hit
    H = torch.zeros(16, dtype=torch.int32)
    racecheck(E.histogram(numel, 16, blocks), X, H, seeds=SEEDS)
    assert torch.equal(H, torch.bincount(X[(X >= 0) & (X < 16)].long(), minlength=16).int())
