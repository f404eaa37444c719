"""Registers per thread and threadgroup memory of MLX's reference kernels, estimated per kernel family
from its template parameters (MLX 0.32.4 headers, the version tests/mlx_reference pins), by the rules
the plugin's kernels are estimated by (tilelang_metal/performance/register_budget.py): the thread arrays the
family declares (simdgroup 8x8 fragments: 2 values per lane; NAX 16x16 fragments: 8), counted at
their element type (16-bit values half a register), plus addresses (5 indices and a loop counter, one
running offset per device buffer, and with threadgroup memory one per threadgroup array it reads plus
one for the stores) and 2 reserved. Estimates, not what Apple's compiler allocates. Families:

- steel GEMM (steel/gemm/mma.h BlockMMA; steel_gemm_fused, steel_gemm_splitk): TM = BM / (8 WM), TN =
  BN / (8 WN); Ctile TM x TN fragments of float, Atile TM and Btile TN fragments of T; threadgroup As
  BM x (BK + 16/sizeof(T)) and Bs BK x (BN + pad) (transposed operands swap the sides); WM WN 32 threads.
- NAX GEMM (steel_gemm_fused_nax.h, gemm_nax.h): SM = BM / WM, SN = BN / WN, SK = 32; Dtile
  (SM/16) x (SN/16) NAX fragments of float, Atile (SM/16) x 2 and Btile 2 x (SN/16) of T; no
  threadgroup memory.
- steel attention (steel_attention.h, WN = 1: MMA inputs in float): TK = BK / 8, TD = BD / 8;
  Qtile, Vtile, Qtiles[1] one fragment each, Ktile and Stile TK, Otile TD (float), row max and sum
  (1 row per thread each); threadgroup Q_smem BQ x (BD + pad), KV_smem max((BK + pad) BD, BK (BD + pad)).
- NAX attention (steel_attention_nax.h): TQ = BQ / (16 WM), TK = BK / 16, TD = D / 16; Otile TQ x TD
  and Stile TQ x TK of float, Qtile 1, Ktile 2, Vtile 2 fragments of T, row max and sum (2 rows per
  thread each); no threadgroup memory.
- sdpa_vector_2pass_1 (sdpa_vector.h, TK = 4): q[D/32] and o[D/32] float, k_reg[TK][D/32] and
  v_reg[TK][D/32] of T, the running max and sum; no threadgroup memory.
- gemv_t (gemv.h GEMVTKernel): result[TN], v_coeff[TM] float, inter[TN] of T; threadgroup
  BM (SN TN + TN) floats when BM > 1; 32 BN BM threads.
- block softmax (softmax.h softmax_single_row, N_READS = 4): ld[4] float, the running max and
  normalizer; threadgroup local_max[32], local_normalizer[32] float.
- affine qmv_fast (quantized.h qmv_fast_impl, 2 simdgroups of 4 rows): x_thread[values_per_thread]
  (16 at 4 bits, 8 at 8: 2 packs of a word's values a lane, 1 at 2 bits) and result[4], float; five
  device buffers (w, scales, biases, x, y); no threadgroup memory.
- affine qmm_t (quantized.h qmm_t_impl, BM = BN = BK = 32, WM = WN = 2): the steel GEMM estimate of that
  tile with the weights' side transposed (BlockMMA, Xs and Ws BM x (BK + pad)), five device buffers.
- row reduce (reduction/reduce_row.h, N_READS = 4, N_WRITES = 1): totals[1] and the 4 values a step
  reads, float; threadgroup shared_vals[32] float.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tilelang_metal.performance.register_budget import Occupancy, registers, threadgroups_per_core

_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}
_IDS_AND_COUNTER, _RESERVED = 5, 2


@dataclass(frozen=True)
class FamilyEstimate:
    """One MLX kernel's registers per thread (32-bit, an estimate), threads and threadgroup memory."""

    family: str
    arrays: int
    device_buffers: int
    threadgroup_arrays: int
    threads: int
    threadgroup_bytes: int

    @property
    def addresses(self) -> int:
        tg = self.threadgroup_arrays + 1 if self.threadgroup_arrays else 0
        return _IDS_AND_COUNTER + self.device_buffers + tg

    @property
    def registers(self) -> int:
        return self.arrays + self.addresses + _RESERVED

    def occupancy(self) -> Occupancy:
        return threadgroups_per_core(self.threads, self.threadgroup_bytes, self.registers)


