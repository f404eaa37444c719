"""MLX's attention kernels (steel attention for prefill, sdpa_vector and its 2-pass variant for
decode), unmodified, with the launch logic of MLX's host code: parameters, function constants and
grids as `mlx/backend/metal/scaled_dot_product_attention.cpp` fills them. Each function returns a
`Launch` (mlx_launch.py): `.run()` gives the output, `.counters()` / `.racecheck()` take the same launch
instrumented. Imported by the tests next to it and by `benchmark/compare_mlx.py`.

Host-code provenance: the newest `scaled_dot_product_attention.cpp` available here (ml-explore/mlx
main at the time of writing, version.h 0.32.2). The 0.32.4 kernels add template and buffer slots
that host code does not fill; what is used for each is said where it is set.
"""

from __future__ import annotations

import ctypes
import functools
import math
from typing import Any

import torch

from tilelang_metal.emulator import compile_msl

from mlx_launch import Launch

# MLX's type_to_name / get_type_string: the names in its host names, and the MSL type of each.
MLX_TYPE = {torch.float16: ("float16", "half"), torch.bfloat16: ("bfloat16", "bfloat16_t"), torch.float32: ("float32", "float")}


@functools.lru_cache(maxsize=None)
def _compile(source: str, host_name: str, include: str, constants: tuple[tuple[int, Any], ...]):
    return compile_msl(source, host_name, include_dirs=[include], function_constants=dict(constants))


# ---------------------------------------------------------------- steel attention (prefill)

class AttnParams(ctypes.Structure):
    """mlx::steel::AttnParams (steel/attn/params.h), natural C layout as on the GPU."""

    _fields_ = [(n, ctypes.c_int) for n in ("B", "H", "D", "qL", "kL", "gqa_factor")] + [("scale", ctypes.c_float)] + [
        (n, ctypes.c_int) for n in ("NQ", "NK", "NQ_aligned", "NK_aligned", "qL_rem", "kL_rem", "qL_off")
    ] + [(n, ctypes.c_int64 * 3) for n in ("Q_strides", "K_strides", "V_strides", "O_strides")]


class AttnMaskParams(ctypes.Structure):
    _fields_ = [("M_strides", ctypes.c_int64 * 3)]


def steel_attention_source(dtype: torch.dtype, bq: int, bk: int, bd: int, wm: int, wn: int, mask_dtype: torch.dtype) -> tuple[str, str]:
    """Our wrapper: one instantiation, named as MLX's steel_attention.metal names it."""
    tname, ttype = MLX_TYPE[dtype]
    mname, mtype = ("bool_", "bool") if mask_dtype == torch.bool else MLX_TYPE[mask_dtype]
    host = f"steel_attention_{tname}_bq{bq}_bk{bk}_bd{bd}_wm{wm}_wn{wn}_mask{mname}"
    # BV (value head dim) = BD: the host code here has no separate value head dim for this kernel.
    args = f"{ttype}, {bq}, {bk}, {bd}, {bd}, {wm}, {wn}, {mtype}, float"
    source = f"""
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/steel/attn/kernels/steel_attention.h"
template [[host_name("{host}")]] [[kernel]] decltype(attention<{args}>) attention<{args}>;
"""
    return source, host


