"""Configuration of the attention kernels (kernels/attention.py), decided before any program is built:
which dataflow a target takes (and decoding's vector dataflow), default key ranges of a decoding
step, the refusals of block sizes a kernel cannot run (named with what fits), and the default block
sizes chosen by the register estimate and threadgroup memory."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from ..errors import MetalLoweringError
from ..performance.register_budget import REGISTER_BUDGET, KernelRegisters, attention_registers
from ..target.capabilities import resolve_capabilities
from ..target.isa import SIMD_WIDTH
from ..target.limits import MAX_THREADS_PER_THREADGROUP as MAX_THREADS, THREADGROUP_MEMORY_BYTES
from .gemm import staged_row_pad as gemm_row_pad
from .sizes import integer_sizes

DIRECT, STAGED = "direct", "staged"
DATAFLOWS = (DIRECT, STAGED)
# Decoding only: one simdgroup per query head, each lane a run of head_dim / 32 elements of q, K and
# V, a simd sum per key (no matrix operation, no threadgroup memory, no barrier).
VECTOR = "vector"
DECODING_DATAFLOWS = (VECTOR, DIRECT, STAGED)


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2


def _multiples_near(value: int, step: int) -> str:
    below, above = value // step * step, -(-value // step) * step
    return " or ".join(str(v) for v in (below, above) if v > 0)


def attention_dataflow(target: Any = None) -> str:
    """DIRECT on a Metal 4 target (cooperative tensors read device memory directly), STAGED
    otherwise; `target` is what `tilelang.compile` gets (None or "metal": this host's Metal)."""
    return DIRECT if resolve_capabilities(target).metal4 else STAGED


def resolve_dataflow(dataflow: str | None, target: Any) -> str:
    if dataflow is None:
        return attention_dataflow(target)
    if dataflow not in DATAFLOWS:
        raise MetalLoweringError(f"dataflow={dataflow!r} is not an attention dataflow; use 'direct', 'staged' or None (the target's)")
    return dataflow


def decoding_dataflow(heads: int, kv_heads: int, head_dim: int, target: Any = None) -> str:
    """VECTOR where it applies (head_dim a multiple of 32, at most 32 query heads per KV head: one
    simdgroup each), on either target: a decoding step has one query row per head, which a matrix
    tile would pad to 8 or 16 rows. Otherwise the target's GEMM dataflow."""
    if heads > 0 and kv_heads > 0 and head_dim > 0 and not heads % kv_heads and vector_refusal(heads // kv_heads, head_dim) is None:
        return VECTOR
    return attention_dataflow(target)


# Key ranges of a decoding step when the caller gives none: one per KEYS_PER_SPLIT keys (at least one
# block_n of the GEMM dataflows), at most MAX_SPLITS. A heuristic, not measured on a Mac: MLX's
# sdpa_vector_2pass uses 32 or 64 ranges from about a thousand keys up; a fixed 4 left each
# simdgroup a quarter of the context to walk alone (1024 keys at 4k, 8192 at 32k).
KEYS_PER_SPLIT = 128
MAX_SPLITS = 64


def decoding_splits(seq_len_kv: int, block_n: int = 0) -> int:
    """How many key ranges `flash_decoding_program` splits `seq_len_kv` keys into by default."""
    return max(1, min(MAX_SPLITS, -(-seq_len_kv // max(KEYS_PER_SPLIT, block_n))))


def vector_refusal(group: int, head_dim: int) -> str | None:
    if head_dim % SIMD_WIDTH:
        return (f"head_dim={head_dim} is not a multiple of {SIMD_WIDTH}: the vector dataflow gives each of a simdgroup's 32 "
                f"lanes an equal run of it; use dataflow='staged' or 'direct', or head_dim={_multiples_near(head_dim, SIMD_WIDTH)}")
    if group * SIMD_WIDTH > MAX_THREADS:
        return (f"{group} query heads per KV head need {group * SIMD_WIDTH} threads in the vector dataflow (one simdgroup "
                f"each), over Metal's {MAX_THREADS}; use dataflow='staged' or 'direct'")
    return None


def staged_row_pad(head_dim: int, block_n: int, dtype: str) -> int:
    """Elements of padding per staged K / V row: what makes the row pitch an odd multiple of 16 bytes
    (kernels.gemm.staged_row_pad: the 8 rows of an 8x8 simdgroup_load, transposed for K^T or not,
    then start on 8 different banks), when both padded tiles fit in threadgroup memory, else 0
    (padding changes speed only, never results)."""
    pad = gemm_row_pad(head_dim, dtype)
    return pad if _staged_bytes(head_dim + pad, block_n, dtype) <= THREADGROUP_MEMORY_BYTES else 0


def _staged_bytes(row: int, block_n: int, dtype: str) -> int:
    """Threadgroup bytes of the staged K and V tiles, `block_n` rows of `row` elements each."""
    return 2 * block_n * row * _bytes(dtype)


def check_attention_config(
    head_dim: int, block_m: int, block_n: int, dtype: str, threads: int, *, rows_name: str = "block_m", dataflow: str = STAGED
) -> None:
    """Refuse, before lowering, a configuration the kernels cannot run, saying what fits: head_dim,
    block_n and the `rows_name` query rows must cover Metal's 8x8 matrix tiles whole (rows too few
    for every simdgroup are split over fewer and replicated: transform/fragment_groups.py), and on
    the STAGED dataflow the K and V tiles must fit Metal's threadgroup memory (DIRECT uses none)."""
    head_dim, block_m, block_n, threads = integer_sizes(
        "flash attention", error=MetalLoweringError, head_dim=head_dim, **{rows_name: block_m}, block_n=block_n, threads=threads)
    if dtype not in ("float16", "bfloat16", "float32"):
        raise MetalLoweringError(f"flash attention dtype={dtype!r} is not supported; use 'float16', 'bfloat16' or 'float32'")
    if threads <= 0 or threads % 32:
        raise MetalLoweringError(f"threads={threads} must be a positive multiple of 32 (one simdgroup is 32 threads); use 64 or 128")
    if head_dim <= 0 or head_dim % 8:
        raise MetalLoweringError(
            f"head_dim={head_dim} is not a multiple of 8: both GEMMs cover head_dim with whole 8x8 Metal matrix tiles; "
            f"use a head_dim that is a multiple of 8 (e.g. {_multiples_near(max(head_dim, 1), 8)})"
        )
    if block_n <= 0 or block_n % 8:
        raise MetalLoweringError(
            f"block_n={block_n} is not a multiple of 8: the scores S are 8x8 Metal matrix tiles; use block_n={_multiples_near(max(block_n, 1), 8)}"
        )
    rows_per_tile = 8
    if block_m <= 0 or block_m % rows_per_tile:
        raise MetalLoweringError(
            f"{rows_name}={block_m} is not a multiple of 8: the query rows of S are whole 8-row Metal matrix tiles; "
            f"use {rows_name}={_multiples_near(max(block_m, 1), rows_per_tile)}"
        )
    if dataflow == DIRECT:
        return  # no threadgroup memory
    size = _bytes(dtype)
    buffers = {"K_shared": block_n * head_dim * size, "V_shared": block_n * head_dim * size}
    total = sum(buffers.values())
    if total <= THREADGROUP_MEMORY_BYTES:
        return
    fits = [n for n in (64, 32, 16, 8) if 2 * n * head_dim * size <= THREADGROUP_MEMORY_BYTES]
    detail = ", ".join(f"{name} {nbytes} B" for name, nbytes in buffers.items())
    hint = f"block_n={fits[0]}" if fits else "a smaller head_dim"
    raise MetalLoweringError(
        f"flash attention with head_dim={head_dim}, block_n={block_n} ({dtype}) stages {total} B of K and V in "
        f"threadgroup memory ({detail}); Metal has {THREADGROUP_MEMORY_BYTES} B. Use {hint}, or a Metal 4 target "
        "(the direct dataflow stages nothing)."
    )


# The default block sizes, in preference order: the most query rows per threadgroup first (each K / V
# block is read, or staged, once for more queries), then the most keys per block (fewer passes of the
# online softmax); always 4 simdgroups, as MLX's attention kernels. `attention_blocks` takes the first
# that fits the register budget (and, staged, threadgroup memory).
BLOCK_M_CHOICES = (64, 32, 16, 8)
BLOCK_N_CHOICES = (64, 32, 16, 8)
DEFAULT_THREADS = 128
# flash decoding's GEMM dataflows (block_h query heads as the rows): 32 keys per block, 64 threads first
DECODING_BLOCK_N_CHOICES = (32, 16, 8)
DECODING_THREAD_CHOICES = (64, 128)


@dataclass(frozen=True)
class AttentionBlocks:
    """Block sizes of the forward kernel and its register estimate (register_budget.attention_registers)."""

    block_m: int
    block_n: int
    threads: int
    registers: KernelRegisters

    def describe(self) -> str:
        return f"block_m={self.block_m}, block_n={self.block_n}, threads={self.threads}: {self.registers.describe()}"


def attention_blocks(head_dim: int, *, dataflow: str, dtype: str = "float16", row_bounds: bool = False, inputs: int = 4,
                     block_m: int | None = None, block_n: int | None = None, threads: int | None = None,
                     block_n_choices: tuple[int, ...] = BLOCK_N_CHOICES,
                     thread_choices: tuple[int, ...] = (DEFAULT_THREADS,)) -> AttentionBlocks:
    """The forward kernel's block sizes for `head_dim` on `dataflow`, the ones not given chosen by the
    register estimate: the first of BLOCK_M_CHOICES x BLOCK_N_CHOICES (DEFAULT_THREADS threads) whose
    estimate fits REGISTER_BUDGET and, staged, whose K and V tiles fit threadgroup memory.

    Why: Q (rows x head_dim), the output (rows x head_dim in float), S and P stay in registers for
    the whole key loop, so the rows each simdgroup holds decide the count. 16 rows per simdgroup
    (64 x 32 on 128 threads, metal4's cooperative tensors, as MLX's NAX kernel) fit head_dim 64;
    head_dim 128 needs 8 (32 x 64); head_dim 256 needs 8 rows over 2 simdgroups that split the
    output's head_dim between 2 more (16 x 32; the 2 replicas compute S twice). On plain metal Q in
    threadgroup memory would free its registers but not the output's, which alone are 64 at 16 rows
    of head_dim 128. Candidates no whole-tile split serves are skipped; when none fits, the one with
    the fewest registers (it runs, spilling: only speed changes). `row_bounds` (causal or a mask)
    and `inputs` (device buffers) as for attention_registers."""
    staged = dataflow == STAGED
    found: list[AttentionBlocks] = []
    for bm, bn, t in itertools.product((block_m,) if block_m is not None else BLOCK_M_CHOICES,
                                       (block_n,) if block_n is not None else block_n_choices,
                                       (threads,) if threads is not None else thread_choices):
        # a block_n not given must fit with its rows padded (dense rows of 128 halves replay 8-way on
        # the transposed K^T loads, and 32 KiB of tiles leave one threadgroup per core)
        row = head_dim + (gemm_row_pad(head_dim, dtype) if block_n is None else 0)
        if staged and _staged_bytes(row, bn, dtype) > THREADGROUP_MEMORY_BYTES:
            continue
        try:
            regs = attention_registers(head_dim, bm, bn, t, metal4=dataflow == DIRECT, staged=staged, dtype=dtype,
                                       row_bounds=row_bounds, inputs=inputs)
        except ValueError:  # no whole-tile split: check_attention_config names what is wrong
            continue
        if regs.total <= REGISTER_BUDGET.registers:
            return AttentionBlocks(bm, bn, t, regs)
        found.append(AttentionBlocks(bm, bn, t, regs))
    if found:
        return min(found, key=lambda b: b.registers.total)
    # nothing splits (a head_dim that is not a multiple of 8...): check_attention_config refuses it in one line
    return AttentionBlocks(block_m or BLOCK_M_CHOICES[0], block_n or BLOCK_N_CHOICES[0], threads or DEFAULT_THREADS,
                           KernelRegisters(0, 0))


def check_gqa(heads: int, kv_heads: int) -> None:
    if kv_heads <= 0 or heads <= 0 or heads % kv_heads:
        divisors = [d for d in range(1, heads + 1) if heads % d == 0] if heads > 0 else []
        raise MetalLoweringError(
            f"GQA needs heads ({heads}) to be a multiple of kv_heads ({kv_heads}): each KV head serves a whole group of "
            f"query heads; use kv_heads in {divisors}"
        )