def steel_gemm(bm: int, bn: int, bk: int, wm: int, wn: int, dtype: str, *, transpose_a: bool = False,
               transpose_b: bool = False, family: str = "steel_gemm_fused") -> FamilyEstimate:
    tm, tn = bm // (8 * wm), bn // (8 * wn)
    arrays = registers(tm * tn * 2, "float32") + registers((tm + tn) * 2, dtype)
    size = _BYTES[dtype]
    pad = 16 // size
    a = bk * (bm + pad) if transpose_a else bm * (bk + pad)
    b = bn * (bk + pad) if transpose_b else bk * (bn + pad)
    return FamilyEstimate(family, arrays, 3, 2, wm * wn * 32, (a + b) * size)


def nax_gemm(bm: int, bn: int, bk: int, wm: int, wn: int, dtype: str) -> FamilyEstimate:
    tm, tn = bm // wm // 16, bn // wn // 16
    arrays = registers(tm * tn * 8, "float32") + registers((tm * 2 + 2 * tn) * 8, dtype)
    return FamilyEstimate("steel_gemm_fused_nax", arrays, 3, 0, wm * wn * 32, 0)


def steel_attention(bq: int, bk: int, head_dim: int, wm: int, dtype: str) -> FamilyEstimate:
    tk, td = bk // 8, head_dim // 8
    arrays = registers((1 + tk + tk + 1 + td + 1) * 2 + 2, "float32")
    size = _BYTES[dtype]
    pad = 16 // size
    kv = max((bk + pad) * head_dim, bk * (head_dim + pad))
    return FamilyEstimate("steel_attention", arrays, 4, 2, wm * 32, (bq * (head_dim + pad) + kv) * size)


def nax_attention(bq: int, bk: int, head_dim: int, wm: int, wn: int, dtype: str) -> FamilyEstimate:
    tq, tk, td = bq // (16 * wm), bk // 16, head_dim // 16
    arrays = registers((tq * td + tq * tk) * 8 + 4, "float32") + registers((1 + 2 + 2) * 8, dtype)
    return FamilyEstimate("steel_attention_nax", arrays, 4, 0, wm * wn * 32, 0)


def sdpa_vector_2pass(head_dim: int, dtype: str, threads: int, tk: int = 4) -> FamilyEstimate:
    per = head_dim // 32
    arrays = registers(2 * per + 2, "float32") + registers(2 * tk * per, dtype)
    return FamilyEstimate("sdpa_vector_2pass_1", arrays, 6, 0, threads, 0)


def gemv_t(bm: int, bn: int, sm: int, sn: int, tm: int, tn: int, dtype: str) -> FamilyEstimate:
    arrays = registers(tn + tm, "float32") + registers(tn, dtype)
    tg = bm * (sn * tn + tn) * 4 if bm > 1 else 0
    return FamilyEstimate("gemv_t", arrays, 3, 1 if tg else 0, 32 * bn * bm, tg)


def block_softmax(threads: int) -> FamilyEstimate:
    return FamilyEstimate("block_softmax", registers(4 + 2, "float32"), 2, 2, threads, 2 * 32 * 4)


def row_reduce(threads: int) -> FamilyEstimate:
    return FamilyEstimate("row_reduce", registers(1 + 4, "float32"), 2, 1, threads, 32 * 4)


def affine_qmv_fast(bits: int, dtype: str) -> FamilyEstimate:
    per_word = 32 // bits if 32 % bits == 0 else 8  # get_pack_factor<bits, 32>: 3 and 5 bits pack 8 per 3 / 5 bytes
    values = per_word * (1 if bits == 2 else 2)
    return FamilyEstimate("affine_qmv_fast", registers(values + 4, "float32"), 5, 0, 64, 0)


def affine_qmm_t(dtype: str) -> FamilyEstimate:
    return replace(steel_gemm(32, 32, 32, 2, 2, dtype, transpose_b=True, family="affine_qmm_t"), device_buffers=5)
