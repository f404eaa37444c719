"""MLX's attention kernels, unmodified, in the emulator, against a float64 torch reference.

Launch logic (parameters, function constants, grids) lives in mlx_attention.py and follows MLX's
scaled_dot_product_attention.cpp; the shapes here are small and ragged (sequence lengths that no
block size divides) so the kernels' `load_safe` / remainder paths run.
"""

from __future__ import annotations

import pytest
import torch

from mlx_attention import reference_attention, sdpa_vector, sdpa_vector_2pass, steel_attention

# Tolerances against the float64 reference: the output is rounded to the input dtype once.
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def _qkv(dtype, B, H, Hkv, qL, kL, D, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, qL, D, generator=g).to(dtype)
    k = torch.randn(B, Hkv, kL, D, generator=g).to(dtype)
    v = torch.randn(B, Hkv, kL, D, generator=g).to(dtype)
    return q, k, v


def _check(out, ref, dtype):
    rtol, atol = TOL[dtype]
    assert not torch.isnan(out).any()  # every output element was written (buffers start as NaN)
    torch.testing.assert_close(out.double(), ref, rtol=rtol, atol=atol)


# (dtype, batch, heads, kv heads, qL, kL, head dim, causal, wn)
STEEL_CASES = [
    (torch.float32, 1, 2, 2, 37, 53, 64, False, 1),  # ragged Q and K blocks (align_Q = align_K = false)
    (torch.float16, 2, 4, 2, 37, 53, 64, True, 1),  # GQA, causal aligned to the end of the keys
    (torch.bfloat16, 1, 2, 1, 64, 64, 64, True, 1),  # aligned Q and K, causal from the first block
    (torch.float16, 1, 2, 1, 37, 53, 128, False, 1),  # head dim 128: BK = 16
    (torch.float32, 1, 2, 1, 37, 53, 128, True, 2),  # WN = 2: Q in registers, scores exchanged through threadgroup memory
]


@pytest.mark.parametrize("dtype,B,H,Hkv,qL,kL,D,causal,wn", STEEL_CASES)
def test_steel_attention(mlx_include, dtype, B, H, Hkv, qL, kL, D, causal, wn):
    q, k, v = _qkv(dtype, B, H, Hkv, qL, kL, D)
    scale = D**-0.5
    out = steel_attention(q, k, v, scale=scale, include=mlx_include, causal=causal, wn=wn).run()
    _check(out, reference_attention(q, k, v, scale=scale, causal=causal), dtype)


def test_steel_attention_bool_mask_and_sinks(mlx_include):
    q, k, v = _qkv(torch.float32, 1, 2, 2, 37, 53, 64, seed=1)
    mask = torch.rand(1, 1, 37, 53, generator=torch.Generator().manual_seed(2)) > 0.3  # broadcast over heads
    sinks = torch.tensor([0.5, -1.0])
    out = steel_attention(q, k, v, scale=0.125, include=mlx_include, mask=mask, sinks=sinks).run()
    _check(out, reference_attention(q, k, v, scale=0.125, mask=mask, sinks=sinks), torch.float32)


def test_steel_attention_additive_mask_with_infinities(mlx_include):
    q, k, v = _qkv(torch.float16, 1, 2, 2, 37, 53, 64, seed=3)
    mask = torch.randn(1, 2, 37, 53, generator=torch.Generator().manual_seed(4)).half()
    mask[0, 1, :, 40:] = float("-inf")  # masked keys, including the whole partial last key block
    out = steel_attention(q, k, v, scale=0.125, include=mlx_include, mask=mask).run()
    _check(out, reference_attention(q, k, v, scale=0.125, mask=mask), torch.float16)


def test_steel_attention_fully_masked_row_averages_instead_of_nan(mlx_include):
    """An MLX convention, not an emulator artefact: masked scores are `finite_min`, not -inf, so in
    a row whose keys are all masked every score is equal and weighs 1, *including* the zero-filled
    padding of the partial last key block: the row is sum(V) / (NK * BK) = sum(V) / 64 for 53 keys
    (BK 32), where torch gives NaN."""
    q, k, v = _qkv(torch.float32, 1, 1, 1, 37, 53, 64, seed=5)
    mask = torch.ones(1, 1, 37, 53, dtype=torch.bool)
    mask[0, 0, 3, :] = False
    out = steel_attention(q, k, v, scale=0.125, include=mlx_include, mask=mask).run()
    torch.testing.assert_close(out[0, 0, 3], v[0, 0].sum(0) / 64, rtol=1e-5, atol=1e-5)
    ref = reference_attention(q, k, v, scale=0.125, mask=mask)
    assert torch.isnan(ref[0, 0, 3]).all()
    keep = torch.ones(37, dtype=torch.bool)
    keep[3] = False
    _check(out[:, :, keep], ref[:, :, keep], torch.float32)


