"""Flash decoding, the vector dataflow (kernels/attention.py, the default for decoding on both
targets): one simdgroup per query head, each lane a run of head_dim / 32 elements of q, K and V, a
simd sum per key; no threadgroup memory, no barrier. Against torch under the race checker (empty
splits, one-key splits, GQA groups of 1 to 32, head_dim 32 to 256, three dtypes, NaN), its counts,
and the configurations it refuses."""

from __future__ import annotations

import functools
import math

import pytest
import tilelang
import torch
import torch.nn.functional as F

from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.kernels import metal4_target, plain_metal_target
from tilelang_metal.kernels.attention import MASKED_SCORE, flash_decoding_program
from tilelang_metal.kernels.attention_config import STAGED, VECTOR, decoding_dataflow, decoding_splits

TARGETS = {"metal4": metal4_target, "metal": plain_metal_target}
TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}


@functools.lru_cache(maxsize=None)
def _kernel(target, batch, heads, kv_heads, seq, dim, num_split, dtype):
    tgt = TARGETS[target]()
    program = flash_decoding_program(batch, heads, kv_heads, seq, dim, num_split=num_split, dtype=dtype, target=tgt)
    return tilelang.compile(program, out_idx=[3, 4, 5], target=tgt, execution_backend="emulator")


def _inputs(batch, heads, kv_heads, seq, dim, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, dim, generator=g).to(TORCH[dtype])
    k, v = (torch.randn(batch, seq, kv_heads, dim, generator=g).to(TORCH[dtype]) for _ in range(2))
    return q, k, v


def _reference(q, k, v):
    group = q.shape[1] // k.shape[2]
    kk, vv = (x.transpose(1, 2).repeat_interleave(group, 1).float() for x in (k, v))
    return F.scaled_dot_product_attention(q.float()[:, :, None], kk, vv)[:, :, 0], kk


