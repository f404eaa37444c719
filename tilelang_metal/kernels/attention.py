"""Attention kernels for Metal, written in TileLang: flash attention forward (MHA / GQA, causal or
not, bshd or bhsd) and flash decoding (split-KV partial kernel plus combine kernel, one module).

They are ordinary TileLang programs (docs/guide.md, "Writing attention for Metal"): the plugin
runs them because `T.gemm` reads a register-fragment A operand in place
(gemm/register_operand.py) and `T.reduce_max` / `T.reduce_sum` work on GEMM accumulators
(ops/reduce.py). The plugin gives both GEMMs one instruction and one split of the query rows over
the simdgroups (transform/fragment_groups.py; with fewer row tiles than simdgroups, replicated), so
the scores accumulator `S` and its half-precision copy `P` share one lane layout and the softmax
never moves data between lanes except for the row reductions.

Two dataflows, chosen by the target (`attention_config.attention_dataflow`, beside the block sizes
and the refusals):

- "direct" (metal4; cooperative tensors where each simdgroup holds 16 query rows, simdgroup
  matrices at 8): Q is read from device memory once into a register fragment that is the first
  GEMM's A operand; K (as K^T, `transpose_B=True`) and V go from device memory straight into the
  GEMMs (the direct-global dataflow), so the kernels use no threadgroup memory and no barrier, and
  head_dim 128 runs with block_n 64. Keys past the end of the sequence read as zeros (the GEMM's
  edge guards) and are masked.
- "staged" (plain metal, simdgroup matrices): Q is read into registers the same way; K and V are
  staged through threadgroup memory by `T.copy`, their rows padded to a pitch of an odd multiple of
  16 bytes (`staged_row_pad`; row starts then fall on different banks, for the transposed
  `simdgroup_load` of K^T); default block sizes are only those whose padded tiles fit.

Block sizes not given are chosen by the register estimate (`attention_config.attention_blocks`): Q, the output, S
and P live in registers through the whole key loop, so the query rows per simdgroup shrink as
head_dim grows (16 at head_dim 64, 8 at 128; at 256, 8 rows over 2 simdgroups and head_dim split
between 2 more).

Sequence tails are masked (keys past the end get probability 0 by position, queries past the end
are not stored), so no length has to be a multiple of a block; `seq_len=None` makes it a runtime
value. What callers pass besides Q, K, V (a (seq_len, seq_len_kv) additive or boolean mask, one sink
logit per head, more keys than queries with the causal mask aligned to the end) enters through
`key_visible` / `score_bias` of the softmax step and the starting maximum and denominator. The kernels hold no infinity anywhere: Metal's fast-math mode may assume there are none (see
MASKED_SCORE); no score, however low, is mistaken for a masked key.

No `from __future__ import annotations` here: TileLang evaluates the `T.Tensor` annotations.
"""


import math
from typing import Any, Callable

import tilelang.language as T

from ..errors import MetalLoweringError
from ..target.isa import SIMD_WIDTH
from .attention_config import (
    DECODING_BLOCK_N_CHOICES, DECODING_DATAFLOWS, DECODING_THREAD_CHOICES, DIRECT, VECTOR, attention_blocks,
    check_attention_config, check_gqa, decoding_dataflow, decoding_splits, resolve_dataflow, staged_row_pad, vector_refusal,
)
from .attention_masks import MASKED_SCORE, MASKS, mask_element_type, score_or_masked, was_visible
from .sizes import flags, integer_sizes, one_of, optional_size

ACCUM = "float32"
LOG2_E = 1.4426950408889634


