"""What attention users pass, in the emulator against torch on CPU: a (seq_len, seq_len_kv) mask
(additive or boolean, torch's `attn_mask`), attention sinks (one logit per head, in the denominator
only), seq_len_kv != seq_len with the causal mask aligned to the end of the keys, GQA; the same mask
and sinks in flash decoding. Fully masked rows and -inf scores give torch's 0.

Few compiles: each kernel covers several features and several lengths (a runtime query count).
"""

import functools
import math

import pytest
import tilelang
import torch
import torch.nn.functional as F

from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.kernels import flash_attention_forward, metal4_target
from tilelang_metal.kernels.attention import flash_decoding_program

TORCH = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}
TOLERANCE = {"float16": 4e-3, "bfloat16": 2e-2, "float32": 1e-4}


def _target(name):
    return metal4_target() if name == "metal4" else "metal"


def reference(q, k, v, keep, additive, sinks):
    """softmax(q k^T / sqrt(d) + additive, keys where `keep`) v per head, q: (b, h, n, d), k, v
    (b, kv_h, nk, d); keep / additive: (n, nk) or None. With `sinks` (h,): the softmax runs over
    [scores, sink] and the sink column is dropped; without, torch's sdpa itself."""
    group = q.shape[1] // k.shape[1]
    q, k, v = q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1)
    bias = torch.zeros(q.shape[2], k.shape[2]) if additive is None else additive.float()
    if keep is not None:
        bias = bias.masked_fill(~keep, -math.inf)
    if sinks is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]) + bias
    sink = sinks.float()[None, :, None, None].expand(*scores.shape[:-1], 1)
    weights = torch.softmax(torch.cat([scores, sink], -1), -1)[..., :-1]
    return weights @ v


def causal_keep(n, nk):
    """Query i sees keys up to i + nk - n: the causal mask aligned to the end of the keys."""
    return torch.arange(nk)[None, :] <= torch.arange(n)[:, None] + (nk - n)


# ----------------------------------------------------------------------------- forward

# name: (target, dtype, heads, kv_heads, seq_len_kv, dim, causal, mask, sinks, layout, block_m, block_n, threads)
FORWARD = {
    # staged; runtime query count against 33 keys, causal aligned to the end, additive mask, sinks in fp16
    "staged-additive-sinks": ("metal", "float16", 2, 2, 33, 32, True, "additive", True, "bshd", 32, 32, 64),
    # direct; GQA, bhsd, more keys than queries, boolean mask, float32 sinks
    "direct-bool-sinks32": ("metal4", "bfloat16", 2, 1, 40, 32, False, "bool", "float32", "bhsd", 32, 32, 64),
    "staged-fp32-bool-causal": ("metal", "float32", 2, 1, 24, 32, True, "bool", False, "bshd", 32, 32, 64),
    "direct-fp16-sinks-causal": ("metal4", "float16", 2, 2, 33, 32, True, None, True, "bshd", 32, 32, 64),
}


@functools.lru_cache(maxsize=None)
def forward_kernel(name):
    target, dtype, heads, kv_heads, seq_kv, dim, causal, mask, sinks, layout, block_m, block_n, threads = FORWARD[name]
    return flash_attention_forward(1, heads, None, dim, causal=causal, dtype=dtype, block_m=block_m, block_n=block_n, threads=threads,
                                   target=_target(target), execution_backend="emulator", kv_heads=kv_heads, seq_len_kv=seq_kv, mask=mask,
                                   sinks=sinks, layout=layout)


