"""The attention kernels' default block sizes fit the register budget (kernels/attention.py,
`attention_blocks`; register_budget.py, `attention_registers`), and the kernels they make match torch.

- every default (metal4 / plain metal, head_dim 64 / 128 / 256, causal or not, with or without a
  mask and sinks; decoding's GEMM dataflows) has a register estimate within REGISTER_BUDGET;
- the lowered kernels' own estimate (kernel_registers of the artifact record) is that estimate and
  within the budget: one forward kernel per target and head_dim (causal, additive mask, sinks, a
  runtime query count against 67 keys: the heaviest variant), decoding's kernels;
- those same kernels against torch at query counts 1, 7 (odd, fewer than the keys) and 70 (more:
  the first three see no key), under the race checker.

One compile per kernel (lru_cache), shared by the register and the numerics checks; plain metal's
head_dim 128 forward kernel (over the budget before, and the one with barriers) and the vector
decoding kernels in the quick tier, the other lowered kernels (~10 s of CPU each) in the slow one.
"""

import functools
import itertools

import pytest
import tilelang
import torch

from tilelang_metal.codegen.artifact import artifact_of
from tilelang_metal.emulator import counters, racecheck
from tilelang_metal.kernels import flash_attention_forward, metal4_target, plain_metal_target
from tilelang_metal.kernels.attention import flash_decoding_program
from tilelang_metal.kernels.attention_config import DIRECT, STAGED
from tilelang_metal.performance.register_budget import REGISTER_BUDGET, kernel_occupancy, kernel_registers

from test_attention_inputs import causal_keep, reference

TARGETS = {"metal4": metal4_target, "metal": plain_metal_target}
DATAFLOW = {"metal4": DIRECT, "metal": STAGED}
HEAD_DIMS = (64, 128, 256)
SEQ_KV = 67  # odd, more than one key block of every default block_n
HEADS = 2


def test_every_default_fits_the_register_budget_by_the_model():
    """No lowering: the estimate of the configuration the kernels would pick."""
    from tilelang_metal.kernels.attention_config import DECODING_BLOCK_N_CHOICES, DECODING_THREAD_CHOICES, attention_blocks

    over = []
    for target, head_dim, causal, mask, sinks in itertools.product(TARGETS, HEAD_DIMS, (False, True), (None, "additive", "bool"),
                                                                    (False, True)):
        blocks = attention_blocks(head_dim, dataflow=DATAFLOW[target], row_bounds=causal or mask is not None,
                                  inputs=4 + (mask is not None) + sinks)
        if blocks.registers.total > REGISTER_BUDGET.registers:
            over.append(f"forward {target} d{head_dim} causal={causal} mask={mask} sinks={sinks}: {blocks.describe()}")
    for target, head_dim, mask in itertools.product(TARGETS, HEAD_DIMS, (None, "bool")):
        blocks = attention_blocks(head_dim, dataflow=DATAFLOW[target], inputs=5 + (mask is not None), block_m=16,
                                  block_n_choices=DECODING_BLOCK_N_CHOICES, thread_choices=DECODING_THREAD_CHOICES)
        if blocks.registers.total > REGISTER_BUDGET.registers:
            over.append(f"decoding {target} d{head_dim} mask={mask}: {blocks.describe()}")
    assert not over, "\n".join(over)


@functools.lru_cache(maxsize=None)
def forward_kernel(target, head_dim):
    """flash_attention_forward with no block sizes given: the defaults."""
    return flash_attention_forward(1, HEADS, None, head_dim, causal=True, seq_len_kv=SEQ_KV, mask="additive", sinks=True,
                                   target=TARGETS[target](), execution_backend="emulator")


def registers_of(kernel):
    return [kernel_registers(record) for record in artifact_of(kernel.get_kernel_source()).kernels]


def forward_params(head_dims):
    return [pytest.param(t, d, id=f"{t}-d{d}", marks=() if (t, d) == ("metal", 128) else pytest.mark.slow)
            for t, d in itertools.product(TARGETS, head_dims)]


