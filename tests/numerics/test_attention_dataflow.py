"""Where attention's K and V go (tilelang_metal/kernels/attention.py, "Two dataflows").

- metal4, "direct": Q, K and V from device memory into the cooperative-tensor GEMMs. Numerics against
  torch's SDPA under the race checker (ragged lengths, causal and not, head_dim 64 and 128 with
  block_n 64, fp16 and bf16, GQA); counters that show no threadgroup traffic, no barrier, and every
  simdgroup reading each K / V block exactly once; flash decoding the same way.
- plain metal, "staged": K and V rows padded in threadgroup memory, K^T by transposed simdgroup_load.

Kernels are compiled once per configuration (lru_cache); most configurations are in the slow tier.
"""

import functools

import pytest
import tilelang
import torch
import torch.nn.functional as F

from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.errors import MetalLoweringError
from tilelang_metal.kernels import metal4_target, plain_metal_target
from tilelang_metal.kernels.attention import flash_attention_program, flash_decoding_program
from tilelang_metal.kernels.attention_config import DIRECT, STAGED, attention_dataflow, staged_row_pad

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TARGETS = {"metal4": metal4_target, "metal": plain_metal_target}


@functools.lru_cache(maxsize=None)
def forward(target, heads, kv_heads, seq, dim, causal, dtype="float16", layout="bshd", block_m=64, block_n=64, threads=128):
    tgt = TARGETS[target]()
    program = flash_attention_program(1, heads, seq, dim, causal=causal, kv_heads=kv_heads, layout=layout, dtype=dtype,
                                      block_m=block_m, block_n=block_n, threads=threads, target=tgt)
    return tilelang.compile(program, out_idx=[3], target=tgt, execution_backend="emulator")


def inputs(heads, kv_heads, seq, dim, dtype, layout, seed):
    g = torch.Generator().manual_seed(seed)

    def shape(h):
        return (1, seq, h, dim) if layout == "bshd" else (1, h, seq, dim)

    return (torch.randn(shape(heads), generator=g).to(TORCH[dtype]),
            *(torch.randn(shape(kv_heads), generator=g).to(TORCH[dtype]) for _ in range(2)))