def steel_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, include: str,
                    causal: bool = False, mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                    wn: int = 1) -> Launch:
    """sdpa_full_self_attention_metal: q (B, H, qL, D), k / v (B, H_kv, kL, D) contiguous; `mask`
    broadcastable to (B, H, qL, kL), bool (keep) or additive in q's dtype; `sinks` (H,). Output
    (B, H, qL, D), stored by the kernel in MLX's (B, qL, H, D) layout. `wn` = 2 selects the kernel's
    head-dim split across two simdgroups (the 0.32.4 header supports WN 1 and 2; the host code here
    always uses 1)."""
    B, H, qL, D = q.shape
    kL = k.shape[2]
    gqa_factor = H // k.shape[1]
    # scaled_dot_product_attention.cpp: wm 4, wn 1, bq 32, bk 32 below head dim 128 else 16, bd = D.
    wm, bq, bk, bd = 4, 32, (32 if D < 128 else 16), D
    align_q, align_k = qL % bq == 0, kL % bk == 0
    constants = ((200, align_q), (201, align_k), (300, mask is not None), (301, causal), (302, sinks is not None),
                 (303, False))  # save_lse (303, 0.32.4): the forward pass stores no logsumexp
    source, host = steel_attention_source(q.dtype, bq, bk, bd, wm, wn, mask.dtype if mask is not None else q.dtype)
    kernel = _compile(source, host, include, constants)
    nq, nk = (qL + bq - 1) // bq, (kL + bk - 1) // bk
    nq_aligned, nk_aligned = qL // bq, kL // bk
    out = torch.full((B, qL, H, D), float("nan"), dtype=q.dtype)  # eval_gpu allocates O as (B, L, H, D)
    o_strides = (qL * H * D, D, H * D)  # {str_oB, str_oH, str_oL}
    params = AttnParams(B, H, D, qL, kL, gqa_factor, scale, nq, nk, nq_aligned, nk_aligned,
                        qL - nq_aligned * bq, kL - nk_aligned * bk, kL - qL,  # qL_rem, kL_rem, qL_off
                        (ctypes.c_int64 * 3)(*q.stride()[:3]), (ctypes.c_int64 * 3)(*k.stride()[:3]),
                        (ctypes.c_int64 * 3)(*v.stride()[:3]), (ctypes.c_int64 * 3)(*o_strides))
    args: list[Any] = [q, k, v, out, params]
    if mask is not None:
        m = mask.contiguous()  # broadcast axes get stride 0, as an MLX broadcast array has
        m_strides = m.expand(B, H, qL, kL).stride()[:3]
        args += [AttnMaskParams((ctypes.c_int64 * 3)(*m_strides)), m]
    if sinks is not None:
        args.append(sinks)
    # grid (NQ, H, B) threadgroups of (32, wm, wn) threads
    steps = [(kernel, args, (nq, H, B), (32, wm, wn))]
    return Launch.of(out.transpose(1, 2), *steps)


# ---------------------------------------------------------------- sdpa_vector (decode)

SDPA_VECTOR_PREAMBLE = """
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/sdpa_vector.h"
"""


def _vector_constants(mask: torch.Tensor | None, causal: bool, sinks: torch.Tensor | None,
                      blocks: int | None = None) -> tuple[tuple[int, Any], ...]:
    # sdpa_vector / sdpa_vector_2pass: has_mask 20, query_transposed 21 (q row-contiguous here),
    # do_causal 22, bool_mask 23, float_mask 24, has_sinks 25; blocks 26 for the 2-pass kernel only.
    has_mask = mask is not None
    bool_mask = has_mask and mask.dtype == torch.bool
    fc = [(20, has_mask), (21, False), (22, causal), (23, bool_mask), (24, has_mask and not bool_mask), (25, sinks is not None)]
    if blocks is not None:
        fc.append((26, blocks))
    return tuple(fc)


def _mask_strides(mask: torch.Tensor) -> tuple[int, int, int]:
    """kv_seq_stride, q_seq_stride, head_stride as sdpa_vector sets them (0 along broadcast axes)."""
    shape, strides = mask.shape, mask.stride()
    kv = strides[3] if shape[3] > 1 else 0
    qs = strides[2] if shape[2] > 1 else 0
    head = strides[1] if shape[1] > 1 else (strides[0] if shape[0] > 1 else 0)
    return kv, qs, head


