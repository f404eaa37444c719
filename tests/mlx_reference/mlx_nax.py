"""MLX's NAX (MetalPerformancePrimitives) kernels, unmodified, in the emulator: wrappers and launches.

`gemm_fused_nax(a, b, transpose_a=..., transpose_b=...)` and `attention_nax(q, k, v, causal=...)`
return the output of one launch with the launch parameters MLX's host code computes, and
`*_launch(...)` returns that `Launch` itself (mlx_launch.py: kernel, arguments, grid, block) so that a
caller can take `launch.counters()` or `launch.racecheck()` of the very same launch (a benchmark
imports this).

Host code: MLX's `mlx/backend/metal/matmul.cpp` (`steel_matmul_regular_axpby_nax`) and
`mlx/backend/metal/scaled_dot_product_attention.cpp` (`sdpa_full_self_attention_nax`), read at
ml-explore/mlx commit 846d17622 (version 0.32.2; the stored history has no 0.32.4 tag). The kernel
headers those functions launch are byte-identical in 0.32.2 and in the mlx-metal 0.32.4 wheel for the
GEMM (`steel_gemm_fused_nax.h`, `gemm_nax.h`, `nax.h`, `params.h`); the attention header of 0.32.4 adds a
value head dim template parameter `BV` and a `save_lse` function constant (303, buffer 8), see
`attention_nax_launch`. Each value below says where it comes from.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import torch

from tilelang_metal.emulator import compile_msl

from mlx_launch import Launch

_TYPE_NAMES = {torch.float16: ("float16", "half"), torch.bfloat16: ("bfloat16", "bfloat"), torch.float32: ("float32", "float")}


# ---------------------------------------------------------------- GEMM (steel_gemm_fused_nax)

class GEMMParams(ctypes.Structure):  # mlx/backend/metal/kernels/steel/gemm/params.h
    _fields_ = [(n, ctypes.c_int) for n in ("M", "N", "K", "lda", "ldb", "ldd", "tiles_n", "tiles_m")] + [
        (n, ctypes.c_int64) for n in ("batch_stride_a", "batch_stride_b", "batch_stride_d")] + [
        (n, ctypes.c_int) for n in ("swizzle_log", "gemm_k_iterations_aligned", "batch_ndim")]


# The kernel's file as MLX's `steel_gemm_fused_nax.metal` builds it: includes and one instantiation
# of `gemm<T, BM, BN, BK, WM, WN, transpose_a, transpose_b, float>` under MLX's host name.
_GEMM_SOURCE = """
#include <metal_stdlib>
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/gemm/gemm_nax.h"
#include "mlx/backend/metal/kernels/steel/gemm/kernels/steel_gemm_fused_nax.h"
template [[host_name("{name}")]] [[kernel]] decltype(gemm<{t}, {bm}, {bn}, {bk}, {wm}, {wn}, {ta}, {tb}, float>)
    gemm<{t}, {bm}, {bn}, {bk}, {wm}, {wn}, {ta}, {tb}, float>;