def forward_inputs(name, n, seed):
    """q, k, v, the kernel's arguments, and (keep, additive, sinks) for the reference. Mask row 2 keeps
    no key (bool) or is all -inf (additive); row 3 is -inf from key 5 on."""
    target, dtype, heads, kv_heads, seq_kv, dim, causal, mask, sinks, layout, *_ = FORWARD[name]
    g = torch.Generator().manual_seed(seed)
    to = TORCH[dtype]
    q = torch.randn(1, heads, n, dim, generator=g).to(to)
    k, v = (torch.randn(1, kv_heads, seq_kv, dim, generator=g).to(to) for _ in range(2))
    keep = causal_keep(n, seq_kv) if causal else None
    additive = sink_values = None
    extra = []
    if mask == "bool":
        kept = torch.rand(n, seq_kv, generator=g) < 0.7
        kept[2 % n] = False
        extra.append(kept)
        keep = kept if keep is None else keep & kept
    elif mask == "additive":
        additive = torch.randn(n, seq_kv, generator=g).to(to)
        additive[2 % n] = -math.inf
        additive[3 % n, 5:] = -math.inf
        extra.append(additive)
    if sinks:
        sink_values = (torch.randn(heads, generator=g) * 2).to(torch.float32 if sinks == "float32" else to)
        extra.append(sink_values)
    as_layout = (lambda x: x.transpose(1, 2).contiguous()) if layout == "bshd" else (lambda x: x)
    return [as_layout(q), as_layout(k), as_layout(v), *extra], (q, k, v, keep, additive, sink_values), as_layout


def run_forward(name, lengths, check=None):
    kernel = forward_kernel(name)
    dtype = FORWARD[name][1]
    for n in lengths:
        args, (q, k, v, keep, additive, sinks), as_layout = forward_inputs(name, n, seed=n)
        out = kernel(*args) if check is None else check(kernel, *args)
        want = as_layout(reference(q, k, v, keep, additive, sinks))
        assert torch.isfinite(want).all()
        torch.testing.assert_close(out.float(), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype], msg=lambda m: f"{name} n={n}: {m}")


# query counts against the kernel's seq_len_kv: 1, odd, fewer and more queries than keys (with more,
# the first queries of a causal kernel see no key at all: rows of 0, as torch gives)
@pytest.mark.parametrize("name,lengths", [
    ("staged-additive-sinks", (1, 7, 33, 40)),
    ("direct-bool-sinks32", (7, 33)),
    pytest.param("staged-fp32-bool-causal", (1, 7, 33), marks=pytest.mark.slow),
    pytest.param("direct-fp16-sinks-causal", (7, 40), marks=pytest.mark.slow),
])
def test_forward_mask_sinks_and_key_count_match_torch(name, lengths):
    run_forward(name, lengths)


def test_forward_new_inputs_under_racecheck():
    """The staged kernel (threadgroup K / V tiles, barriers) with a mask and sinks: race-free."""
    run_forward("staged-additive-sinks", (33,), check=racecheck)


def test_causal_aligns_to_the_end_and_rows_without_keys_are_zero():
    """40 queries on 33 keys, end-aligned causal: queries 0-6 see no key (torch's is_causal, aligned
    to the start, would let query 0 see key 0) and the last query sees all 33. A row without keys is
    0, as torch gives, with sinks too (the sink takes the whole weight and has no value)."""
    args, _, _ = forward_inputs("staged-additive-sinks", 40, seed=40)
    args[3] = torch.zeros_like(args[3])  # the additive mask adds nothing: only causality masks
    out = forward_kernel("staged-additive-sinks")(*args).float()
    q, k, v = (x.transpose(1, 2) for x in args[:3])
    want = reference(q, k, v, causal_keep(40, 33), None, args[4]).transpose(1, 2)
    assert (out[:, :7] == 0).all() and (out[:, 7:].abs().sum(-1) > 0).all()
    torch.testing.assert_close(out, want, atol=4e-3, rtol=4e-3)


@functools.lru_cache(maxsize=None)
def masked_d64_kernel(mask):
    """metal4 (direct dataflow), head_dim 64, 2 heads, 64 queries and keys, not causal."""
    return flash_attention_forward(1, 2, 64, 64, dtype="float16", target=metal4_target(), execution_backend="emulator", mask=mask)


