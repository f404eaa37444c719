"""Ports of TileLang's example kernels (elementwise, cast, dynamic_shape, grouped_gemm,
attention_sink, blocksparse_attention, deepseek_mla, linear_attention/retention, flash_attention
backward), run in the emulator under the race checker and compared with torch on CPU. Kernels are
in `example_ports.py`; the `metal4` variants are in `tests/slow/test_example_ports_metal4.py`.
Shapes are small and ragged: partial tiles, a partial group, an empty group, an empty KV split."""

import math

import pytest
import torch

import example_ports as E
from tilelang_metal.emulator import racecheck

SEEDS = (0, 1)  # race-checked schedules per run: enough for the exchange patterns here


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- elementwise


def test_elementwise_add_covers_partial_tiles_and_propagates_nan_and_inf():
    M, N = 37, 53  # 16 x 32 tiles: partial in both dimensions
    a = torch.randn(M, N, generator=gen(1)).half()
    b = torch.randn(M, N, generator=gen(2)).half()
    a[0, :3] = torch.tensor([float("nan"), float("inf"), float("inf")])
    b[0, :3] = torch.tensor([1.0, 1.0, -float("inf")])
    c = torch.full((M, N), -7.0)
    racecheck(E.elementwise_add(M, N, 16, 32, 128), a, b, c, seeds=SEEDS)
    torch.testing.assert_close(c, a.float() + b.float(), rtol=0, atol=0, equal_nan=True)  # fp16 + fp16 is exact in fp32


def test_grid_stride_loop_with_a_scalar_argument_writes_every_element_once():
    numel = 997  # prime: no thread count divides it
    out = torch.full((numel,), -1.0)
    racecheck(E.grid_stride_fill(numel, 3, 64), out, 2.5, seeds=SEEDS)
    assert torch.equal(out, torch.full((numel,), 2.5))


# ----------------------------------------------------------------------------- cast