"""


@functools.lru_cache(maxsize=None)
def _gemm_kernel(include: str, dtype: torch.dtype, ta: bool, tb: bool, tiles: tuple[int, int, int, int, int],
                 align: tuple[bool, bool, bool], out_source: tuple[bool, bool] = (False, False)):
    iname, mtype = _TYPE_NAMES[dtype]
    bm, bn, bk, wm, wn = tiles
    name = (f"steel_gemm_fused_nax_{'t' if ta else 'n'}{'t' if tb else 'n'}_{iname}_{iname}"
            f"_bm{bm}_bn{bn}_bk{bk}_wm{wm}_wn{wn}")
    src = _GEMM_SOURCE.format(name=name, t=mtype, bm=bm, bn=bn, bk=bk, wm=wm, wn=wn,
                              ta=str(ta).lower(), tb=str(tb).lower())
    # function constants of steel_matmul_regular_axpby_nax: has_batch (10) = batch_shape.size() > 1,
    # false for one matrix and for one batch axis; use_out_source (100) and do_axpby (110): AddMM's
    # output source, and alpha, beta other than 1 (`out_source`); align_M/N/K (200-202) = M % bm == 0,
    # N % bn == 0, K % bk == 0.
    constants = {10: False, 100: out_source[0], 110: out_source[1], 200: align[0], 201: align[1], 202: align[2]}
    return compile_msl(src, name, include_dirs=[include], function_constants=constants)


def gemm_tiles(M: int, N: int, K: int, device: str = "g") -> tuple[int, int, int, int, int]:
    """(bm, bn, bk, wm, wn) of steel_matmul_regular_axpby_nax: 128, 128, 512, 4, 4, and on devices
    whose architecture ends in 's', 'c' or 'd' bm = 64, wm = 2, bk = 64 if K >= 8192 and K > M + N
    else 256."""
    if device in ("s", "c", "d"):
        return 64, 128, (64 if (K >= 8192 and K > M + N) else 256), 2, 4
    return 128, 128, 512, 4, 4


def swizzle_log_for(tiles_m: int, device: str = "g") -> int:
    """The block swizzle steel_matmul_regular_axpby_nax launches with: 2 on devices whose architecture
    ends in 's', 'c' or 'd', else 1, or 0 when at most 3 tiles cover M."""
    return 2 if device in ("s", "c", "d") else (0 if tiles_m <= 3 else 1)


def gemm_fused_nax_launch(include: str, a: torch.Tensor, b: torch.Tensor, *, transpose_a: bool = False,
                          transpose_b: bool = False, device: str = "g", c: torch.Tensor | None = None,
                          alpha: float = 1.0, beta: float = 1.0) -> Launch:
    """D = op(a) @ op(b) with MLX's fused NAX GEMM. `a` and `b` are the stored row-major matrices:
    `a` is M x K (K x M when transpose_a), `b` K x N (N x K when transpose_b), as MLX's
    check_transpose sees a transposed view (stride 1 along rows, the row count as leading dim).
    3-D a and b: a batch on the grid's z axis; `c`: AddMM's output source (mlx_gemm.steel_gemm)."""
    from mlx_gemm import addmm_params, batched_mkn

    batch, M, N, K = batched_mkn(a, b, transpose_a, transpose_b)
    bm, bn, bk, wm, wn = gemm_tiles(M, N, K, device)
    out_source = (c is not None, c is not None and not (alpha == 1.0 and beta == 1.0))
    kernel = _gemm_kernel(include, a.dtype, transpose_a, transpose_b, (bm, bn, bk, wm, wn),
                          (M % bm == 0, N % bn == 0, K % bk == 0), out_source)
    tn, tm = math.ceil(N / bn), math.ceil(M / bm)
    swizzle_log = swizzle_log_for(tm, device)
    params = GEMMParams(M=M, N=N, K=K, lda=a.shape[-1], ldb=b.shape[-1], ldd=N, tiles_n=tn, tiles_m=tm,
                        batch_stride_a=M * K if batch > 1 else 0, batch_stride_b=K * N if batch > 1 else 0,
                        batch_stride_d=M * N, swizzle_log=swizzle_log, gemm_k_iterations_aligned=K // bk, batch_ndim=1)
    tile = 1 << swizzle_log
    grid = (tn * tile, math.ceil(tm / tile), batch)  # MTL::Size(tn, tm, batch_size_out) after the swizzle
    block = (32, wn, wm)  # MTL::Size(32, wn, wm)
    d = torch.full((*a.shape[:-2], M, N), float("nan"), dtype=a.dtype)
    # buffers 0 A, 1 B, 3 D, 4 params; 2 (C) and 5 (addmm_params) with use_out_source, 6 and 7
    # (batch shape and strides) with has_batch (false)
    if c is not None:
        args = (a.contiguous(), b.contiguous(), c, d, bytes(params), bytes(addmm_params(c, M, N, alpha, beta)))
    else:
        args = (a.contiguous(), b.contiguous(), d, bytes(params))
    return Launch.of(d, (kernel, args, grid, block))


def gemm_fused_nax(include: str, a: torch.Tensor, b: torch.Tensor, **kw: Any) -> torch.Tensor:
    return gemm_fused_nax_launch(include, a, b, **kw).run()


# ---------------------------------------------------------------- attention (attention_nax)

class AttnParams(ctypes.Structure):  # mlx/backend/metal/kernels/steel/attn/params.h
    _fields_ = [(n, ctypes.c_int) for n in ("B", "H", "D", "qL", "kL", "gqa_factor")] + [("scale", ctypes.c_float)] + [
        (n, ctypes.c_int) for n in ("NQ", "NK", "NQ_aligned", "NK_aligned", "qL_rem", "kL_rem", "qL_off")] + [
        (n, ctypes.c_int64 * 3) for n in ("Q_strides", "K_strides", "V_strides", "O_strides")]


# As MLX's `steel_attention_nax.metal` instantiates it (instantiate_attn), with 0.32.4's BV after BD.
_ATTN_SOURCE = """
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/attn/kernels/steel_attention_nax.h"
template [[host_name("{name}")]] [[kernel]] decltype(attention_nax<{t}, {bq}, {bk}, {bd}, {bv}, {wm}, {wn}, {t}, float>)
    attention_nax<{t}, {bq}, {bk}, {bd}, {bv}, {wm}, {wn}, {t}, float>;