def test_boolean_mask_is_read_once_per_element():
    """Issue 35: the softmax step asked the boolean mask in both of its loops, so each mask byte
    was read twice (the bool kernel read as many device bytes as the additive one, whose mask is
    2 bytes an element). Apart from the mask both kernels read the same, so the additive kernel
    reads one byte more per (query, key) element and head; the bool kernel makes no more device
    transactions than it. Both still match torch, with a row that keeps no key."""
    g = torch.Generator().manual_seed(35)
    q, k, v = (torch.randn(1, 64, 2, 64, generator=g).half() for _ in range(3))
    keep = torch.rand(64, 64, generator=g) < 0.7
    keep[5] = False
    additive = torch.randn(64, 64, generator=g).half().masked_fill(~keep, -math.inf)
    stats = {}
    for mask, tensor in (("bool", keep), ("additive", additive)):
        kernel = masked_d64_kernel(mask)
        want = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), keep if mask == "bool" else None,
                         additive if mask == "additive" else None, None).transpose(1, 2)
        torch.testing.assert_close(kernel(q, k, v, tensor).float(), want, atol=4e-3, rtol=4e-3, msg=lambda m: f"{mask}: {m}")
        stats[mask] = counters(kernel, q, k, v, tensor).total
    elements = 2 * 64 * 64  # heads x queries x keys
    assert stats["additive"]["device_load_bytes"] - stats["bool"]["device_load_bytes"] == elements
    assert stats["bool"]["device_transactions"] <= stats["additive"]["device_transactions"]


@pytest.mark.slow
def test_boolean_mask_mark_is_apart_from_the_lowest_score():
    """A boolean mask marks masked keys' scores with MASKED_SCORE, float32's lowest value; a row
    whose visible scores are all exactly that value (q.k = -FLT_MAX) is still the average of its
    visible keys' V, as in torch, not 0 (kernels/attention_masks.py: such a score moves one float
    up); a row of scores below -1e38 likewise."""
    n, nk, lowest = 7, 24, torch.finfo(torch.float32).min
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 2, n, 32, generator=g), torch.randn(1, 1, nk, 32, generator=g), torch.randn(1, 1, nk, 32, generator=g)
    k[..., 0] = 1.0
    q[0, 0, 3] = 0
    q[0, 0, 3, 0] = lowest  # every score of (row 3, head 0) is exactly the lowest float32
    q[0, 1, 4, :2] = -1e38  # (row 4, head 1): scores below -1e38
    keep = torch.rand(n, nk, generator=g) < 0.7
    keep[2] = False
    out = forward_kernel("staged-fp32-bool-causal")(*(x.transpose(1, 2).contiguous() for x in (q, k, v)), keep)
    want = reference(q, k, v, keep & causal_keep(n, nk), None, None).transpose(1, 2)
    assert torch.isfinite(want).all() and (want[0, 3, 0] != 0).any()
    torch.testing.assert_close(out, want, atol=1e-4, rtol=1e-4)

# ----------------------------------------------------------------------------- decoding

# name: (target, dataflow, dtype, heads, kv_heads, seq_len_kv, dim, num_split, mask, sinks)
DECODING = {
    "vector-fp32-bool-sinks32": ("metal", "vector", "float32", 4, 2, 33, 32, 3, "bool", "float32"),
    "staged-fp16-additive-sinks": ("metal", "staged", "float16", 4, 2, 33, 32, 3, "additive", True),
    "direct-bf16-bool": ("metal4", "direct", "bfloat16", 4, 1, 20, 32, 3, "bool", False),
    "vector-bf16-additive": ("metal", "vector", "bfloat16", 4, 4, 7, 32, 2, "additive", False),
}


@functools.lru_cache(maxsize=None)
def decoding_kernel(name):
    target, dataflow, dtype, heads, kv_heads, seq_kv, dim, num_split, mask, sinks = DECODING[name]
    program = flash_decoding_program(1, heads, kv_heads, seq_kv, dim, num_split=num_split, mask=mask, sinks=sinks, dtype=dtype, block_h=16,
                                     block_n=32, threads=64, target=_target(target), dataflow=dataflow)
    inputs = 3 + (mask is not None) + bool(sinks)
    return tilelang.compile(program, out_idx=[inputs, inputs + 1, inputs + 2], target=_target(target), execution_backend="emulator")


