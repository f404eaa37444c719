"""Warp-level TileLang calls (T.shfl_*, T.warp_reduce_*, T.any_sync / T.all_sync / T.ballot_sync) and TVM's
shuffle forms, printed as Metal simdgroup collectives, run in the emulator with two simdgroups and
compared with a reference of CUDA's semantics written here (segments of `width` lanes)."""

from __future__ import annotations

import functools

import pytest
import tilelang
import tilelang.language as T
import torch
from tilelang import tvm

THREADS = 64
WARP = 32


def xor_ref(v, mask, width):
    out = v.clone()
    for t in range(len(v)):
        lane, base = t % WARP, t - t % WARP
        src = lane ^ mask
        if src < (lane // width + 1) * width:  # later segments: own value
            out[t] = v[base + src]
    return out


def down_ref(v, delta, width):
    out = v.clone()
    for t in range(len(v)):
        lane, base = t % WARP, t - t % WARP
        if lane % width + delta < width:
            out[t] = v[base + lane + delta]
    return out


def up_ref(v, delta, width):
    out = v.clone()
    for t in range(len(v)):
        lane, base = t % WARP, t - t % WARP
        if lane % width >= delta:
            out[t] = v[base + lane - delta]
    return out


def index_ref(v, src_of_lane, width):
    out = v.clone()
    for t in range(len(v)):
        lane, base = t % WARP, t - t % WARP
        out[t] = v[base + (lane - lane % width) + src_of_lane(lane) % width]
    return out


def per_warp(v, fn):
    return torch.cat([fn(v[w * WARP : (w + 1) * WARP]).expand(WARP) for w in range(len(v) // WARP)])


# (label, kernel expression builder, reference)
CASES = [
    ("xor 3", lambda v, tx: T.shfl_xor(v, 3), lambda v: xor_ref(v, 3, 32)),
    ("xor 5 width 8", lambda v, tx: T.shfl_xor(v, 5, width=8), lambda v: xor_ref(v, 5, 8)),
    ("xor 8 width 8", lambda v, tx: T.shfl_xor(v, 8, width=8), lambda v: xor_ref(v, 8, 8)),
    ("down 3", lambda v, tx: T.shfl_down(v, 3), lambda v: down_ref(v, 3, 32)),
    ("down 3 width 8", lambda v, tx: T.shfl_down(v, 3, width=8), lambda v: down_ref(v, 3, 8)),
    ("up 2", lambda v, tx: T.shfl_up(v, 2), lambda v: up_ref(v, 2, 32)),
    ("up 5 width 16", lambda v, tx: T.shfl_up(v, 5, width=16), lambda v: up_ref(v, 5, 16)),
    ("index 7", lambda v, tx: T.shfl_sync(v, 7), lambda v: index_ref(v, lambda lane: 7, 32)),
    ("index 13 width 8", lambda v, tx: T.shfl_sync(v, 13, width=8), lambda v: index_ref(v, lambda lane: 13, 8)),
    ("index per lane", lambda v, tx: T.shfl_sync(v, (tx * 7) % 32), lambda v: index_ref(v, lambda lane: lane * 7 % 32, 32)),
    ("warp sum", lambda v, tx: T.warp_reduce_sum(v), lambda v: per_warp(v, lambda w: w.sum())),
    ("warp max", lambda v, tx: T.warp_reduce_max(v), lambda v: per_warp(v, lambda w: w.max())),
    ("warp min", lambda v, tx: T.warp_reduce_min(v), lambda v: per_warp(v, lambda w: w.min())),
    (
        "metal.simd_shuffle 9",
        lambda v, tx: T.call_intrin("float32", tvm.ir.Op.get("tirx.metal.simd_shuffle"), v, 9),
        lambda v: index_ref(v, lambda lane: 9, 32),
    ),
    (
        "metal.simd_shuffle_down 4",
        lambda v, tx: T.call_intrin("float32", tvm.ir.Op.get("tirx.metal.simd_shuffle_down"), v, 4),
        lambda v: down_ref(v, 4, 32),
    ),
    (  # tvm_warp_shuffle* keep their width through LowerIntrin (transform/keep_shuffle_widths.py)
        "tvm_warp_shuffle_up 1",
        lambda v, tx: T.call_intrin("float32", tvm.ir.Op.get("tirx.tvm_warp_shuffle_up"), T.uint32(0xFFFFFFFF), v, 1, 32, 32),
        lambda v: up_ref(v, 1, 32),
    ),
    (  # the form TileLang's Hadamard example uses: lanes 16-31 must read their own segment
        "tvm_warp_shuffle per lane width 16",
        lambda v, tx: T.call_intrin("float32", tvm.ir.Op.get("tirx.tvm_warp_shuffle"), T.uint32(0xFFFFFFFF), v, (tx ^ 1) % 16, 16, 16),
        lambda v: index_ref(v, lambda lane: lane ^ 1, 16),
    ),
    (
        "tvm_warp_shuffle_down 3 width 8",
        lambda v, tx: T.call_intrin("float32", tvm.ir.Op.get("tirx.tvm_warp_shuffle_down"), T.uint32(0xFFFFFFFF), v, 3, 8, 32),
        lambda v: down_ref(v, 3, 8),
    ),
]


N_CASES = len(CASES)


@functools.lru_cache(maxsize=None)
def float_kernel():
    @T.prim_func
    def main(A: T.Tensor((THREADS,), "float32"), O: T.Tensor((N_CASES, THREADS), "float32")):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            v = A[tx]
            for k, (_, build, _) in enumerate(CASES):
                O[k, tx] = build(v, tx)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


@functools.lru_cache(maxsize=None)
def int_kernel():
    @T.prim_func
    def main(A: T.Tensor((THREADS,), "int32"), O: T.Tensor((5, THREADS), "int32"), V: T.Tensor((THREADS,), "uint64")):
        with T.Kernel(1, threads=THREADS):
            tx = T.get_thread_binding()
            v = A[tx]
            O[0, tx] = T.warp_reduce_bitand(v)
            O[1, tx] = T.warp_reduce_bitor(v)
            O[2, tx] = T.any_sync(v > 60)
            O[3, tx] = T.all_sync(v > 0)
            O[4, tx] = T.warp_reduce_sum(v)
            V[tx] = T.ballot_sync(v > 30)

    return tilelang.compile(main, target="metal", execution_backend="emulator")


@pytest.mark.parametrize("case", range(len(CASES)), ids=[c[0] for c in CASES])
def test_float_warp_ops_match_cuda_semantics(case):
    torch.manual_seed(0)
    a = torch.randn(THREADS)
    out = torch.empty(len(CASES), THREADS)
    float_kernel()(a, out)
    label, _, ref = CASES[case]
    torch.testing.assert_close(out[case], ref(a), rtol=1e-5, atol=1e-5, msg=label)


def test_integer_warp_reductions_and_votes():
    a = torch.arange(1, THREADS + 1, dtype=torch.int32) * 3 % 61 + 1  # 1..61, never 0
    out = torch.empty(5, THREADS, dtype=torch.int32)
    votes = torch.empty(THREADS, dtype=torch.uint64)
    int_kernel()(a, out, votes)
    for w in range(THREADS // WARP):
        lanes = a[w * WARP : (w + 1) * WARP].tolist()
        seg = slice(w * WARP, (w + 1) * WARP)
        band, bor = lanes[0], 0
        for x in lanes:
            band &= x
            bor |= x
        assert out[0, seg].tolist() == [band] * WARP
        assert out[1, seg].tolist() == [bor] * WARP
        assert out[2, seg].tolist() == [int(any(x > 60 for x in lanes))] * WARP
        assert out[3, seg].tolist() == [1] * WARP
        assert out[4, seg].tolist() == [sum(lanes)] * WARP
        ballot = sum(1 << i for i, x in enumerate(lanes) if x > 30)
        assert votes[seg].tolist() == [ballot] * WARP


def test_sub_simdgroup_shuffles_mask_results_not_participation():
    """Every lane runs the shuffle (select, not a branch): a Metal collective needs the whole simdgroup."""
    source = float_kernel().get_kernel_source()
    assert "select(" in source and "if (" not in source


def test_bad_width_is_refused_at_lowering():
    @T.prim_func
    def main(A: T.Tensor((32,), "float32"), B: T.Tensor((32,), "float32")):
        with T.Kernel(1, threads=32):
            tx = T.get_thread_binding()
            B[tx] = T.shfl_xor(A[tx], 1, width=12)

    with pytest.raises(Exception, match="width 12 is not a power of two"):
        tilelang.compile(main, target="metal", execution_backend="emulator")