def group_quant_reference(x: torch.Tensor, group: int, qmax: float) -> tuple[torch.Tensor, torch.Tensor]:
    M, N = x.shape
    groups = -(-N // group)
    padded = torch.nn.functional.pad(x, (0, groups * group - N)).view(M, groups, group)
    scale = padded.abs().amax(-1).clamp(min=1e-4) / qmax
    q = torch.round((padded / scale[..., None]).clamp(-qmax, qmax)).view(M, -1)[:, :N]
    return q, scale


def test_per_token_group_quant_matches_torch():
    M, N, group = 19, 300, 128  # 8-row blocks: partial; 300 columns: a partial last group
    x = torch.randn(M, N, generator=gen(3)) * 3
    x[4] = 0  # an all-zero row: the scale floor 1e-4
    x[5, 7] = 1e4  # an outlier dominates its group's scale
    x[6, 130] = -0.0
    q = torch.zeros(M, N, dtype=torch.int8)
    scale = torch.zeros(M, -(-N // group))
    racecheck(E.per_token_group_quant(M, N, group, 8), x, q, scale, seeds=SEEDS)
    want_q, want_scale = group_quant_reference(x, group, 127.0)
    assert torch.equal(scale, want_scale)
    assert torch.equal(q, want_q.to(torch.int8))


def test_fp8_output_is_refused_in_one_line():
    with pytest.raises(Exception, match=r"float8_e4m3 has no Metal equivalent.*use float32, float16, bfloat16") as err:
        E.per_token_group_quant(16, 128, 128, 8, "float8_e4m3", 448.0)
    assert "\n" not in str(err.value)


# ----------------------------------------------------------------------------- dynamic shapes


def run_dynamic_gemm(target: str, trans_a: bool, trans_b: bool) -> None:
    kernel = E.dynamic_gemm(target, trans_a, trans_b)
    for i, (M, N, K) in enumerate([(37, 45, 29), (64, 32, 48), (1, 7, 3)]):
        a = torch.randn((K, M) if trans_a else (M, K), generator=gen(10 + i)).half()
        b = torch.randn((N, K) if trans_b else (K, N), generator=gen(20 + i)).half()
        c = torch.full((M, N), 7.0).half()
        if i == 0:
            racecheck(kernel, a, b, c, seeds=SEEDS)
        else:
            kernel(a, b, c)
        want = (a.T if trans_a else a).float() @ (b.T if trans_b else b).float()
        torch.testing.assert_close(c.float(), want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), pytest.param(True, True, marks=pytest.mark.slow)], ids=["nn", "tt"])
def test_dynamic_gemm_serves_every_shape_with_one_kernel(trans_a, trans_b):
    run_dynamic_gemm("metal", trans_a, trans_b)


# ----------------------------------------------------------------------------- grouped GEMM


def run_grouped_gemm(target: str) -> None:
    sizes, K, N, bm = (19, 0, 40, 32, 7), 40, 45, 32  # an empty group, one over two tiles, one of exactly a tile; partial K, N tiles
    offsets = [0]
    for s in sizes[:-1]:
        offsets.append(offsets[-1] + s)
    a = torch.randn(sum(sizes), K, generator=gen(4)).half()
    b = torch.randn(len(sizes), K, N, generator=gen(5)).half()
    c = torch.full((sum(sizes), N), 9.0).half()
    tables = [torch.tensor(t, dtype=torch.int32) for t in (sizes, offsets, E.padded_group_offsets(sizes, bm))]
    racecheck(E.grouped_gemm(target, sizes, K, N, bm=bm), a, b, c, *tables, seeds=SEEDS)
    want = torch.cat([a[o : o + s].float() @ b[g].float() for g, (o, s) in enumerate(zip(offsets, sizes))])
    torch.testing.assert_close(c.float(), want, rtol=1e-2, atol=1e-2)


def test_grouped_gemm_matches_torch_per_group():
    run_grouped_gemm("metal")


# ----------------------------------------------------------------------------- attention


def sink_attention_reference(q, k, v, sinks, window):
    seq_q, seq_kv, dim = q.shape[2], k.shape[2], q.shape[3]
    logits = torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / math.sqrt(dim)
    qpos = torch.arange(seq_q)[:, None] + seq_kv - seq_q
    kpos = torch.arange(seq_kv)[None, :]
    hidden = kpos > qpos
    if window is not None:
        hidden |= kpos <= qpos - window
    logits = logits.masked_fill(hidden, float("-inf"))
    sink = sinks.float().view(1, -1, 1, 1)
    top = torch.maximum(logits.amax(-1, keepdim=True), sink)
    weights = torch.exp(logits - top)
    return weights @ v.float() / (weights.sum(-1, keepdim=True) + torch.exp(sink - top))


def run_attention_sink(target: str, window) -> None:
    batch, heads, seq_q, seq_kv, dim = 1, 2, 21, 37, 32  # 16 past positions, partial query and key blocks
    g = gen(6)
    q = torch.randn(batch, heads, seq_q, dim, generator=g).half()
    k = torch.randn(batch, heads, seq_kv, dim, generator=g).half()
    v = torch.randn(batch, heads, seq_kv, dim, generator=g).half()
    sinks = torch.tensor([2.0, -1.0]).half()  # one sink outweighing most keys, one small
    o = torch.zeros(batch, heads, seq_q, dim).half()
    racecheck(E.attention_sink(target, batch, heads, seq_q, seq_kv, dim, window), q, k, v, sinks, o, seeds=SEEDS)
    torch.testing.assert_close(o.float(), sink_attention_reference(q, k, v, sinks, window), rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("window", [None, pytest.param(16, marks=pytest.mark.slow)], ids=["causal", "sliding-window"])
def test_attention_sink_matches_the_gpt_oss_reference(window):
    run_attention_sink("metal", window)


def test_attention_sink_refuses_a_window_that_is_not_whole_blocks():
    with pytest.raises(ValueError, match="multiple of bn"):
        E.attention_sink("metal", 1, 1, 16, 16, 32, 24)


def run_blocksparse_attention(target: str, causal: bool) -> None:
    batch, heads, seq, dim, block = 1, 2, 45, 32, 16
    g = gen(7)
    q, k, v = (torch.randn(batch, heads, seq, dim, generator=g).half() for _ in range(3))
    blocks = -(-seq // block)
    mask = torch.rand(batch, heads, blocks, blocks, generator=g) > 0.4
    mask[0, 0, 1, :] = False  # a query block with no key block: zeros
    mask[0, 1, 2, 2] = True
    o = torch.full((batch, heads, seq, dim), 3.0).half()
    racecheck(E.blocksparse_attention(target, batch, heads, seq, dim, causal), q, k, v, mask, o, seeds=SEEDS)
    visible = mask.repeat_interleave(block, 2).repeat_interleave(block, 3)[:, :, :seq, :seq]
    if causal:
        visible = visible & torch.ones(seq, seq, dtype=torch.bool).tril()
    logits = (torch.einsum("bhqd,bhkd->bhqk", q.float(), k.float()) / math.sqrt(dim)).masked_fill(~visible, float("-inf"))
    want = torch.softmax(logits, -1).nan_to_num(0.0) @ v.float()
    torch.testing.assert_close(o.float(), want, rtol=1e-2, atol=2e-3)
    assert torch.equal(o[0, 0, block : 2 * block], torch.zeros(block, dim).half())


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_blocksparse_attention_skips_disabled_blocks(causal):
    run_blocksparse_attention("metal", causal)


def run_mla_decode(target: str, seq_kv: int, splits: int) -> None:
    batch, heads, dim, pe_dim = 2, 16, 64, 16
    g = gen(8)
    q = torch.randn(batch, heads, dim, generator=g).half()
    q_pe = torch.randn(batch, heads, pe_dim, generator=g).half()
    kv = torch.randn(batch, seq_kv, 1, dim, generator=g).half()
    k_pe = torch.randn(batch, seq_kv, 1, pe_dim, generator=g).half()
    lse, partial = torch.zeros(batch, heads, splits), torch.zeros(batch, heads, splits, dim)
    out = torch.zeros(batch, heads, dim).half()
    racecheck(E.mla_decode(target, batch, heads, seq_kv, dim, pe_dim, splits), q, q_pe, kv, k_pe, lse, partial, out, seeds=SEEDS)
    query = torch.cat([q, q_pe], -1).float()
    key = torch.cat([kv[:, :, 0], k_pe[:, :, 0]], -1).float()
    weights = torch.softmax(torch.einsum("bhd,bsd->bhs", query, key) / math.sqrt(dim + pe_dim), -1)
    torch.testing.assert_close(out.float(), torch.einsum("bhs,bsd->bhd", weights, kv[:, :, 0].float()), rtol=1e-2, atol=2e-3)
    if splits * -(-seq_kv // splits) - seq_kv >= -(-seq_kv // splits):  # the last split has no key
        assert torch.equal(lse[:, :, -1], torch.full((batch, heads), -math.inf))


@pytest.mark.parametrize("seq_kv, splits", [pytest.param(77, 3, marks=pytest.mark.slow), (9, 4)], ids=["ragged-splits", "empty-split"])  # 9 keys on 4 splits: ragged and empty
def test_mla_decode_matches_torch(seq_kv, splits):
    run_mla_decode("metal", seq_kv, splits)


# ----------------------------------------------------------------------------- linear attention


def run_chunk_retention(target: str) -> None:
    batch, seq, heads, dk, dv = 1, 45, 2, 32, 16  # two key blocks, a partial last chunk
    g = gen(9)
    q, k = (torch.randn(batch, seq, heads, dk, generator=g).half() for _ in range(2))
    v = torch.randn(batch, seq, heads, dv, generator=g).half()
    o = torch.full((2, batch, seq, heads, dv), 5.0)
    racecheck(E.chunk_retention(target, batch, seq, heads, dk, dv), q, k, v, o, seeds=SEEDS)
    gamma = torch.tensor(E.retention_decay(heads), dtype=torch.float64).view(heads, 1, 1)
    pos = torch.arange(seq, dtype=torch.float64)
    decay = gamma ** (pos[:, None] - pos[None, :]).clamp(min=0) * (pos[:, None] >= pos[None, :])
    scores = torch.einsum("bthd,bshd->bhts", q.double(), k.double()) / math.sqrt(dk) * decay
    want = torch.einsum("bhts,bshd->bthd", scores, v.double()).float()
    torch.testing.assert_close(o.sum(0), want, rtol=1e-2, atol=2e-2)  # fp16 score and state tiles


def test_chunk_retention_matches_the_parallel_form():
    run_chunk_retention("metal")


# ----------------------------------------------------------------------------- attention backward


def run_flash_attention_backward(target: str, causal: bool) -> None:
    batch, heads, seq, dim = 1, 2, 37, 32  # 16-blocks: a partial last query and key block
    g = gen(11)
    q, k, v, do = (torch.randn(batch, heads, seq, dim, generator=g).half() for _ in range(4))
    qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
    logits = torch.einsum("bhqd,bhkd->bhqk", qr, kr) / math.sqrt(dim)
    if causal:
        logits = logits.masked_fill(torch.ones(seq, seq, dtype=torch.bool).triu(1), float("-inf"))
    o = torch.softmax(logits, -1) @ vr
    o.backward(do.float())
    lse = torch.logsumexp(logits, -1).detach() * E.LOG2_E  # the forward's log2-sum-exp
    o16 = o.detach().half()
    delta, dq = torch.zeros(batch, heads, seq), torch.zeros(batch, heads, seq, dim)
    dk, dv = torch.zeros(batch, heads, seq, dim).half(), torch.zeros(batch, heads, seq, dim).half()
    racecheck(E.flash_attention_backward(target, batch, heads, seq, dim, causal), q, k, v, o16, do, lse, delta, dq, dk, dv, seeds=SEEDS)
    torch.testing.assert_close(delta, (o16.float() * do.float()).sum(-1), rtol=1e-5, atol=1e-5)
    for got, want in ((dq, qr.grad), (dk.float(), kr.grad), (dv.float(), vr.grad)):
        torch.testing.assert_close(got, want, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("causal", [pytest.param(False, marks=pytest.mark.slow), True], ids=["full", "causal"])
def test_flash_attention_backward_matches_autograd(causal):
    run_flash_attention_backward("metal", causal)


# ----------------------------------------------------------------------------- warp specialization


def test_warp_specialized_gemm_is_refused_in_one_line():
    with pytest.raises(Exception, match=r"T.gemm on Metal must run on threads starting at 0.*without T.ws and its barriers") as err:
        E.warp_specialized_gemm()
    assert "\n" not in str(err.value)