@pytest.mark.parametrize(
    "target,batch,heads,kv_heads,seq,dim,num_split,dtype",
    [
        ("metal", 2, 8, 2, 101, 64, 3, "float16"),  # 4 query heads per KV head, 2 lanes' elements each
        ("metal4", 1, 4, 1, 3, 128, 4, "float16"),  # 3 keys in 4 splits: one key each, the last split empty
        pytest.param("metal", 1, 32, 1, 45, 32, 2, "bfloat16", marks=pytest.mark.slow),  # 1024 threads, 1 element per lane
        pytest.param("metal4", 1, 2, 2, 77, 256, 5, "float32", marks=pytest.mark.slow),  # MHA, 8 floats per lane
    ],
)
def test_vector_decoding_matches_torch(target, batch, heads, kv_heads, seq, dim, num_split, dtype):
    kernel = _kernel(target, batch, heads, kv_heads, seq, dim, num_split, dtype)
    q, k, v = _inputs(batch, heads, kv_heads, seq, dim, dtype, seed=seq)
    partial_out, partial_lse, out = racecheck(kernel, q, k, v)
    ref, kk = _reference(q, k, v)
    tol = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 1e-4}[dtype]
    torch.testing.assert_close(out.float(), ref, atol=tol, rtol=tol)
    split_len = -(-seq // num_split)
    scores = (q.float()[:, :, None] @ kk.transpose(-1, -2))[:, :, 0] / math.sqrt(dim)
    for s in range(num_split):
        part = scores[..., s * split_len : (s + 1) * split_len]
        if part.shape[-1] == 0:  # no key: a zero output whose weight in the combine is exactly 0
            assert (partial_out[:, :, s] == 0).all() and (partial_lse[:, :, s] == MASKED_SCORE).all()
            continue
        torch.testing.assert_close(partial_lse[:, :, s], torch.logsumexp(part, -1) / math.log(2), atol=1e-3, rtol=1e-3)


def test_vector_decoding_reads_runs_and_uses_no_threadgroup_memory():
    """head_dim 128 in fp16: each lane's run of K and V is one half4 load per key (no narrow load),
    and nothing goes through threadgroup memory or waits at a barrier."""
    kernel = _kernel("metal", 1, 8, 2, 101, 128, 3, "float16")
    source = kernel.get_kernel_source()
    assert "*(const device half4*)(K + " in source and "*(const device half4*)(V + " in source and "simd_sum(" in source
    # masks and initial maxima are the finite MASKED_SCORE (docs/guide.md: Metal's fast math)
    assert "INFINITY" not in source and "HUGE_VAL" not in source and "NAN" not in source and f"{MASKED_SCORE!r}f" in source
    total = counters(kernel, *_inputs(1, 8, 2, 101, 128, "float16", seed=1)).total
    assert total["narrow_device_loads"] == 0
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0


def test_nan_and_inf_reach_only_the_heads_they_touch():
    """NaN in a value of KV head 1 (query heads 4-7), NaN in query head 1, +inf in a key of KV head 0:
    torch's NaN pattern (a NaN score is not a zero weight: the split's sum stays NaN)."""
    q, k, v = _inputs(1, 8, 2, 40, 64, "float16", seed=3)
    v[0, 7, 1, 5] = float("nan")  # KV head 1 serves query heads 4-7
    q[0, 1, 2] = float("nan")
    k[0, 30, 0, 8] = float("inf")
    out = _kernel("metal", 1, 8, 2, 40, 64, 2, "float16")(q, k, v)[-1].float()
    ref, _ = _reference(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(ref)) and torch.isnan(out[0, 4:, 5]).all() and torch.isnan(out[0, 1]).all()
    finite = ~torch.isnan(ref)
    torch.testing.assert_close(out[finite], ref[finite], atol=4e-3, rtol=4e-3)


def test_default_key_ranges_grow_with_the_context():
    """One range per 128 keys (at least a GEMM dataflow's block_n), at most 64: a 4k context in 32
    ranges (MLX's sdpa_vector_2pass: 32 or 64), not the 4 that left each simdgroup 1024 keys."""
    assert [decoding_splits(n) for n in (1, 64, 129, 300, 4096, 32768)] == [1, 1, 2, 3, 32, 64]
    assert decoding_splits(300, block_n=256) == 2
    kernel = _kernel("metal", 1, 4, 2, 300, 64, None, "float16")
    q, k, v = _inputs(1, 4, 2, 300, 64, "float16", seed=3)
    _, partial_lse, out = racecheck(kernel, q, k, v)
    assert partial_lse.shape == (1, 4, 3)  # 100 keys per range
    torch.testing.assert_close(out.float(), _reference(q, k, v)[0], atol=4e-3, rtol=4e-3)
    with pytest.raises(MetalLoweringError, match=r"^flash_decoding_program num_split=0 must be at least 1; pass num_split >= 1, or None \(3 for 300 keys\)$"):
        flash_decoding_program(1, 4, 2, 300, 64, num_split=0)


def test_the_default_dataflow_and_what_the_vector_one_refuses():
    assert decoding_dataflow(8, 2, 128, plain_metal_target()) == VECTOR
    assert decoding_dataflow(8, 2, 128, metal4_target()) == VECTOR
    assert decoding_dataflow(8, 2, 80, plain_metal_target()) == STAGED  # 80 is no multiple of 32
    assert decoding_dataflow(64, 1, 64, plain_metal_target()) == STAGED  # 64 heads per KV head: 2048 threads
    with pytest.raises(MetalLoweringError, match=r"head_dim=80 is not a multiple of 32.*use dataflow='staged' or 'direct', or head_dim=64 or 96"):
        flash_decoding_program(1, 8, 2, 64, 80, dataflow="vector")
    with pytest.raises(MetalLoweringError, match=r"64 query heads per KV head need 2048 threads in the vector dataflow"):
        flash_decoding_program(1, 64, 1, 64, 64, dataflow="vector")
    with pytest.raises(MetalLoweringError, match=r"dataflow='rows' is not a decoding dataflow"):
        flash_decoding_program(1, 8, 2, 64, 64, dataflow="rows")