# (kernel, dtype, heads, kv heads, qL, N keys, head dim, causal)
VECTOR_CASES = [
    (sdpa_vector, torch.float32, 4, 2, 1, 77, 64, False),  # GQA 2, N not a multiple of the 32 simdgroups
    (sdpa_vector, torch.float16, 4, 1, 3, 45, 128, True),  # 3 queries, causal: the last sees all keys
    (sdpa_vector_2pass, torch.float32, 4, 2, 1, 300, 64, False),  # 32 blocks (gqa * qL < 4)
    (sdpa_vector_2pass, torch.bfloat16, 8, 2, 2, 333, 128, True),  # 64 blocks, TK prefetch and the tail loop
]


@pytest.mark.parametrize("kernel,dtype,H,Hkv,qL,N,D,causal", VECTOR_CASES, ids=lambda x: getattr(x, "__name__", None))
def test_sdpa_vector(mlx_include, kernel, dtype, H, Hkv, qL, N, D, causal):
    q, k, v = _qkv(dtype, 2, H, Hkv, qL, N, D)
    scale = D**-0.5
    out = kernel(q, k, v, scale=scale, include=mlx_include, causal=causal).run()
    _check(out, reference_attention(q, k, v, scale=scale, causal=causal), dtype)


def test_sdpa_vector_masks_and_sinks(mlx_include):
    q, k, v = _qkv(torch.float16, 1, 4, 2, 1, 70, 64, seed=6)
    bool_mask = torch.rand(1, 4, 1, 70, generator=torch.Generator().manual_seed(7)) > 0.5
    out = sdpa_vector(q, k, v, scale=0.125, include=mlx_include, mask=bool_mask).run()
    _check(out, reference_attention(q, k, v, scale=0.125, mask=bool_mask), torch.float16)
    float_mask = torch.randn(1, 1, 1, 70, generator=torch.Generator().manual_seed(8)).half()  # broadcast over heads
    sinks = torch.tensor([0.0, 1.0, -2.0, 3.0]).half()
    out = sdpa_vector_2pass(q, k, v, scale=0.125, include=mlx_include, mask=float_mask, sinks=sinks).run()
    _check(out, reference_attention(q, k, v, scale=0.125, mask=float_mask, sinks=sinks), torch.float16)


def test_attention_kernels_pass_the_race_check(mlx_include):
    q, k, v = _qkv(torch.float32, 1, 2, 2, 37, 53, 64)
    launch = steel_attention(q, k, v, scale=0.125, include=mlx_include, causal=True)
    _check(launch.racecheck(seeds=(0, 1)), reference_attention(q, k, v, scale=0.125, causal=True), torch.float32)
    counts = launch.counters()
    # 2 x 2 threadgroups (query blocks x heads) of 4 simdgroups, both key blocks each (causal, qL_off 16)
    groups, simdgroups, key_blocks = 4, 4, 2
    assert counts["threadgroup_barriers"] == groups * (2 + 4 * key_blocks)  # 4 per key block, 1 before, 1 after
    # per key block and simdgroup: S = Q K^T (8 head-dim x 4 key fragments) and O += S V (8 x 4)
    assert counts["simdgroup_multiply_accumulate_8x8x8"] == groups * simdgroups * key_blocks * (32 + 32)
    assert counts["simdgroup_barriers"] == groups * simdgroups * key_blocks * 8 * 2  # two around each Q/K fragment load
    q, k, v = _qkv(torch.float32, 1, 4, 2, 1, 77, 64)
    decode = sdpa_vector(q, k, v, scale=0.125, include=mlx_include)
    _check(decode.racecheck(seeds=(0, 1)), reference_attention(q, k, v, scale=0.125), torch.float32)