def online_softmax_step(
    rows: int, cols: int, head_dim: int, scale: float, key_visible: Callable[[Any, Any, Any], Any],
    score_bias: Callable[[Any, Any, Any], Any] | None = None, mark_masked: bool = False,
) -> Any:
    """A `T.macro` for one block of keys of the online softmax, shared by both kernels: mask the
    scores `S` (rows x cols, fp32) of keys `first_key + j` that row i may not see
    (`key_visible(i, key, limit)`, with the caller's `limit`: a fragment of per-row key bounds or
    one key bound), fold them into the running row maximum, turn them into probabilities in `P`, add their
    row sums to `denominator` and rescale `acc_o` (rows x head_dim) to the new maximum.

    Masked keys get probability 0 from their position, not from their score, so no score is too low
    to count: the maximum starts at MASKED_SCORE (the lowest finite float, at most tied by a real
    score, which then is the maximum and gets exp2(0) = 1). A row whose keys so far are all masked
    or -inf has summed exactly 0 (torch 2.13 gives such a row 0); its factor exp2(0) = 1 rescales
    zeros. A NaN score makes its row sum NaN (Metal's max ignores NaN, the exp2 does not), so a NaN
    in q, K or V reaches the output as in torch.
    `scale` is log2(e) / sqrt(head_dim): exp(x / sqrt(d)) == exp2(x * scale); the differences are
    taken before scaling, so the maximum's own term is exactly exp2(0) whatever its size.
    `score_bias(i, key, limit)`: an additive mask, in the units of S (q.k, before the 1/sqrt(d)),
    added to the visible keys' scores only (it is read only where the key is visible).
    `mark_masked` (key_visible reads memory: a boolean mask): key_visible is asked in the first
    loop only, which marks masked keys in S; the second finds them there (attention_masks.py)."""

    def masked_score(i: Any, key: Any, limit: Any, score: Any) -> Any:
        visible = key_visible(i, key, limit)
        score = score if score_bias is None else score + score_bias(i, key, limit)
        return score_or_masked(visible, score) if mark_masked else T.if_then_else(visible, score, MASKED_SCORE)

    def still_visible(i: Any, key: Any, limit: Any, masked: Any) -> Any:
        return was_visible(masked) if mark_masked else key_visible(i, key, limit)

    @T.macro
    def step(S, P, acc_o, row_max, row_max_prev, row_rescale, row_sum, denominator, first_key, limit):
        for i, j in T.Parallel(rows, cols):
            S[i, j] = masked_score(i, first_key + j, limit, S[i, j])
        T.copy(row_max, row_max_prev)
        T.reduce_max(S, row_max, dim=1, clear=False)
        for i in T.Parallel(rows):
            row_rescale[i] = T.exp2((row_max_prev[i] - row_max[i]) * scale)
        for i, j in T.Parallel(rows, cols):
            S[i, j] = T.if_then_else(still_visible(i, first_key + j, limit, S[i, j]), T.exp2((S[i, j] - row_max[i]) * scale), 0)
        T.reduce_sum(S, row_sum, dim=1)
        for i in T.Parallel(rows):
            denominator[i] = denominator[i] * row_rescale[i] + row_sum[i]
        T.copy(S, P)
        for i, d in T.Parallel(rows, head_dim):
            acc_o[i, d] *= row_rescale[i]

    return step


def heads_major(tensor: Any, batch: int, seq: Any, heads: int, head_dim: int, bshd: bool) -> Any:
    """`tensor` seen as (batch, heads, seq, head_dim): a strided view of a bshd tensor (no copy), so
    a block of rows of one head is a 2-D tile whose last two dims are (rows, head_dim), what a
    device-memory T.gemm operand needs."""
    if not bshd:  # already heads-major; a view all the same, so the parameter keeps its own name
        return T.view(tensor, (batch, heads, seq, head_dim))
    return T.view(tensor, (batch, heads, seq, head_dim), strides=(seq * heads * head_dim, head_dim, heads * head_dim, 1))


