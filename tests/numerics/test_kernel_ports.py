"""Ports of TileLang's example kernel families (topk, hadamard_transform, convolution,
dequantize_gemm, blocksparse_gemm, linear_attention, norm backward, gemm_streamk), run in the
emulator against torch on CPU; kernels with a T.gemm also on the cooperative-tensor `metal4`
target (those variants are in the slow tier). The kernels are in `port_kernels.py`. Sizes are small, odd where the kernel allows it, and
leave partial tiles."""

import pytest
import torch

import port_kernels as P

# metal4 variants in the slow tier: the quick tier has metal4 GEMM coverage elsewhere (budget: 2 min)
GEMM_TARGETS = ["metal", pytest.param("metal4", marks=pytest.mark.slow)]


def test_topk_values_indices_and_ties():
    M, N, K = 37, 50, 5  # 37 rows in blocks of 8: the last block is partial
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(M, N, generator=gen)
    x[3, 7] = x[3, 9] = 10.0  # a tie for the largest: the lower index comes first
    v = torch.empty(M, K)
    i = torch.empty(M, K, dtype=torch.int32)
    P.topk(M, N, K)(x, v, i)
    want_v, _ = x.topk(K, -1)
    torch.testing.assert_close(v, want_v, rtol=0, atol=0)
    assert torch.equal(x.gather(1, i.long()), v)  # every index points at its value
    assert all(len(set(row)) == K for row in i.tolist())  # no index taken twice
    assert i[3, :2].tolist() == [7, 9]


def sylvester_hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("rows, n, threads", [(5, 256, 64), (3, 64, 16)], ids=["two-simdgroups", "half-simdgroup"])
def test_hadamard_transform_matches_the_matrix_product(rows, n, threads):
    x = torch.randn(rows, n, generator=torch.Generator().manual_seed(n))
    y = torch.empty(rows, n)
    P.hadamard(rows, n, threads)(x, y)
    torch.testing.assert_close(y, x @ sylvester_hadamard(n), rtol=1e-5, atol=1e-4)


def test_hadamard_refuses_sizes_that_are_not_powers_of_two():
    with pytest.raises(ValueError, match="powers of two"):
        P.hadamard(2, 96, 32)


@pytest.mark.parametrize(
    "target, tile_op",
    [("metal", False), pytest.param("metal4", False, marks=pytest.mark.slow), ("metal", True)],
    ids=["metal", "metal4", "im2col-tile-op"],
)
def test_im2col_convolution_matches_torch_conv2d(target, tile_op):
    N, H, W, C, F, ks, stride, pad, dilation = 2, 7, 9, 5, 12, 3, 2, 1, 1  # K = 45: a partial K tile
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(N, H, W, C, generator=gen).half()
    w = torch.randn(ks, ks, C, F, generator=gen).half()
    OH, OW = P.conv_output_size(H, ks, stride, pad, dilation), P.conv_output_size(W, ks, stride, pad, dilation)
    out = torch.full((N, OH, OW, F), float("nan"), dtype=torch.float16)
    P.im2col_conv(target, N, H, W, C, F, ks, stride, pad, dilation, tile_op=tile_op)(x, w, out)
    want = torch.nn.functional.conv2d(x.float().permute(0, 3, 1, 2), w.float().permute(3, 2, 0, 1), stride=stride, padding=pad, dilation=dilation)
    torch.testing.assert_close(out.float(), want.permute(0, 2, 3, 1), rtol=1e-2, atol=2e-2)


