"""Fused mixture-of-experts forward in the style of TileLang's `examples/fusedmoe`, written for
these tests and run in the emulator against torch, on the simdgroup (`metal`) and the
cooperative-tensor (`metal4`) GEMM paths:

- routing: router logits (a GEMM), softmax over the experts and top-k by repeated row maxima
  (the lowest expert index on ties), in one kernel;
- one module of four kernels launched in order: the shared expert's gate / up GEMMs with
  SiLU(gate) * up, its down GEMM written to Y; then the routed experts as a grouped GEMM over
  token rows gathered by slot (one expert per block of slots, read from a table), and their down
  GEMM scaled by the routing weight and added into the token's row of Y with atomic adds.

The MoE runs in fp16 on `metal` and in bf16 on `metal4`. TileLang's example keeps the activation
tile of each GEMM in a register fragment (`T.gemm` with A in `local.fragment`); here it is staged
through threadgroup memory. Shapes: prime token counts, hidden / intermediate sizes that are not
multiples of the tiles, an expert no token picks."""

import functools

import pytest
import tilelang
import tilelang.language as T
import torch

from tilelang_metal.kernels import metal4_target

TARGETS = {"metal": lambda: "metal", "metal4": metal4_target}
LOG2E = 1.4426950408889634
BT = 16  # tokens (slots) per threadgroup


@functools.lru_cache(maxsize=None)
def router_topk(target: str, tokens: int, hidden: int, experts: int, topk: int, bk: int = 32):
    @T.prim_func
    def route(X: T.Tensor((tokens, hidden), "float16"), Wr: T.Tensor((experts, hidden), "float16"),
              Idx: T.Tensor((tokens, topk), "int32"), Wt: T.Tensor((tokens, topk), "float32")):
        with T.Kernel(T.ceildiv(tokens, BT), threads=64) as bx:
            x_s = T.alloc_shared((BT, bk), "float16")
            w_s = T.alloc_shared((experts, bk), "float16")
            logits = T.alloc_fragment((BT, experts), "float32")
            p = T.alloc_fragment((BT, experts), "float32")
            flipped = T.alloc_fragment((BT, experts), "int32")
            row_max = T.alloc_fragment((BT,), "float32")
            row_sum = T.alloc_fragment((BT,), "float32")
            best = T.alloc_fragment((BT,), "float32")
            best_flipped = T.alloc_fragment((BT,), "int32")
            T.clear(logits)
            for k in T.Pipelined(T.ceildiv(hidden, bk), num_stages=1):
                T.copy(X[bx * BT, k * bk], x_s)
                T.copy(Wr[0, k * bk], w_s)
                T.gemm(x_s, w_s, logits, transpose_B=True)
            T.copy(logits, p)
            T.reduce_max(p, row_max, dim=1)
            for i, j in T.Parallel(BT, experts):
                p[i, j] = T.exp(p[i, j] - row_max[i])
            T.reduce_sum(p, row_sum, dim=1)
            for i, j in T.Parallel(BT, experts):
                p[i, j] = p[i, j] / row_sum[i]
            for r in T.serial(topk):
                T.reduce_max(p, best, dim=1)
                # the lowest index holding the maximum: max over (experts - j)
                for i, j in T.Parallel(BT, experts):
                    flipped[i, j] = T.if_then_else(p[i, j] == best[i], experts - j, 0)
                T.reduce_max(flipped, best_flipped, dim=1)
                for i, j in T.Parallel(BT, experts):
                    if j == experts - best_flipped[i]:
                        p[i, j] = -1.0  # probabilities are >= 0: taken experts drop out
                for i in T.Parallel(BT):
                    if bx * BT + i < tokens:
                        Idx[bx * BT + i, r] = experts - best_flipped[i]
                        Wt[bx * BT + i, r] = best[i]

    return tilelang.compile(route, target=TARGETS[target](), execution_backend="emulator")