def flash_attention_program(
    batch: int,
    heads: int,
    seq_len: int | None,
    head_dim: int,
    *,
    causal: bool = False,
    kv_heads: int | None = None,
    seq_len_kv: int | None = None,
    mask: str | None = None,
    sinks: bool | str = False,
    layout: str = "bshd",
    dtype: str = "float16",
    block_m: int | None = None,
    block_n: int | None = None,
    threads: int | None = None,
    num_stages: int = 1,
    target: Any = None,
    dataflow: str | None = None,
) -> Any:
    """O = softmax(Q K^T / sqrt(d) [+ mask]) V per (batch, head), called as
    `kernel(Q, K, V[, mask][, sinks], O)`. Q, O in `layout` ("bshd": (batch, seq_len, heads, dim);
    "bhsd": (batch, heads, seq_len, dim)); K and V likewise with `seq_len_kv` keys (default seq_len)
    and `kv_heads` heads (GQA: query head h reads kv head h // (heads // kv_heads)).
    `seq_len=None`: a runtime query count (and key count, unless seq_len_kv is given).

    - `causal`: query i sees keys up to i + seq_len_kv - seq_len, the causal mask aligned to the
      *end* of the keys (FlashAttention 2, MLX; what a query block appended to a KV cache needs).
      torch's `is_causal` aligns it to the start: the two agree when seq_len_kv == seq_len.
    - `mask`: a (seq_len, seq_len_kv) tensor shared by every batch and head, as torch's `attn_mask`:
      "additive" (the kernel's dtype, added to the scaled scores; -inf removes a key) or "bool"
      (True keeps the key). It combines with `causal` and the sequence ends.
    - `sinks`: one logit per query head, a (heads,) tensor in the kernel's dtype (True) or in
      float32 ("float32"), used as float32: it joins each row's softmax denominator and takes no
      value (MLX's `scaled_dot_product_attention(..., sinks=)`).

    A row with no visible key (every key masked or -inf) is 0, as in torch 2.13.
    `dataflow` ("direct" or "staged", module doc) defaults to the one of `target` (the target the
    program is compiled for); `num_stages` pipelines the staged K / V copies. `block_m`, `block_n`,
    `threads` not given are chosen by `attention_blocks` (the register estimate) for this head_dim,
    dataflow, mask and inputs."""
    what = "flash_attention_program"
    batch, heads, head_dim = integer_sizes(what, minimum=1, error=MetalLoweringError, batch=batch, heads=heads, head_dim=head_dim)
    given = {name: value for name, value in (("block_m", block_m), ("block_n", block_n), ("threads", threads)) if value is not None}
    given = dict(zip(given, integer_sizes(what, minimum=1, error=MetalLoweringError, **given)))
    seq_len = optional_size(what, "seq_len", seq_len, none_means="a length given at run time", error=MetalLoweringError)
    kv_heads = optional_size(what, "kv_heads", kv_heads, none_means="kv_heads = heads", error=MetalLoweringError) or heads
    seq_len_kv = optional_size(what, "seq_len_kv", seq_len_kv, none_means="seq_len_kv = seq_len", error=MetalLoweringError)
    (num_stages,) = integer_sizes(what, minimum=0, error=MetalLoweringError, num_stages=num_stages)
    flags(what, error=MetalLoweringError, causal=causal)
    _check_mask_and_sinks(what, mask, sinks, dtype)
    check_gqa(heads, kv_heads)
    if layout not in ("bshd", "bhsd"):
        raise MetalLoweringError(f"layout must be 'bshd' or 'bhsd', got {layout!r}")
    dataflow = resolve_dataflow(dataflow, target)
    blocks = attention_blocks(head_dim, dataflow=dataflow, dtype=dtype, row_bounds=causal or mask is not None,
                              inputs=4 + _optional_inputs(mask, sinks), **given)
    block_m, block_n, threads = blocks.block_m, blocks.block_n, blocks.threads
    check_attention_config(head_dim, block_m, block_n, dtype, threads, dataflow=dataflow)
    direct = dataflow == DIRECT
    pad = 0 if direct else staged_row_pad(head_dim, block_n, dtype)
    group = heads // kv_heads
    seq = T.dynamic("seq_len") if seq_len is None else seq_len
    seq_kv = seq if seq_len_kv is None else seq_len_kv
    scale = LOG2_E / math.sqrt(head_dim)  # exp(x / sqrt(d)) == exp2(x * scale)
    bshd = layout == "bshd"
    q_shape = (batch, seq, heads, head_dim) if bshd else (batch, heads, seq, head_dim)
    kv_shape = (batch, seq_kv, kv_heads, head_dim) if bshd else (batch, kv_heads, seq_kv, head_dim)
    mask_shape, mask_dtype = (seq, seq_kv), mask_element_type(mask, dtype)
    sinks_shape, sinks_dtype = (heads,), _sinks_dtype(sinks, dtype)
    has_sinks = bool(sinks)  # a Python bool: TileLang warns on a string as a condition
    # with a mask, every row has a bound key_end (0 for rows past the end) that guards the mask's reads
    bounded_rows = causal or mask is not None

    def rows(tensor: Any, b: Any, h: Any, start: Any, count: int) -> Any:
        if bshd:
            return tensor[b, start : start + count, h, :]
        return tensor[b, h, start : start + count, :]

    def key_visible(i: Any, key: Any, limit: Any) -> Any:
        """Key `key` is a real key (and, causal, not after query row i; with a boolean mask, kept by
        it): below the row's key_end. `limit` is (key_end, Mask, first query of the block)."""
        key_end, mask_tensor, query0 = limit
        if not bounded_rows:
            return key < seq_kv
        if mask == "bool":
            return T.And(key < key_end[i], mask_tensor[query0 + i, key])
        return key < key_end[i]

    def mask_bias(i: Any, key: Any, limit: Any) -> Any:
        _, mask_tensor, query0 = limit
        return T.cast(mask_tensor[query0 + i, key], ACCUM) * math.sqrt(head_dim)  # in q.k units

    softmax_step = online_softmax_step(block_m, block_n, head_dim, scale, key_visible, mask_bias if mask == "additive" else None,
                                       mark_masked=mask == "bool")
    # causal, query q sees keys below q + 1 + kv_offset (the mask aligned to the end of the keys); the
    # expressions stay those of equal lengths when seq_len_kv is not given (lowering cost: Simplify)
    kv_offset = 0 if seq_len_kv is None else seq_kv - seq

    def row_key_end(query: Any) -> Any:
        end = (T.min(query + 1 + kv_offset, seq_kv) if seq_len_kv is not None else T.min(query + 1, seq)) if causal else seq_kv
        return end if mask is None else T.if_then_else(query < seq, end, 0)  # rows past the end read no mask

    def causal_key_blocks(kv_blocks: Any, queries_end: Any) -> Any:
        if seq_len_kv is None:
            return T.min(kv_blocks, T.ceildiv(queries_end, block_n))
        return T.max(T.min(kv_blocks, T.ceildiv(queries_end + kv_offset, block_n)), 0)  # <= 0: no key at all

    @T.macro
    def body(Q, K, V, Mask, Sinks, O):
        with T.Kernel(T.ceildiv(seq, block_m), heads, batch, threads=threads) as (bx, by, bz):
            Q_frag = T.alloc_fragment((block_m, head_dim), dtype)
            S = T.alloc_fragment((block_m, block_n), ACCUM)
            P = T.alloc_fragment((block_m, block_n), dtype)
            acc_o = T.alloc_fragment((block_m, head_dim), ACCUM)
            row_max = T.alloc_fragment((block_m,), ACCUM)
            row_max_prev = T.alloc_fragment((block_m,), ACCUM)
            row_rescale = T.alloc_fragment((block_m,), ACCUM)
            row_sum = T.alloc_fragment((block_m,), ACCUM)
            denominator = T.alloc_fragment((block_m,), ACCUM)
            # the keys row i may see end at key_end[i] = min(query + 1 + seq_kv - seq, seq_kv) if causal: one
            # compare with a loaded bound (written inline, the unrolled lane arithmetic costs TVM's Simplify
            # ~10 s per kernel)
            key_end = T.alloc_fragment((block_m,), "int32")

            kv_head = by // group
            # Q once, into the registers the first GEMM reads as its A operand (rows past the end read 0)
            T.copy(rows(Q, bz, by, bx * block_m, block_m), Q_frag)
            T.fill(acc_o, 0)
            if has_sinks:
                # the sink is a key of score sinks[h] (q.k units: * sqrt(d)) and value 0: the running
                # maximum starts at it and the denominator at its exp2(0) = 1 (0 for a -inf sink)
                for i in T.Parallel(block_m):
                    row_max[i] = T.max(T.cast(Sinks[by], ACCUM) * math.sqrt(head_dim), MASKED_SCORE)
                for i in T.Parallel(block_m):
                    denominator[i] = T.exp2((T.cast(Sinks[by], ACCUM) * math.sqrt(head_dim) - row_max[i]) * scale)
            else:
                T.fill(denominator, 0)
                T.fill(row_max, MASKED_SCORE)
            for i in T.Parallel(block_m):
                key_end[i] = row_key_end(bx * block_m + i)
            limit = (key_end, Mask, bx * block_m)
            kv_blocks = T.ceildiv(seq_kv, block_n)
            if causal:  # up to the last key the block's last row sees
                kv_blocks = causal_key_blocks(kv_blocks, (bx + 1) * block_m)
            if direct:
                K_rows = heads_major(K, batch, seq_kv, kv_heads, head_dim, bshd)
                V_rows = heads_major(V, batch, seq_kv, kv_heads, head_dim, bshd)
                for kb in T.serial(kv_blocks):
                    # K^T and V straight from device memory (keys past the end read 0 and are masked)
                    T.gemm(Q_frag, K_rows[bz, kv_head, kb * block_n : (kb + 1) * block_n, :], S, transpose_B=True,
                           clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    softmax_step(S, P, acc_o, row_max, row_max_prev, row_rescale, row_sum, denominator, kb * block_n, limit)
                    T.gemm(P, V_rows[bz, kv_head, kb * block_n : (kb + 1) * block_n, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
            else:
                K_shared = T.alloc_shared((block_n, head_dim + pad), dtype)
                V_shared = T.alloc_shared((block_n, head_dim + pad), dtype)
                for kb in T.Pipelined(kv_blocks, num_stages=num_stages):
                    # both copies first: one barrier makes K and V visible, one guards their reuse
                    T.copy(rows(K, bz, kv_head, kb * block_n, block_n), K_shared[:, 0:head_dim])
                    T.copy(rows(V, bz, kv_head, kb * block_n, block_n), V_shared[:, 0:head_dim])
                    T.gemm(Q_frag, K_shared[:, 0:head_dim], S, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                    softmax_step(S, P, acc_o, row_max, row_max_prev, row_rescale, row_sum, denominator, kb * block_n, limit)
                    T.gemm(P, V_shared[:, 0:head_dim], acc_o, policy=T.GemmWarpPolicy.FullRow)
            for i, j in T.Parallel(block_m, head_dim):
                acc_o[i, j] = T.if_then_else(denominator[i] == 0, 0, acc_o[i, j] / denominator[i])
            T.copy(acc_o, rows(O, bz, by, bx * block_m, block_m))

    # one signature per combination of the optional inputs: kernel(Q, K, V[, Mask][, Sinks], O)
    if mask is not None and sinks:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Mask: T.Tensor(mask_shape, mask_dtype), Sinks: T.Tensor(sinks_shape, sinks_dtype), O: T.Tensor(q_shape, dtype)):
            body(Q, K, V, Mask, Sinks, O)

    elif mask is not None:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Mask: T.Tensor(mask_shape, mask_dtype), O: T.Tensor(q_shape, dtype)):
            body(Q, K, V, Mask, None, O)

    elif sinks:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Sinks: T.Tensor(sinks_shape, sinks_dtype), O: T.Tensor(q_shape, dtype)):
            body(Q, K, V, None, Sinks, O)

    else:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype), O: T.Tensor(q_shape, dtype)):
            body(Q, K, V, None, None, O)

    return main