"""

# sdpa_full_self_attention_nax: bq = 64, bk = 32, wm = 4, wn = 1 (wn = 2 and the dsplit kernel only
# for head dim 256).
ATTN_BQ, ATTN_BK, ATTN_WM, ATTN_WN = 64, 32, 4, 1


@functools.lru_cache(maxsize=None)
def _attention_kernel(include: str, dtype: torch.dtype, head_dim: int, align_q: bool, align_k: bool, causal: bool):
    iname, mtype = _TYPE_NAMES[dtype]
    # MLX's host name; the mask type is q's type when there is no mask (type_to_name(has_mask ? *mask : q))
    name = f"steel_attention_{iname}_bq{ATTN_BQ}_bk{ATTN_BK}_bd{head_dim}_wm{ATTN_WM}_wn{ATTN_WN}_mask{iname}"
    src = _ATTN_SOURCE.format(name=name, t=mtype, bq=ATTN_BQ, bk=ATTN_BK, bd=head_dim, bv=head_dim, wm=ATTN_WM, wn=ATTN_WN)
    # align_Q (200) = qL % bq == 0, align_K (201) = kL % bk == 0, has_mask (300) false (no array
    # mask), do_causal (301), has_sinks (302) false; save_lse (303, new in 0.32.4's header, not in
    # the 0.32.2 host code) false: the inference path stores no log-sum-exp.
    constants = {200: align_q, 201: align_k, 300: False, 301: causal, 302: False, 303: False}
    return compile_msl(src, name, include_dirs=[include], function_constants=constants)


def attention_nax_launch(include: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool = False,
                         scale: float | None = None) -> Launch:
    """softmax(scale * q k^T [+ causal mask]) v for q [B, H, qL, D], k and v [B, H_kv, kL, D]
    (contiguous), as MLX's fused NAX attention. The causal mask is MLX's: query i sees keys
    j <= i + (kL - qL) (aligned at the bottom right)."""
    B, H, qL, D = q.shape
    kL = k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    kernel = _attention_kernel(include, q.dtype, D, qL % ATTN_BQ == 0, kL % ATTN_BK == 0, causal)
    NQ, NK = math.ceil(qL / ATTN_BQ), math.ceil(kL / ATTN_BK)
    NQ_aligned, NK_aligned = qL // ATTN_BQ, kL // ATTN_BK
    o = torch.full_like(q, float("nan"))
    strides = [(t.stride(0), t.stride(1), t.stride(2)) for t in (q, k, v, o)]
    params = AttnParams(B=B, H=H, D=D, qL=qL, kL=kL, gqa_factor=H // k.shape[1], scale=scale, NQ=NQ, NK=NK,
                        NQ_aligned=NQ_aligned, NK_aligned=NK_aligned, qL_rem=qL - NQ_aligned * ATTN_BQ,
                        kL_rem=kL - NK_aligned * ATTN_BK, qL_off=kL - qL,  # no chunked-cache widening of kL (bd != 256)
                        Q_strides=(ctypes.c_int64 * 3)(*strides[0]), K_strides=(ctypes.c_int64 * 3)(*strides[1]),
                        V_strides=(ctypes.c_int64 * 3)(*strides[2]), O_strides=(ctypes.c_int64 * 3)(*strides[3]))
    # buffers Q, K, V, O, params; mask_params, mask, sinks and lse exist only under their function
    # constants, all false here, so they take no argument
    args = (q.contiguous(), k.contiguous(), v.contiguous(), o, bytes(params))
    return Launch.of(o, (kernel, args, (NQ, H, B), (32, ATTN_WM, ATTN_WN)))  # grid MTL::Size(NQ, H, B)


def attention_nax(include: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> torch.Tensor:
    return attention_nax_launch(include, q, k, v, **kw).run()


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """torch in float32, with MLX's bottom-right causal alignment and grouped K/V heads."""
    qf, kf, vf = (t.float() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    kf, vf = kf.repeat_interleave(rep, 1), vf.repeat_interleave(rep, 1)
    mask = None
    if causal:
        qL, kL = q.shape[2], k.shape[2]
        mask = torch.arange(kL)[None, :] <= torch.arange(qL)[:, None] + (kL - qL)
    return torch.nn.functional.scaled_dot_product_attention(qf, kf, vf, attn_mask=mask)