def test_int4_dequantizing_gemv_matches_torch():
    M, N, K, group = 2, 13, 512, 64  # 13 rows over groups of 4: a partial row group
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(M, K, generator=gen).half()
    q = torch.randint(0, 16, (N, K), generator=gen, dtype=torch.uint8)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    scale = (torch.rand(N, K // group, generator=gen) * 0.1 + 0.01).half()
    y = torch.empty(M, N, dtype=torch.float16)
    P.int4_gemv(M, N, K, group)(x, packed, scale, y)
    w = (q.float() - 8) * scale.float().repeat_interleave(group, 1)
    torch.testing.assert_close(y.float(), x.float() @ w.T, rtol=1e-2, atol=2e-2)


def test_int4_gemv_refuses_a_k_it_cannot_unpack():
    with pytest.raises(ValueError, match="multiple of per_lane"):
        P.int4_gemv(1, 8, 100, 50)


def test_int8_gemv_with_dp4a_is_exact():
    M, N, K = 3, 7, 264  # K: one full block of 256 and a partial one
    gen = torch.Generator().manual_seed(10)
    x = torch.randint(-128, 128, (M, K), generator=gen, dtype=torch.int8)
    w = torch.randint(-128, 128, (N, K), generator=gen, dtype=torch.int8)
    y = torch.empty(M, N, dtype=torch.int32)
    P.int8_gemv_dp4a(M, N, K)(x, w, y)
    assert torch.equal(y, (x.int() @ w.int().T))


@pytest.mark.parametrize("target", GEMM_TARGETS)
def test_blocksparse_gemm_sums_only_enabled_blocks(target):
    M, N, K, bm, bn, bk = 45, 70, 56, 32, 32, 16
    gen = torch.Generator().manual_seed(6)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(K, N, generator=gen).half()
    mask = torch.rand(P.mask_shape(M, N, K, bm, bn, bk), generator=gen) > 0.5
    mask[0, 0, :] = False  # a tile with every block off must come out zero
    c = torch.full((M, N), float("nan"), dtype=torch.float16)
    P.blocksparse_gemm(target, M, N, K, bm, bn, bk)(a, b, mask, c)
    want = torch.zeros(M, N)
    for i, j, k in mask.nonzero().tolist():
        want[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn] += a[i * bm:(i + 1) * bm, k * bk:(k + 1) * bk].float() @ b[k * bk:(k + 1) * bk, j * bn:(j + 1) * bn].float()
    torch.testing.assert_close(c.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("target", GEMM_TARGETS)
def test_chunked_linear_attention_matches_torch(target):
    Bt, S, H, DK, DV = 2, 37, 2, 32, 32  # 37 = 2 chunks of 16 + a tail of 5
    gen = torch.Generator().manual_seed(7)
    q, k, v = ((torch.randn(Bt, S, H, d, generator=gen) * 0.5).half() for d in (DK, DK, DV))
    o = torch.full((Bt, S, H, DV), float("nan"))
    state = torch.full((Bt, H, DK, DV), float("nan"))
    P.chunked_linear_attention(target, Bt, S, H, DK, DV)(q, k, v, o, state)
    scores = torch.einsum("bshd,bthd->bhst", q.float() * DK**-0.5, k.float()).tril()
    torch.testing.assert_close(o, torch.einsum("bhst,bthd->bshd", scores, v.float()), rtol=1e-2, atol=3e-3)
    torch.testing.assert_close(state, torch.einsum("bshk,bshv->bhkv", k.float(), v.float()), rtol=1e-5, atol=1e-4)


def test_layer_norm_backward_matches_autograd():
    N, D, eps = 13, 96, 1e-5  # 13 rows in blocks of 4
    gen = torch.Generator().manual_seed(8)
    x = torch.randn(N, D, generator=gen).half()
    dy = torch.randn(N, D, generator=gen).half()
    gamma, beta = torch.randn(D, generator=gen), torch.randn(D, generator=gen)
    xf, gf, bf = x.float().requires_grad_(), gamma.clone().requires_grad_(), beta.clone().requires_grad_()
    torch.nn.functional.layer_norm(xf, (D,), gf, bf, eps).backward(dy.float())
    mean = x.float().mean(-1)
    rstd = torch.rsqrt(x.float().var(-1, unbiased=False) + eps)
    dx = torch.empty(N, D, dtype=torch.float16)
    dg, db = torch.zeros(D), torch.zeros(D)
    P.layer_norm_backward(N, D, 4, 96)(dy, x, gamma, mean, rstd, dx, dg, db)
    torch.testing.assert_close(dx.float(), xf.grad, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(dg, gf.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, bf.grad, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("target", GEMM_TARGETS)
def test_streamk_gemm_matches_torch(target):
    M, N, K, programs = 35, 70, 88, 5  # 54 iterations over 5 threadgroups: whole and split tiles
    kernel, total = P.streamk_gemm(target, M, N, K, programs)
    assert total % programs and total // programs > 6  # some tiles are split across threadgroups
    gen = torch.Generator().manual_seed(9)
    a = torch.randn(M, K, generator=gen).half()
    b = torch.randn(N, K, generator=gen).half()
    c = torch.zeros(M, N)
    kernel(a, b, c)
    torch.testing.assert_close(c, a.float() @ b.float().T, rtol=1e-3, atol=1e-3)