def slot_blocks(tokens: int, experts: int, topk: int) -> int:
    """Blocks of BT slots enough for any routing: every expert's group rounds up by < one block."""
    return -(-tokens * topk // BT) + experts


@functools.lru_cache(maxsize=None)
def moe_forward(target: str, dtype: str, tokens: int, hidden: int, inter: int, experts: int, topk: int, shared_inter: int,
                bh: int = 32, bi: int = 32, bk: int = 32):
    blocks = slot_blocks(tokens, experts, topk)
    slots = blocks * BT
    dt = dtype  # activations, weights and intermediates; accumulation in float32

    @T.prim_func
    def moe(X: T.Tensor((tokens, hidden), dt),
            Sg: T.Tensor((shared_inter, hidden), dt), Su: T.Tensor((shared_inter, hidden), dt), Sd: T.Tensor((hidden, shared_inter), dt),
            Eg: T.Tensor((experts, inter, hidden), dt), Eu: T.Tensor((experts, inter, hidden), dt), Ed: T.Tensor((experts, hidden, inter), dt),
            SlotToken: T.Tensor((slots,), "int32"), SlotWeight: T.Tensor((slots,), "float32"), BlockExpert: T.Tensor((blocks,), "int32"),
            Hs: T.Tensor((tokens, shared_inter), dt), Hr: T.Tensor((slots, inter), dt), Y: T.Tensor((tokens, hidden), "float32")):
        with T.Kernel(T.ceildiv(shared_inter, bi), T.ceildiv(tokens, BT), threads=128) as (bx, by):
            x_s = T.alloc_shared((BT, bk), dt)
            g_s = T.alloc_shared((bi, bk), dt)
            u_s = T.alloc_shared((bi, bk), dt)
            gate = T.alloc_fragment((BT, bi), "float32")
            up = T.alloc_fragment((BT, bi), "float32")
            T.clear(gate)
            T.clear(up)
            for k in T.Pipelined(T.ceildiv(hidden, bk), num_stages=1):
                T.copy(X[by * BT, k * bk], x_s)
                T.copy(Sg[bx * bi, k * bk], g_s)
                T.copy(Su[bx * bi, k * bk], u_s)
                T.gemm(x_s, g_s, gate, transpose_B=True)
                T.gemm(x_s, u_s, up, transpose_B=True)
            for i, j in T.Parallel(BT, bi):
                up[i, j] = up[i, j] * gate[i, j] / (1.0 + T.exp2(-gate[i, j] * LOG2E))
            T.copy(up, Hs[by * BT, bx * bi])
        with T.Kernel(T.ceildiv(hidden, bh), T.ceildiv(tokens, BT), threads=128) as (bx, by):
            h_s = T.alloc_shared((BT, bk), dt)
            d_s = T.alloc_shared((bh, bk), dt)
            out = T.alloc_fragment((BT, bh), "float32")
            T.clear(out)
            for k in T.Pipelined(T.ceildiv(shared_inter, bk), num_stages=1):
                T.copy(Hs[by * BT, k * bk], h_s)
                T.copy(Sd[bx * bh, k * bk], d_s)
                T.gemm(h_s, d_s, out, transpose_B=True)
            T.copy(out, Y[by * BT, bx * bh])
        with T.Kernel(T.ceildiv(inter, bi), blocks, threads=128) as (bx, by):
            x_s = T.alloc_shared((BT, bk), dt)
            g_s = T.alloc_shared((bi, bk), dt)
            u_s = T.alloc_shared((bi, bk), dt)
            gate = T.alloc_fragment((BT, bi), "float32")
            up = T.alloc_fragment((BT, bi), "float32")
            e = BlockExpert[by]
            T.clear(gate)
            T.clear(up)
            for k in T.Pipelined(T.ceildiv(hidden, bk), num_stages=1):
                for i, j in T.Parallel(BT, bk):
                    tok = SlotToken[by * BT + i]  # -1 marks a padding slot
                    x_s[i, j] = T.if_then_else(tok >= 0 and k * bk + j < hidden, X[T.max(tok, 0), T.min(k * bk + j, hidden - 1)], T.cast(0, dt))
                T.copy(Eg[e, bx * bi:(bx + 1) * bi, k * bk:(k + 1) * bk], g_s)
                T.copy(Eu[e, bx * bi:(bx + 1) * bi, k * bk:(k + 1) * bk], u_s)
                T.gemm(x_s, g_s, gate, transpose_B=True)
                T.gemm(x_s, u_s, up, transpose_B=True)
            for i, j in T.Parallel(BT, bi):
                up[i, j] = up[i, j] * gate[i, j] / (1.0 + T.exp2(-gate[i, j] * LOG2E))
            T.copy(up, Hr[by * BT, bx * bi])
        with T.Kernel(T.ceildiv(hidden, bh), blocks, threads=128) as (bx, by):
            h_s = T.alloc_shared((BT, bk), dt)
            d_s = T.alloc_shared((bh, bk), dt)
            out = T.alloc_fragment((BT, bh), "float32")
            e = BlockExpert[by]
            T.clear(out)
            for k in T.Pipelined(T.ceildiv(inter, bk), num_stages=1):
                T.copy(Hr[by * BT, k * bk], h_s)
                T.copy(Ed[e, bx * bh:(bx + 1) * bh, k * bk:(k + 1) * bk], d_s)
                T.gemm(h_s, d_s, out, transpose_B=True)
            for i, j in T.Parallel(BT, bh):
                tok = SlotToken[by * BT + i]
                if tok >= 0 and bx * bh + j < hidden:
                    T.atomic_add(Y[tok, bx * bh + j], out[i, j] * SlotWeight[by * BT + i])

    return tilelang.compile(moe, target=TARGETS[target](), execution_backend="emulator")


def group_by_expert(idx: torch.Tensor, weight: torch.Tensor, experts: int):
    """Host bookkeeping (as in TileLang's example): the (token, k) pairs sorted by expert, each
    expert's group padded to whole blocks of BT slots; padding slots hold token -1."""
    tokens, topk = idx.shape
    blocks = slot_blocks(tokens, experts, topk)
    slot_token = torch.full((blocks * BT,), -1, dtype=torch.int32)
    slot_weight = torch.zeros(blocks * BT)
    block_expert = torch.zeros(blocks, dtype=torch.int32)
    flat = idx.flatten().long()
    start = 0
    for e in range(experts):
        pairs = torch.nonzero(flat == e).flatten()
        if len(pairs) == 0:
            continue
        slot_token[start:start + len(pairs)] = (pairs // topk).int()
        slot_weight[start:start + len(pairs)] = weight.flatten()[pairs]
        used = -(-len(pairs) // BT)
        block_expert[start // BT:start // BT + used] = e
        start += used * BT
    return slot_token, slot_weight, block_expert


def expert_mlp(x: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    h = torch.nn.functional.silu(x @ gate.float().T) * (x @ up.float().T)
    return h.to(gate.dtype).float() @ down.float().T  # the kernel stores the intermediate in the weights' dtype


@pytest.mark.parametrize("target", ["metal", "metal4"])
def test_router_softmax_topk_matches_torch(target):
    tokens, hidden, experts, topk = 37, 80, 8, 3
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(tokens, hidden, generator=gen).half()
    wr = (torch.randn(experts, hidden, generator=gen) / hidden**0.5).half()
    idx = torch.empty(tokens, topk, dtype=torch.int32)
    wt = torch.empty(tokens, topk)
    router_topk(target, tokens, hidden, experts, topk)(x, wr, idx, wt)
    want_w, want_i = torch.softmax(x.float() @ wr.float().T, -1).topk(topk, -1)
    torch.testing.assert_close(wt, want_w, rtol=1e-5, atol=1e-6)
    assert torch.equal(idx, want_i.int())


@pytest.mark.parametrize("target, dtype", [("metal", "float16"), pytest.param("metal4", "bfloat16", marks=pytest.mark.slow)])
def test_shared_and_routed_moe_forward_matches_torch(target, dtype):
    tokens, hidden, inter, experts, topk, shared_inter = 29, 80, 40, 6, 2, 72
    gen = torch.Generator().manual_seed(2)
    dt = getattr(torch, dtype)

    def weight(*shape):
        return (torch.randn(*shape, generator=gen) / shape[-1] ** 0.5).to(dt)

    x = (torch.randn(tokens, hidden, generator=gen) * 0.5).to(dt)
    sg, su, sd = weight(shared_inter, hidden), weight(shared_inter, hidden), weight(hidden, shared_inter)
    eg, eu, ed = weight(experts, inter, hidden), weight(experts, inter, hidden), weight(experts, hidden, inter)
    scores = torch.softmax(torch.randn(tokens, experts, generator=gen), -1)
    scores[:, 4] = 0.0  # expert 4 is never picked: an empty group
    wt, idx = scores.topk(topk, -1)
    slot_token, slot_weight, block_expert = group_by_expert(idx, wt, experts)
    hs = torch.empty(tokens, shared_inter, dtype=dt)
    hr = torch.empty(len(slot_token), inter, dtype=dt)
    y = torch.full((tokens, hidden), float("nan"))  # the shared expert's kernel must write every element
    moe_forward(target, dtype, tokens, hidden, inter, experts, topk, shared_inter)(
        x, sg, su, sd, eg, eu, ed, slot_token, slot_weight, block_expert, hs, hr, y)

    xf = x.float()
    want = expert_mlp(xf, sg, su, sd)
    for t in range(tokens):
        for j in range(topk):
            e = int(idx[t, j])
            want[t] += wt[t, j] * expert_mlp(xf[t:t + 1], eg[e], eu[e], ed[e])[0]
    torch.testing.assert_close(y, want, rtol=2e-3, atol=2e-3)  # the reference rounds intermediates like the kernel