@pytest.mark.parametrize("target,head_dim", forward_params(HEAD_DIMS))
def test_default_forward_kernel_fits_the_budget_and_matches_torch(target, head_dim):
    kernel = forward_kernel(target, head_dim)
    (regs,) = registers_of(kernel)
    assert regs.total <= REGISTER_BUDGET.registers, f"{target} d{head_dim} default: {regs.describe()}"
    from tilelang_metal.kernels.attention_config import attention_blocks

    model = attention_blocks(head_dim, dataflow=DATAFLOW[target], row_bounds=True, inputs=6)
    assert regs.total == model.registers.total, f"record {regs.describe()}; model {model.describe()}"

    for n in (1, 7, 70):
        g = torch.Generator().manual_seed(n + head_dim)
        q = torch.randn(1, HEADS, n, head_dim, generator=g).half()
        k, v = (torch.randn(1, HEADS, SEQ_KV, head_dim, generator=g).half() for _ in range(2))
        additive = torch.randn(n, SEQ_KV, generator=g).half()
        sinks = (torch.randn(HEADS, generator=g) * 2).half()
        args = [x.transpose(1, 2).contiguous() for x in (q, k, v)] + [additive, sinks]
        out = racecheck(kernel, *args, seeds=(0, 1))  # one build (the race-checking one) for every length
        want = reference(q, k, v, causal_keep(n, SEQ_KV), additive, sinks).transpose(1, 2)
        torch.testing.assert_close(out.float(), want, atol=4e-3, rtol=4e-3, msg=lambda m: f"{target} d{head_dim} n={n}: {m}")


@pytest.mark.parametrize("target,head_dim", [p for p in forward_params((64, 128)) if p.values[0] == "metal"])
def test_default_staged_forward_has_no_bank_replays(target, head_dim):
    """plain metal's K and V rows padded to an odd multiple of 16 bytes in the default blocks: no
    threadgroup bank replays (MLX's steel attention has some), and the tiles leave room for more than
    one threadgroup per core. Before, head_dim 128 took 32x64 with dense 256-byte rows (padded they
    would not fit 32 KiB): 26624 replays here, 1 threadgroup per core."""
    kernel = forward_kernel(target, head_dim)
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 7, HEADS, head_dim, generator=g).half()
    k, v = (torch.randn(1, SEQ_KV, HEADS, head_dim, generator=g).half() for _ in range(2))
    args = (q, k, v, torch.randn(7, SEQ_KV, generator=g).half(), torch.randn(HEADS, generator=g).half())
    total = counters(kernel, *args).total
    (record,) = artifact_of(kernel.get_kernel_source()).kernels
    _, occupancy = kernel_occupancy(record)
    assert (total["threadgroup_replays"], occupancy.threadgroups > 1) == (0, True), (total["threadgroup_replays"], occupancy)


# 2 ranges of 128 keys: 4 key blocks per range, as at a 4k context with the default 32 ranges (a
# shorter range unrolls its loop, which changes the lowered kernel)
DECODE_KV, DECODE_SPLITS = 256, 2


@functools.lru_cache(maxsize=None)
def decoding_kernel(target, head_dim, dataflow):
    program = flash_decoding_program(1, 8, 2, DECODE_KV, head_dim, num_split=DECODE_SPLITS, target=TARGETS[target](), dataflow=dataflow)
    return tilelang.compile(program, out_idx=[3, 4, 5], target=TARGETS[target](), execution_backend="emulator")


def decoding_params():
    params = [pytest.param("metal", d, None, id=f"vector-d{d}") for d in HEAD_DIMS]  # the default dataflow on both targets
    params.append(pytest.param("metal", 256, STAGED, id="staged-d256", marks=pytest.mark.slow))
    params.append(pytest.param("metal4", 256, DIRECT, id="direct-d256", marks=pytest.mark.slow))
    return params


@pytest.mark.parametrize("target,head_dim,dataflow", decoding_params())
def test_default_decoding_kernels_fit_the_budget_and_match_torch(target, head_dim, dataflow):
    """head_dim 256 on the GEMM dataflows splits head_dim over 2 of 4 simdgroups (128 threads)."""
    kernel = decoding_kernel(target, head_dim, dataflow)
    over = [r.describe() for r in registers_of(kernel) if r.total > REGISTER_BUDGET.registers]
    assert not over, f"decoding {target} d{head_dim} {dataflow}: {over}"
    if dataflow is None:
        return  # the vector dataflow's numerics: tests/numerics/test_decoding_vector.py
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 8, head_dim, generator=g).half()
    k, v = (torch.randn(1, DECODE_KV, 2, head_dim, generator=g).half() for _ in range(2))
    *_, out = racecheck(kernel, q, k, v, seeds=(0, 1))
    want = reference(q[:, :, None], k.transpose(1, 2), v.transpose(1, 2), None, None, None)[:, :, 0]
    torch.testing.assert_close(out.float(), want, atol=4e-3, rtol=4e-3)