def run_decoding(name, check=None):
    target, dataflow, dtype, heads, kv_heads, seq_kv, dim, num_split, mask, sinks = DECODING[name]
    g = torch.Generator().manual_seed(seq_kv)
    to = TORCH[dtype]
    q = torch.randn(1, heads, dim, generator=g).to(to)
    k, v = (torch.randn(1, seq_kv, kv_heads, dim, generator=g).to(to) for _ in range(2))
    args, keep, additive, sink_values = [q, k, v], None, None, None
    split_len = -(-seq_kv // num_split)
    if mask == "bool":  # the second split sees no key
        keep = torch.rand(1, seq_kv, generator=g) < 0.6
        keep[0, split_len : 2 * split_len] = False
        args.append(keep)
    elif mask == "additive":
        additive = torch.randn(1, seq_kv, generator=g).to(to)
        additive[0, split_len : 2 * split_len] = -math.inf
        args.append(additive)
    if sinks:
        sink_values = (torch.randn(heads, generator=g) * 2).to(torch.float32 if sinks == "float32" else to)
        args.append(sink_values)
    kernel = decoding_kernel(name)
    *_, out = kernel(*args) if check is None else check(kernel, *args)
    want = reference(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), keep, additive, sink_values)[:, :, 0]
    torch.testing.assert_close(out.float(), want, atol=TOLERANCE[dtype], rtol=TOLERANCE[dtype])
    return args


@pytest.mark.parametrize("name", ["vector-fp32-bool-sinks32", "staged-fp16-additive-sinks",
                                  pytest.param("direct-bf16-bool", marks=pytest.mark.slow),
                                  pytest.param("vector-bf16-additive", marks=pytest.mark.slow)])
def test_decoding_mask_and_sinks_match_torch(name):
    run_decoding(name)


def test_decoding_new_inputs_under_racecheck():
    run_decoding("staged-fp16-additive-sinks", check=racecheck)


def test_decoding_fully_masked_row_is_zero():
    """Every key masked: torch gives 0; with sinks too (the sink takes the whole weight, value 0)."""
    kernel = decoding_kernel("vector-fp32-bool-sinks32")
    q, k, v = torch.randn(1, 4, 32), torch.randn(1, 33, 2, 32), torch.randn(1, 33, 2, 32)
    keep = torch.zeros(1, 33, dtype=torch.bool)
    *_, out = kernel(q, k, v, keep, torch.randn(4))
    want = F.scaled_dot_product_attention(q[:, :, None], k.transpose(1, 2).repeat_interleave(2, 1), v.transpose(1, 2).repeat_interleave(2, 1),
                                          attn_mask=keep)[:, :, 0]
    assert (want == 0).all()
    torch.testing.assert_close(out, want)


def test_decoding_vector_reads_the_boolean_mask_once():
    """The vector dataflow read the boolean mask twice per key and lane (to mask the score, then
    the weight); fp32 q, K, V: the mask's bytes are the only narrow loads, one per key and lane."""
    args = run_decoding("vector-fp32-bool-sinks32")
    _, _, _, heads, _, seq_kv, *_ = DECODING["vector-fp32-bool-sinks32"]
    stats = counters(decoding_kernel("vector-fp32-bool-sinks32"), *args).total
    assert stats["narrow_device_loads"] == heads * 32 * seq_kv  # a simdgroup of 32 lanes per query head

# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("build,message", [
    (lambda: flash_decoding_program(1, 4, 2, 64, 64, mask="causal"),
     r"^flash_decoding_program mask='causal' is not supported; use one of None, 'additive', 'bool'$"),
    (lambda: flash_decoding_program(1, 4, 2, 64, 64, sinks="float16"),
     r"^flash_decoding_program sinks='float16' is not supported; use one of False, True, 'float32'$"),
])
def test_new_arguments_are_refused_in_one_line(build, message):
    with pytest.raises(ValueError, match=message):
        build()


@pytest.mark.slow
def test_guide_attention_inputs_snippet():
    """The mask / sinks example of docs/guide.md runs as written."""
    import pathlib
    import re

    guide = (pathlib.Path(__file__).parents[2] / "docs" / "guide.md").read_text()
    marker = "<!-- tested: tests/numerics/test_attention_inputs.py::test_guide_attention_inputs_snippet -->"
    block = re.search(re.escape(marker) + r"\s*```python\n(.*?)```", guide, re.S)
    assert block, "the guide's attention inputs snippet is missing"
    exec(compile(block.group(1), "docs/guide.md", "exec"), {})