def _check_mask_and_sinks(what: str, mask: Any, sinks: Any, dtype: str) -> None:
    one_of(what, "mask", mask, MASKS, error=MetalLoweringError)
    one_of(what, "sinks", sinks, (False, True, "float32"), error=MetalLoweringError)


def _sinks_dtype(sinks: bool | str, dtype: str) -> str:
    return "float32" if sinks == "float32" else dtype


def _optional_inputs(mask: str | None, sinks: bool | str) -> int:
    """How many of the optional inputs (mask, sinks) a kernel takes after Q, K, V."""
    return (mask is not None) + bool(sinks)


def flash_decoding_program(
    batch: int,
    heads: int,
    kv_heads: int,
    seq_len_kv: int,
    head_dim: int,
    *,
    num_split: int | None = None,
    mask: str | None = None,
    sinks: bool | str = False,
    dtype: str = "float16",
    block_h: int = 16,
    block_n: int | None = None,
    threads: int | None = None,
    target: Any = None,
    dataflow: str | None = None,
) -> Any:
    """One decoding step: out[b, h] = softmax(q[b, h] K[b, :, h // group]^T / sqrt(d)) V[b, :, h // group].

    Kernel 1 splits the keys into `num_split` ranges (default `decoding_splits`: one per 128 keys, at
    most 64) and writes, per query head and split, a partial output and its log2-sum-exp; kernel 2
    combines the splits. q: (batch, heads, dim); K, V:
    (batch, seq_kv, kv_heads, dim). `dataflow` (default `decoding_dataflow`):
    - "vector": a threadgroup per KV head and split, one simdgroup per query head of its group; per
      key, each lane reads its run of head_dim / 32 elements of K and V in one vector load, the score
      is a simd sum, the online softmax runs on scalars (block_h, block_n, threads do not apply);
    - "direct" / "staged", as for flash_attention_program: each threadgroup handles `block_h` query
      heads of one KV group as the rows of two GEMMs, K and V from device memory or staged;
      `block_n` and `threads` not given are chosen by `attention_blocks` for the block_h rows.

    `mask` and `sinks` as in flash_attention_program, for the one query row of the step: the mask is
    a (1, seq_len_kv) tensor (a (seq_len_kv,) row is passed as `row[None]`), the sinks (heads,); the
    sink joins the combine kernel's denominator once, as a split of log-sum-exp sinks[h] and output 0.
    Called as `kernel(q, K, V[, mask][, sinks]) -> (partial_out, partial_lse, out)`."""
    what = "flash_decoding_program"
    batch, heads, kv_heads, seq_len_kv, head_dim, block_h = integer_sizes(
        what, minimum=1, error=MetalLoweringError, batch=batch, heads=heads, kv_heads=kv_heads, seq_len_kv=seq_len_kv,
        head_dim=head_dim, block_h=block_h)
    given = {name: value for name, value in (("block_n", block_n), ("threads", threads)) if value is not None}
    given = dict(zip(given, integer_sizes(what, minimum=1, error=MetalLoweringError, **given)))
    num_split = optional_size(what, "num_split", num_split, none_means=f"{decoding_splits(seq_len_kv)} for {seq_len_kv} keys",
                              error=MetalLoweringError)
    _check_mask_and_sinks(what, mask, sinks, dtype)
    check_gqa(heads, kv_heads)
    group = heads // kv_heads
    if dataflow is None:
        dataflow = decoding_dataflow(heads, kv_heads, head_dim, target)
    elif dataflow not in DECODING_DATAFLOWS:
        raise MetalLoweringError(f"dataflow={dataflow!r} is not a decoding dataflow; use 'vector', 'direct', 'staged' or None")
    vector = dataflow == VECTOR
    if vector:
        if dtype not in ("float16", "bfloat16", "float32"):
            raise MetalLoweringError(f"flash decoding dtype={dtype!r} is not supported; use 'float16', 'bfloat16' or 'float32'")
        refusal = vector_refusal(group, head_dim)
        if refusal is not None:
            raise MetalLoweringError(refusal)
    else:
        if group % block_h and block_h % group:
            raise MetalLoweringError(f"block_h={block_h} must divide the GQA group ({group}) or be a multiple of it")
    # the GEMM dataflows' block_n and threads, when not given, by the register estimate (the rows are
    # block_h, the device buffers q, K, V, the partials and a mask): 64 threads, or 128 that split
    # head_dim over 2 simdgroups where 64 would not fit (head_dim 256)
    blocks = attention_blocks(head_dim, dataflow=dataflow, dtype=dtype, inputs=5 + (mask is not None), block_m=block_h,
                              block_n_choices=DECODING_BLOCK_N_CHOICES, thread_choices=DECODING_THREAD_CHOICES, **given)
    block_n, threads = blocks.block_n, blocks.threads
    if not vector:
        check_attention_config(head_dim, block_h, block_n, dtype, threads, rows_name="block_h", dataflow=dataflow)
    if num_split is None:
        num_split = decoding_splits(seq_len_kv, 0 if vector else block_n)
    direct = dataflow == DIRECT
    per_lane = head_dim // SIMD_WIDTH
    vector_runs = per_lane in (2, 4, 8)  # a lane's run as one vector load (3 or 5 elements: one by one)
    pad = 0 if direct else staged_row_pad(head_dim, block_n, dtype)
    heads_per_block = min(block_h, group)  # real query heads in a block; the rest are padding rows
    split_len = -(-seq_len_kv // num_split)
    scale = LOG2_E / math.sqrt(head_dim)
    q_shape = (batch, heads, head_dim)
    kv_shape = (batch, seq_len_kv, kv_heads, head_dim)
    partial_shape = (batch, heads, num_split, head_dim)
    lse_shape = (batch, heads, num_split)
    mask_shape, mask_dtype = (1, seq_len_kv), mask_element_type(mask, dtype)
    sinks_shape, sinks_dtype = (heads,), _sinks_dtype(sinks, dtype)
    has_sinks = bool(sinks)  # a Python bool: TileLang warns on a string as a condition

    def key_visible(i: Any, key: Any, limit: Any) -> Any:
        key_end, mask_tensor = limit  # key_end <= seq_len_kv: the mask is read only below it
        if mask == "bool":
            return T.And(key < key_end, mask_tensor[0, key])
        return key < key_end

    def mask_bias(i: Any, key: Any, limit: Any) -> Any:
        return T.cast(limit[1][0, key], ACCUM) * math.sqrt(head_dim)  # in q.k units

    softmax_step = online_softmax_step(block_h, block_n, head_dim, scale, key_visible, mask_bias if mask == "additive" else None,
                                       mark_masked=mask == "bool")

    @T.macro
    def body(Q, K, V, Mask, Sinks, partial_out, partial_lse, Out):
        if vector:
            with T.Kernel(batch, kv_heads, num_split, threads=group * SIMD_WIDTH) as (bb, kv_group, split):
                thread = T.get_thread_binding()
                lane = thread % SIMD_WIDTH
                head = kv_group * group + thread // SIMD_WIDTH  # this simdgroup's query head
                q_run = T.alloc_local((per_lane,), ACCUM)
                o_run = T.alloc_local((per_lane,), ACCUM)
                k_run = T.alloc_local((per_lane,), dtype)
                v_run = T.alloc_local((per_lane,), dtype)
                score = T.alloc_var(ACCUM)
                running_max = T.alloc_var(ACCUM)
                new_max = T.alloc_var(ACCUM)
                rescale = T.alloc_var(ACCUM)
                weight = T.alloc_var(ACCUM)
                running_sum = T.alloc_var(ACCUM)
                if vector_runs:
                    for d in T.vectorized(per_lane):
                        k_run[d] = Q[bb, head, lane * per_lane + d]
                else:
                    for d in T.unroll(per_lane):
                        k_run[d] = Q[bb, head, lane * per_lane + d]
                for d in T.unroll(per_lane):
                    q_run[d] = T.cast(k_run[d], ACCUM)
                    o_run[d] = 0
                running_max = MASKED_SCORE
                running_sum = 0
                key0 = split * split_len
                for key in T.serial(key0, T.min(key0 + split_len, seq_len_kv)):
                    if vector_runs:
                        for d in T.vectorized(per_lane):
                            k_run[d] = K[bb, key, kv_group, lane * per_lane + d]
                        for d in T.vectorized(per_lane):
                            v_run[d] = V[bb, key, kv_group, lane * per_lane + d]
                    else:
                        for d in T.unroll(per_lane):
                            k_run[d] = K[bb, key, kv_group, lane * per_lane + d]
                            v_run[d] = V[bb, key, kv_group, lane * per_lane + d]
                    score = 0
                    for d in T.unroll(per_lane):
                        score += q_run[d] * T.cast(k_run[d], ACCUM)
                    # scaled after the sum, as torch does: a q.k that overflows float32 is -inf there too
                    score = T.warp_reduce_sum(score) * scale  # log2 units
                    if mask == "additive":
                        score = score + T.cast(Mask[0, key], ACCUM) * LOG2_E
                    if mask == "bool":  # a masked key leaves the maximum alone and weighs 0 (mask read once)
                        score = score_or_masked(Mask[0, key], score)
                    new_max = T.max(running_max, score)
                    rescale = T.exp2(running_max - new_max)
                    weight = T.exp2(score - new_max)
                    if mask == "bool":
                        weight = T.if_then_else(was_visible(score), weight, 0)
                    running_sum = running_sum * rescale + weight
                    running_max = new_max
                    for d in T.unroll(per_lane):
                        o_run[d] = o_run[d] * rescale + weight * T.cast(v_run[d], ACCUM)
                for d in T.unroll(per_lane):
                    partial_out[bb, head, split, lane * per_lane + d] = T.if_then_else(running_sum == 0, 0, o_run[d] / running_sum)
                if lane == 0:
                    partial_lse[bb, head, split] = T.if_then_else(running_sum == 0, MASKED_SCORE, T.log2(running_sum) + running_max)
        else:
            with T.Kernel(batch, heads // heads_per_block, num_split, threads=threads) as (bb, hb, split):
                Q_frag = T.alloc_fragment((block_h, head_dim), dtype)
                S = T.alloc_fragment((block_h, block_n), ACCUM)
                P = T.alloc_fragment((block_h, block_n), dtype)
                acc_o = T.alloc_fragment((block_h, head_dim), ACCUM)
                row_max = T.alloc_fragment((block_h,), ACCUM)
                row_max_prev = T.alloc_fragment((block_h,), ACCUM)
                row_rescale = T.alloc_fragment((block_h,), ACCUM)
                row_sum = T.alloc_fragment((block_h,), ACCUM)
                denominator = T.alloc_fragment((block_h,), ACCUM)

                head0 = hb * heads_per_block
                kv_head = head0 // group
                for i, d in T.Parallel(block_h, head_dim):
                    Q_frag[i, d] = T.if_then_else(i < heads_per_block, Q[bb, head0 + i, d], T.cast(0, dtype))
                T.fill(acc_o, 0)
                T.fill(denominator, 0)
                T.fill(row_max, MASKED_SCORE)
                key0 = split * split_len
                key_end = T.min(key0 + split_len, seq_len_kv)
                if direct:
                    K_rows = heads_major(K, batch, seq_len_kv, kv_heads, head_dim, True)
                    V_rows = heads_major(V, batch, seq_len_kv, kv_heads, head_dim, True)
                    for kb in T.serial(T.ceildiv(split_len, block_n)):
                        first = key0 + kb * block_n  # keys past the cache read 0; past the split, masked
                        T.gemm(Q_frag, K_rows[bb, kv_head, first : first + block_n, :], S, transpose_B=True, clear_accum=True,
                               policy=T.GemmWarpPolicy.FullRow)
                        softmax_step(S, P, acc_o, row_max, row_max_prev, row_rescale, row_sum, denominator, first, (key_end, Mask))
                        T.gemm(P, V_rows[bb, kv_head, first : first + block_n, :], acc_o, policy=T.GemmWarpPolicy.FullRow)
                else:
                    K_shared = T.alloc_shared((block_n, head_dim + pad), dtype)
                    V_shared = T.alloc_shared((block_n, head_dim + pad), dtype)
                    for kb in T.Pipelined(T.ceildiv(split_len, block_n), num_stages=1):
                        T.copy(K[bb, key0 + kb * block_n : key0 + (kb + 1) * block_n, kv_head, :], K_shared[:, 0:head_dim])
                        T.copy(V[bb, key0 + kb * block_n : key0 + (kb + 1) * block_n, kv_head, :], V_shared[:, 0:head_dim])
                        T.gemm(Q_frag, K_shared[:, 0:head_dim], S, transpose_B=True, clear_accum=True, policy=T.GemmWarpPolicy.FullRow)
                        softmax_step(S, P, acc_o, row_max, row_max_prev, row_rescale, row_sum, denominator, key0 + kb * block_n,
                                     (key_end, Mask))
                        T.gemm(P, V_shared[:, 0:head_dim], acc_o, policy=T.GemmWarpPolicy.FullRow)
                for i, d in T.Parallel(block_h, head_dim):
                    if i < heads_per_block:
                        partial_out[bb, head0 + i, split, d] = T.if_then_else(denominator[i] == 0, 0, acc_o[i, d] / denominator[i])
                for i in T.Parallel(block_h):
                    if i < heads_per_block:
                        # log2 of the split's softmax denominator, relative to scale = 1 (i.e. in q.k/sqrt(d) units * log2 e)
                        partial_lse[bb, head0 + i, split] = T.if_then_else(
                            denominator[i] == 0, MASKED_SCORE, T.log2(denominator[i]) + row_max[i] * scale
                        )

        with T.Kernel(heads, batch, threads=head_dim) as (h, bb):
            lse_max = T.alloc_var(ACCUM)
            lse_total = T.alloc_var(ACCUM)
            tx = T.get_thread_binding()
            # a split with no key has lse MASKED_SCORE, below every real one (its weight exp2(MASKED_SCORE - m)
            # is exactly 0); when every split is empty each weighs 1 and adds its zero partial
            lse_max = MASKED_SCORE
            if has_sinks:  # the sink: one more split, of log-sum-exp sinks[h] (log2 units) and output 0
                lse_max = T.max(lse_max, T.cast(Sinks[h], ACCUM) * LOG2_E)
            for s in T.serial(num_split):
                lse_max = T.max(lse_max, partial_lse[bb, h, s])
            lse_total = 0
            if has_sinks:
                lse_total = T.exp2(T.cast(Sinks[h], ACCUM) * LOG2_E - lse_max)
            for s in T.serial(num_split):
                lse_total += T.exp2(partial_lse[bb, h, s] - lse_max)
            acc = T.alloc_var(ACCUM)
            acc = 0
            for s in T.serial(num_split):
                acc += partial_out[bb, h, s, tx] * T.exp2(partial_lse[bb, h, s] - lse_max) / lse_total
            Out[bb, h, tx] = T.cast(acc, dtype)

    # one signature per combination of the optional inputs: kernel(Q, K, V[, Mask][, Sinks], outputs...)
    if mask is not None and sinks:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Mask: T.Tensor(mask_shape, mask_dtype), Sinks: T.Tensor(sinks_shape, sinks_dtype),
                 partial_out: T.Tensor(partial_shape, ACCUM), partial_lse: T.Tensor(lse_shape, ACCUM), Out: T.Tensor(q_shape, dtype)):
            body(Q, K, V, Mask, Sinks, partial_out, partial_lse, Out)

    elif mask is not None:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Mask: T.Tensor(mask_shape, mask_dtype),
                 partial_out: T.Tensor(partial_shape, ACCUM), partial_lse: T.Tensor(lse_shape, ACCUM), Out: T.Tensor(q_shape, dtype)):
            body(Q, K, V, Mask, None, partial_out, partial_lse, Out)

    elif sinks:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 Sinks: T.Tensor(sinks_shape, sinks_dtype),
                 partial_out: T.Tensor(partial_shape, ACCUM), partial_lse: T.Tensor(lse_shape, ACCUM), Out: T.Tensor(q_shape, dtype)):
            body(Q, K, V, None, Sinks, partial_out, partial_lse, Out)

    else:

        @T.prim_func
        def main(Q: T.Tensor(q_shape, dtype), K: T.Tensor(kv_shape, dtype), V: T.Tensor(kv_shape, dtype),
                 partial_out: T.Tensor(partial_shape, ACCUM), partial_lse: T.Tensor(lse_shape, ACCUM), Out: T.Tensor(q_shape, dtype)):
            body(Q, K, V, None, None, partial_out, partial_lse, Out)

    return main


def flash_attention_forward(
    batch: int,
    heads: int,
    seq_len: int | None,
    head_dim: int,
    causal: bool = False,
    dtype: str = "float16",
    block_m: int | None = None,
    block_n: int | None = None,
    threads: int | None = None,
    target: Any = None,
    execution_backend: str | None = None,
    **options: Any,
) -> Any:
    """The compiled flash-attention forward kernel, called as `kernel(q, k, v[, mask][, sinks]) -> out`
    with (batch, seq, heads, dim) tensors (`options`: kv_heads, seq_len_kv, mask, sinks, layout,
    num_stages, dataflow: see flash_attention_program, which also says how the causal mask aligns
    when seq_len_kv != seq_len); the dataflow is the target's unless `dataflow` says otherwise."""
    import tilelang

    target = target or "metal"
    program = flash_attention_program(
        batch, heads, seq_len, head_dim, causal=causal, dtype=dtype, block_m=block_m, block_n=block_n, threads=threads,
        target=target, **options
    )
    kwargs = {"execution_backend": execution_backend} if execution_backend else {}
    out = 3 + _optional_inputs(options.get("mask"), options.get("sinks", False))
    return tilelang.compile(program, out_idx=[out], target=target, **kwargs)