def sdpa_vector(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, include: str,
                causal: bool = False, mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> Launch:
    """The 1-pass decode kernel: q (B, Hq, qL <= 8, D), k / v (B, Hkv, N, D) contiguous."""
    B, Hq, qL, D = q.shape
    N, Dv = k.shape[2], v.shape[3]
    tname, ttype = MLX_TYPE[q.dtype]
    host = f"sdpa_vector_{tname}_{D}_{Dv}"
    source = SDPA_VECTOR_PREAMBLE + (
        f'template [[host_name("{host}")]] [[kernel]] decltype(sdpa_vector<{ttype}, {D}, {Dv}>) sdpa_vector<{ttype}, {D}, {Dv}>;\n')
    kernel = _compile(source, host, include, _vector_constants(mask, causal, sinks))
    out = torch.full((B, Hq, qL, Dv), float("nan"), dtype=q.dtype)
    k_head_stride = k.stride(0) if k.shape[1] == 1 else k.stride(1)
    v_head_stride = v.stride(0) if v.shape[1] == 1 else v.stride(1)
    args: list[Any] = [q, k, v, out, Hq // k.shape[1], N, k_head_stride, k.stride(2), v_head_stride, v.stride(2), scale]
    if mask is not None:
        args += [mask, *_mask_strides(mask)]  # buffer 11 (bool) or 12 (float), then 13-15
    if sinks is not None:
        args += [sinks, Hq]  # buffers 16, 17
    # grid (B * Hq, qL, 1) threadgroups of 1024 threads
    return Launch.of(out, (kernel, args, (B * Hq, qL, 1), (1024, 1, 1)))


def sdpa_vector_2pass(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, include: str,
                      causal: bool = False, mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None,
                      blocks: int | None = None) -> Launch:
    """sdpa_vector_2pass_1 (partials per block of keys) then sdpa_vector_2pass_2 (their merge)."""
    B, Hq, qL, D = q.shape
    Hkv, N, Dv = k.shape[1], k.shape[2], v.shape[3]
    gqa_factor = Hq // Hkv
    if blocks is None:
        # The host's choice for a device that is neither 'd' nor 's' (an M-series base/Pro GPU):
        # 64 blocks when gqa_factor * qL >= 4 simdgroups, else 32.
        blocks = 64 if gqa_factor * qL >= 4 else 32
    tname, ttype = MLX_TYPE[q.dtype]
    host1, host2 = f"sdpa_vector_2pass_1_{tname}_{D}_{Dv}", f"sdpa_vector_2pass_2_{tname}_{Dv}"
    # TK (keys prefetched per step, 0.32.4) keeps its default 4.
    inst1 = f"sdpa_vector_2pass_1<{ttype}, {D}, {Dv}>"
    inst2 = f"sdpa_vector_2pass_2<{ttype}, {Dv}>"
    source = SDPA_VECTOR_PREAMBLE + (
        f'template [[host_name("{host1}")]] [[kernel]] decltype({inst1}) {inst1};\n'
        f'template [[host_name("{host2}")]] [[kernel]] decltype({inst2}) {inst2};\n')
    pass1 = _compile(source, host1, include, _vector_constants(mask, causal, sinks, blocks))
    pass2 = _compile(source, host2, include, _vector_constants(mask, causal, sinks, blocks))
    intermediate = torch.full((B, Hq, qL, blocks, Dv), float("nan"), dtype=q.dtype)
    sums = torch.full((B, Hq, qL, blocks), float("nan"))
    maxs = torch.full((B, Hq, qL, blocks), float("nan"))
    out = torch.full((B, Hq, qL, Dv), float("nan"), dtype=q.dtype)
    k_head_stride = k.stride(0) if Hkv == 1 else k.stride(1)
    v_head_stride = v.stride(0) if v.shape[1] == 1 else v.stride(1)
    # buffers 0-5, then 7-12 (the kernel has no buffer 6)
    args1: list[Any] = [q, k, v, intermediate, sums, maxs, N, k_head_stride, k.stride(2), v_head_stride, v.stride(2), scale]
    if mask is not None:
        args1 += [mask, *_mask_strides(mask)]  # buffer 13 (bool) or 14 (float), then 15-17
    if sinks is not None:
        args1.append(sinks)  # buffer 18
    steps = [
        (pass1, args1, (Hkv, B, blocks), (32, gqa_factor, qL)),  # grid (Hkv, B, blocks), group (32, gqa, qL)
        (pass2, [intermediate, sums, maxs, out, blocks], (B * Hq, qL, 1), (1024, 1, 1)),
    ]
    return Launch.of(out, *steps)


# ---------------------------------------------------------------- reference

def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float, causal: bool = False,
                        mask: torch.Tensor | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Attention in float64 with MLX's conventions: GQA by head groups, causal aligned to the end of
    the keys (query i sees keys j <= i + kL - qL), a bool mask keeps, a float mask adds, a sink is
    one more logit per head with a zero value."""
    B, H, qL, D = q.shape
    kL = k.shape[2]
    g = H // k.shape[1]
    kk = k.double().repeat_interleave(g, 1)
    vv = v.double().repeat_interleave(g, 1)
    s = (q.double() @ kk.transpose(-1, -2)) * scale
    if causal:
        keep = torch.arange(kL)[None, :] <= torch.arange(qL)[:, None] + (kL - qL)
        s = s.masked_fill(~keep, float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    if sinks is not None:
        sink = sinks.double().view(1, H, 1, 1).expand(B, H, qL, 1)
        p = torch.softmax(torch.cat([s, sink], -1), -1)[..., :kL]
    else:
        p = torch.softmax(s, -1)
    return p @ vv


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)