def sdpa(q, k, v, causal, layout):
    if layout == "bshd":
        q, k, v = (x.transpose(1, 2) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    out = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
    return out.transpose(1, 2) if layout == "bshd" else out


def check_forward(target, heads, kv_heads, seq, dim, causal, dtype="float16", layout="bshd", block_m=64, block_n=64, threads=128):
    kernel = forward(target, heads, kv_heads, seq, dim, causal, dtype, layout, block_m, block_n, threads)
    q, k, v = inputs(heads, kv_heads, seq, dim, dtype, layout, seed=seq * 31 + dim)
    out = racecheck(kernel, q, k, v)
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    torch.testing.assert_close(out.float(), sdpa(q, k, v, causal, layout), atol=tol, rtol=tol)
    return kernel


# target, heads, kv_heads, seq, dim, causal, dtype, layout, block_m, block_n, threads
QUICK = [
    # 65 = one key block plus one key: the second block is 1 real key and 63 zero-filled, masked ones
    ("metal4", 2, 2, 65, 64, True, "float16", "bshd", 64, 64, 128),
]
SLOW = [
    ("metal4", 2, 2, 65, 64, False, "float16", "bshd", 64, 64, 128),
    ("metal4", 2, 2, 128, 64, False, "bfloat16", "bshd", 64, 64, 128),
    ("metal4", 2, 2, 65, 128, False, "float16", "bshd", 64, 64, 128),  # head_dim 128 with block_n 64
    ("metal4", 2, 2, 128, 128, True, "bfloat16", "bhsd", 64, 64, 128),
    ("metal4", 4, 2, 77, 64, True, "float16", "bhsd", 64, 64, 128),  # GQA: 2 query heads per KV head
    ("metal", 2, 2, 65, 64, True, "float16", "bshd", 64, 64, 128),  # staged, padded rows
    ("metal", 2, 1, 65, 128, False, "bfloat16", "bshd", 64, 64, 128),  # staged d128 block_n 64: unpadded, 32 KiB
]


@pytest.mark.parametrize("config", QUICK + [pytest.param(c, marks=pytest.mark.slow) for c in SLOW], ids=str)
def test_attention_matches_sdpa_under_racecheck(config):
    check_forward(*config)


@pytest.mark.slow
def test_direct_runtime_length_bshd_gqa():
    """A runtime sequence length through the strided bshd views (their strides hold the length):
    one kernel, lengths 1 (one key, 63 masked), 64 (one whole block) and 100."""
    kernel = forward("metal4", 4, 2, None, 64, True)
    for seq in (1, 64, 100):
        q, k, v = inputs(4, 2, seq, 64, "float16", "bshd", seed=seq)
        out = racecheck(kernel, q, k, v)
        torch.testing.assert_close(out.float(), sdpa(q, k, v, True, "bshd"), atol=4e-3, rtol=4e-3)


def test_dataflow_follows_the_target():
    assert attention_dataflow(metal4_target()) == DIRECT
    assert attention_dataflow(plain_metal_target()) == STAGED
    with pytest.raises(MetalLoweringError, match="dataflow='shared' is not an attention dataflow"):
        flash_attention_program(1, 1, 64, 64, dataflow="shared")


def test_direct_attention_reads_device_memory_only():
    """metal4, seq 65 (2 key blocks, the second ragged), causal: no threadgroup buffer, load, store or
    barrier; the device bytes are Q once plus, for every simdgroup, each real K and V row of every key
    block it visits (zero-filled rows past the end are not read)."""
    heads, seq, dim, block = 2, 65, 64, 64
    kernel = forward("metal4", heads, heads, seq, dim, True)
    source = kernel.get_kernel_source()
    assert "matmul2d" in source and "threadgroup_barrier" not in source and "threadgroup half" not in source
    q, k, v = inputs(heads, heads, seq, dim, "float16", "bshd", seed=1)
    total = counters(kernel, q, k, v).total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == 0
    assert total["threadgroup_barriers"] == 0
    simdgroups, elem = 4, 2
    # causal: query block 0 (rows 0-63) visits key block 0; query block 1 (row 64) visits blocks 0 and 1 (1 real key)
    keys_read = (block) + (block + 1)
    want = heads * (seq * dim * elem + simdgroups * 2 * keys_read * dim * elem)
    assert total["device_load_bytes"] == want


def test_direct_head_dim_128_block_n_64_builds_without_threadgroup_memory():
    """The staged dataflow would need 2 x 64 x 128 x 2 B of K and V (and, before, 16 KiB more for Q);
    the direct one declares no threadgroup memory at all."""
    program = flash_attention_program(1, 1, 256, 128, block_m=64, block_n=64, target=metal4_target())
    source = tilelang.lower(program, target=metal4_target()).kernel_source
    assert "threadgroup " not in source.replace("threadgroup_position_in_grid", "")


@pytest.mark.slow
def test_staged_rows_are_padded_and_k_is_loaded_transposed():
    """plain metal: K and V rows padded by 16 bytes (72 halves at head_dim 64), K^T by a transposed
    simdgroup_load of the padded rows; Q is read once into registers (no Q buffer)."""
    assert staged_row_pad(64, 64, "float16") == 8 and staged_row_pad(128, 64, "float16") == 0  # 2 x 64 x 136 x 2 B > 32 KiB
    kernel = forward("metal", 2, 2, 65, 64, True)
    source = kernel.get_kernel_source()
    assert "buf_dyn_shmem[18432]" in source  # K and V: 2 x 64 x 72 halves, nothing for Q
    k_loads = [line for line in source.splitlines() if "simdgroup_load" in line and "K_shared" in line]
    assert k_loads and all(", 72, ulong2(0, 0), true)" in line for line in k_loads)


@pytest.mark.slow
@pytest.mark.parametrize("num_stages, per_block", [(0, 2), (1, 4)])
def test_staged_barriers_per_key_block(num_stages, per_block):
    """plain metal, barriers per key block from two lengths (2 and 3 key blocks, non-causal): K and V
    are copied together, so one barrier publishes both and one guards their reuse; num_stages=1
    (the default) prefetches the next K during the softmax and the next V after P . V, at two
    barriers more."""
    def barriers(seq):
        tgt = plain_metal_target()
        # 64x64 blocks given (the defaults follow the register budget: 64x32 at head_dim 64)
        program = flash_attention_program(1, 1, seq, 64, target=tgt, num_stages=num_stages, block_m=64, block_n=64)
        kernel = tilelang.compile(program, out_idx=[3], target=tgt, execution_backend="emulator")
        q, k, v = inputs(1, 1, seq, 64, "float16", "bshd", seed=seq)
        total = counters(kernel, q, k, v).total
        assert total["threadgroup_store_bytes"] == seq // 64 * 2 * seq * 64 * 2  # K and V once per query block
        return total["threadgroup_barriers"] / (seq // 64)  # per query block

    assert barriers(192) - barriers(128) == per_block


# ----------------------------------------------------------------------------- flash decoding


@functools.lru_cache(maxsize=None)
def decoding(target, heads, kv_heads, seq, dim, num_split, block_h, block_n, threads, dtype="float16"):
    tgt = TARGETS[target]()
    program = flash_decoding_program(1, heads, kv_heads, seq, dim, num_split=num_split, block_h=block_h, block_n=block_n,
                                     threads=threads, dtype=dtype, target=tgt, dataflow=attention_dataflow(tgt))
    return tilelang.compile(program, out_idx=[3, 4, 5], target=tgt, execution_backend="emulator")


@pytest.mark.parametrize("dtype", ["float16", pytest.param("bfloat16", marks=pytest.mark.slow)])
def test_direct_decoding_matches_torch_without_threadgroup_memory(dtype):
    """metal4 decoding, 8 query heads on 2 KV heads, 77 keys in 3 splits of 26 (block_n 32: every
    split's block reaches into the next split's keys, which are masked; the last past the cache)."""
    heads, kv_heads, seq, dim = 8, 2, 77, 64
    kernel = decoding("metal4", heads, kv_heads, seq, dim, 3, 16, 32, 64, dtype)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, heads, dim, generator=g).to(TORCH[dtype])
    k, v = (torch.randn(1, seq, kv_heads, dim, generator=g).to(TORCH[dtype]) for _ in range(2))
    out = racecheck(kernel, q, k, v)[-1]
    want = sdpa(q[:, None], k, v, False, "bshd")[:, 0]  # one query position: (1, heads, dim)
    tol = 2e-2 if dtype == "bfloat16" else 4e-3
    torch.testing.assert_close(out.float(), want, atol=tol, rtol=tol)
    total = counters(kernel, q, k, v).total
    assert total["threadgroup_load_bytes"] == total["threadgroup_store_bytes"] == total["threadgroup_barriers"] == 0


def test_causal_staged_attention_with_one_or_two_key_blocks_per_query_block():
    """block_m < block_n, 100 tokens: query blocks 0 and 1 own one key block, 2 and 3 two; the
    pipelined key loop's body ran once where it should not run (rows before 64 saw keys 64 and up
    under block 0's mask: 2.5 off). Found by an adversarial hunt; fixed by GuardPossiblyEmptyPipelineLoops."""
    from tilelang_metal import kernels

    seq, dim = 100, 64
    kernel = kernels.flash_attention_forward(1, 2, seq, dim, causal=True, block_m=32, block_n=64, execution_backend="emulator")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, seq, 2, dim, generator=g).half() for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(*(t.float().transpose(1, 2) for t in (q, k, v)), is_causal=True).transpose(1, 2)
    torch.testing.assert_close(kernel(q, k, v).float(), ref, atol=4e-3, rtol=4e-3)
