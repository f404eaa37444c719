"""MLX's kernels for compare_mlx.py: the kernel MLX's dispatch picks for each problem and chip class,
launched through the MLX reference tier's modules (tests/mlx_reference/mlx_*.py: MLX 0.32.x host
logic, each value's source cited there), checked against torch, counted at full size from proxies
(count_models.py). The headers come from the mlx-metal wheel, downloaded into a cache as the tier does.

Chip classes: "steel" is an M3 (MLX's default device in mlx_gemm: no neural accelerators), "steel-pro",
"steel-max" and "steel-ultra" the other M3 chips (STEEL_DEVICE: MLX's GEMM picks its steel tile by the
architecture's size-class letter), "nax" a base M5 (architecture suffix 'g'), where MLX runs its NAX
GEMM and attention.
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import count_models
import mlx_registers as families
from compare_common import (CLASSES, PROXY_BATCH, ErrorTracker, Measured, Problem, attention_mask, gemm_case, gemm_operands,
                            quantized_operands, torch_dtype)

ROOT = Path(__file__).resolve().parent.parent


@functools.lru_cache(maxsize=1)
def include() -> str:
    """MLX's kernel headers (mlx-metal, the version the tier pins) in the reference tier's cache."""
    import mlx_headers

    return str(mlx_headers.kernel_headers(ROOT / ".pytest_cache" / "d" / "mlx-metal"))


# `get_architecture()` of each steel class's chip (mlx_gemm.Device: the generation, 15 for the M3s, then
# the size-class letter: 'g' base, 'p' Pro (the M3 Pro reports applegpu_g15p; the M2 and M4 Pro report
# 's'), 's' Max, 'd' Ultra)
STEEL_DEVICE = {"steel": "applegpu_g15g", "steel-pro": "applegpu_g15p", "steel-max": "applegpu_g15s", "steel-ultra": "applegpu_g15d"}


def _occupancy(est: families.FamilyEstimate) -> tuple[int, int]:
    return est.registers, est.occupancy().threadgroups


def _counts(launch: Any) -> dict[str, float]:
    return {k: float(v) for k, v in launch.counters().items()}


def mlx_gemm(p: Problem, klass: str) -> Measured:
    import mlx_gemm as G
    import mlx_nax as X

    d = p.dims
    M, N, K, layout = d["M"], d["N"], d["K"], d["layout"]
    ta, tb = layout == "tn", layout == "nt"
    dt = torch_dtype(p.dtype)
    errors = ErrorTracker()
    device = G.Device(STEEL_DEVICE.get(klass, G.DEFAULT_DEVICE.architecture))  # nax: the M3's rules up to the NAX branch
    chip = CLASSES[klass][1]
    route = G.route(M, N, K, dt, ta, tb, device)  # MLX's Matmul::eval_gpu, before the NAX branch
    batch, bias = d.get("batch", 0), d.get("epilogue", "none") == "bias"
    if (batch or bias) and route != "gemm":  # MLX splits K only for one product; AddMM as Matmul here
        raise ValueError(f"{p.name}: MLX would run {route}, which is wired here for one product without a bias only")
    proxy_batch = PROXY_BATCH if batch else 0
    scale = batch / PROXY_BATCH if batch else 1.0
    extra = (f", batch {batch} on the grid's z axis" if batch else "") + (", addmm: the bias as output source" if bias else "")

    def source(args: tuple[Any, ...]) -> dict[str, Any]:
        return {"c": args[2]} if bias else {}  # AddMM(bias, a, b): alpha = beta = 1, so no axpby

    if route == "gemv":  # M == 1 (or N == 1): the same gemv kernel on every device
        if not (layout == "nn" and M == 1):
            raise ValueError(f"{p.name}: MLX routes gemv; only M == 1 with NN operands is wired here")
        a, b, ref = gemm_operands(M, N, K, layout, p.dtype)
        out, launch = G.gemv_t(a[0].contiguous(), b, include=include())
        errors.check(out.reshape(1, N), ref)
        est = families.gemv_t(*G._gemv_config(True, K, N), p.dtype)
        return Measured("gemv_t (vector-matrix), MLX's block config", errors.worst, _counts(launch), _occupancy(est))

    if klass == "nax":
        if route == "splitk" and not (K >= 3 * max(M, N)):
            route = "gemm"  # the NAX branch splits K only when K >= 3 max(M, N) (or > 2 max for max <= 1024)
        if route != "gemm":
            raise ValueError(f"{p.name}: MLX would run its NAX {route} kernel, which the emulator does not run yet")
        bm, bn, bk, wm, wn = X.gemm_tiles(M, N, K, "g")

        def measure(m: int, n: int) -> dict[str, float]:
            args, ref = gemm_case(m, n, K, layout, p.dtype, proxy_batch, bias)
            launch = X.gemm_fused_nax_launch(include(), *args[:2], transpose_a=ta, transpose_b=tb, device="g", **source(args))
            errors.check(launch.run(), ref)
            return _counts(launch)

        total = count_models.gemm_counts(M, N, bm, bn, measure)
        total = {k: v * scale for k, v in total.items()}
        return Measured(f"steel_gemm_fused_nax bm{bm} bn{bn} bk{bk} wm{wm} wn{wn} (base M5){extra}", errors.worst, total,
                        _occupancy(families.nax_gemm(bm, bn, bk, wm, wn, p.dtype)))

    if route == "splitk":
        bm, bn = G.splitk_tile(M, N)
        partitions = G._split_k_partitions(M, N, K)  # MLX's rule at the full size

        def measure(m: int, n: int) -> dict[str, float]:
            a, b, ref = gemm_operands(m, n, K, layout, p.dtype)
            out, launch = G.steel_gemm_splitk(a, b, transpose_a=ta, transpose_b=tb, include=include(),
                                              tile=(bm, bn), partitions=partitions)
            errors.check(out, ref)
            return _counts(launch)

        total = count_models.gemm_counts(M, N, bm, bn, measure)
        est = families.steel_gemm(bm, bn, 16, 2, 2, p.dtype, transpose_a=ta, transpose_b=tb, family="steel_gemm_splitk")
        return Measured(f"steel_gemm_splitk bm{bm} bn{bn} bk16, {partitions} partitions + accum ({chip})", errors.worst, total,
                        _occupancy(est))

    tile = G.gemm_tile(M, N, K, dt, ta, tb, device, batch=batch or 1)
    # the architecture only picks the tile: a class with another class's tile reuses its counts
    worst, total = _steel_gemm_counts(p, tile)
    est = families.steel_gemm(*tile[:5], p.dtype, transpose_a=ta, transpose_b=tb)
    return Measured("steel_gemm_fused bm{} bn{} bk{} wm{} wn{} ({})".format(*tile, chip) + extra, worst, total, _occupancy(est))


@functools.lru_cache(maxsize=None)
def _steel_gemm_counts(p: Problem, tile: tuple[int, int, int, int, int]) -> tuple[float, dict[str, float]]:
    """(largest relative error, counts at full size) of MLX's steel GEMM with `tile` on problem `p`."""
    import mlx_gemm as G

    d = p.dims
    M, N, K, layout = d["M"], d["N"], d["K"], d["layout"]
    ta, tb = layout == "tn", layout == "nt"
    batch, bias = d.get("batch", 0), d.get("epilogue", "none") == "bias"
    errors = ErrorTracker()

    def measure(m: int, n: int) -> dict[str, float]:
        args, ref = gemm_case(m, n, K, layout, p.dtype, PROXY_BATCH if batch else 0, bias)
        source = {"c": args[2]} if bias else {}  # AddMM(bias, a, b): alpha = beta = 1, so no axpby
        out, launch = G.steel_gemm(*args[:2], transpose_a=ta, transpose_b=tb, include=include(), tile=tile, **source)
        errors.check(out, ref)
        return _counts(launch)

    total = count_models.gemm_counts(M, N, tile[0], tile[1], measure)
    scale = batch / PROXY_BATCH if batch else 1.0
    return errors.worst, {k: v * scale for k, v in total.items()}


def mlx_attention(p: Problem, klass: str) -> Measured:
    import torch

    import mlx_attention as A
    import mlx_nax as X

    d = p.dims
    D, causal, mask = d["head_dim"], d["causal"], d.get("mask")
    dt = torch_dtype(p.dtype)
    errors = ErrorTracker()
    scale = 1.0 / math.sqrt(D)
    if mask and klass == "nax":
        raise ValueError(f"{p.name}: MLX's NAX attention launch (mlx_nax.attention_nax_launch) takes no mask yet; use the steel class")
    if klass == "nax":
        bq, bk, config = X.ATTN_BQ, X.ATTN_BK, f"steel_attention_nax bq{X.ATTN_BQ} bk{X.ATTN_BK} wm{X.ATTN_WM} wn{X.ATTN_WN}"
    else:
        bq, bk = 32, (32 if D < 128 else 16)
        # a mask: function constant has_mask (300), the mask broadcast over batch and heads (strides 0)
        config = f"steel_attention bq32 bk{bk} wm4 wn1" + (f", has_mask ({mask} mask)" if mask else "")

    def measure(seq: int) -> dict[str, float]:
        g = torch.Generator().manual_seed(seq)
        q, k, v = (torch.randn(1, 1, seq, D, generator=g).to(dt) for _ in range(3))
        # the plugin's mask for this proxy, seen as MLX's (B, H, qL, kL) with B = H = 1
        mask_tensor = attention_mask(mask, seq, p.dtype, seed=seq).view(1, 1, seq, seq) if mask else None
        ref = A.reference_attention(q.double(), k.double(), v.double(), scale=scale, causal=causal, mask=mask_tensor)
        if klass == "nax":
            launch = X.attention_nax_launch(include(), q, k, v, causal=causal, scale=scale)
        else:
            launch = A.steel_attention(q, k, v, scale=scale, include=include(), causal=causal, mask=mask_tensor)
        errors.check(launch.run(), ref)
        return _counts(launch)

    total = count_models.attention_counts(d["seq"], bq, bk, causal, d["heads"], measure)
    est = (families.nax_attention(bq, bk, D, X.ATTN_WM, X.ATTN_WN, p.dtype) if klass == "nax"
           else families.steel_attention(bq, bk, D, 4, p.dtype))
    return Measured(config, errors.worst, total, _occupancy(est))


def mlx_decode(p: Problem, klass: str) -> Measured:
    import torch

    import mlx_attention as A

    d = p.dims
    D, group = d["head_dim"], d["heads"] // d["kv_heads"]
    dt = torch_dtype(p.dtype)
    errors = ErrorTracker()
    scale = 1.0 / math.sqrt(D)
    blocks = 64 if group >= 4 else 32  # sdpa_vector_2pass's block count for a base/Pro device

    def measure(kv_len: int) -> dict[str, float]:
        g = torch.Generator().manual_seed(kv_len)
        q = torch.randn(1, group, 1, D, generator=g).to(dt)
        k, v = (torch.randn(1, 1, kv_len, D, generator=g).to(dt) for _ in range(2))
        launch = A.sdpa_vector_2pass(q, k, v, scale=scale, include=include(), blocks=blocks)
        ref = A.reference_attention(q.double(), k.double(), v.double(), scale=scale)
        errors.check(launch.run(), ref)
        return _counts(launch)

    total = count_models.linear_counts(d["kv_len"], (512, 1024), d["kv_heads"], measure)
    est = families.sdpa_vector_2pass(D, p.dtype, threads=32 * group)  # one simdgroup per query head of the kv head
    return Measured(f"sdpa_vector_2pass, {blocks} blocks, {group} query heads per kv head", errors.worst, total, _occupancy(est))


SOFTMAX_SOURCE = """
#include <metal_stdlib>
using namespace metal;
#include "mlx/backend/metal/kernels/utils.h"
#include "mlx/backend/metal/kernels/softmax.h"
template [[host_name("block_softmax_float32")]] [[kernel]] decltype(softmax_single_row<float>) softmax_single_row<float>;
"""
PROXY_ROWS = 32  # MLX's row reductions take row_reduce_simple from 32 rows on, as at 4096 rows


def mlx_rows(p: Problem, klass: str) -> Measured:
    import torch

    from tilelang_metal.emulator import compile_msl

    d = p.dims
    errors = ErrorTracker()
    x = torch.randn(PROXY_ROWS, d["cols"], generator=torch.Generator().manual_seed(0)).to(torch_dtype(p.dtype))
    if p.kind == "softmax":
        # softmax.cpp: axis_size <= 4096 -> block softmax, one threadgroup per row of
        # 32 * ceil(ceil(axis_size / 4) / 32) threads
        kernel = compile_msl(SOFTMAX_SOURCE, "block_softmax_float32", include_dirs=[include()])
        out = torch.zeros_like(x)
        block = 32 * math.ceil(math.ceil(d["cols"] / 4) / 32)
        args, grid = [x, out, d["cols"]], (PROXY_ROWS, 1, 1)
        kernel.launch(args, grid=grid, block=(block, 1, 1))
        errors.check(out, torch.softmax(x.float(), -1))
        counts = {k: float(v) for k, v in kernel.counters(args, grid, (block, 1, 1)).items()}
        config = f"block_softmax, {block} threads per row"
        est = families.block_softmax(block)
    else:
        import mlx_reduce as R

        name, launch = R.row_reduce(x, (1,), "sum", include=include())
        errors.check(launch.run(), x.float().sum(-1))
        counts, config = _counts(launch), name
        est = families.row_reduce(math.prod(launch.dispatches[0].block))
    return Measured(config, errors.worst, {k: v * d["rows"] / PROXY_ROWS for k, v in counts.items()}, _occupancy(est))


def mlx_quantized(p: Problem, klass: str) -> Measured:
    """The affine kernel quantized.cpp picks (mlx_quantized.route on an M3): qmv_fast on the whole 1 x N
    launch, affine_qmm_t (unsplit at the full size: mlx_quantized.qmm checks) from GEMM proxies of its
    32 x 32 tile."""
    import mlx_quantized as Q

    d = p.dims
    errors = ErrorTracker()
    K, bits, gs = d["K"], d["bits"], d["group_size"]
    if p.kind == "qmv":
        x, w_q, scales, biases, ref = quantized_operands(d["M"], d["N"], K, bits, gs, p.dtype)
        family, launch = Q.qmv(x, w_q, scales, biases, group_size=gs, bits=bits, include=include())
        errors.check(launch.output, ref)
        if family != "qmv_fast":
            raise ValueError(f"{p.name}: MLX routes {family}; the estimate below is qmv_fast's")
        return Measured("affine_qmv_fast, 2 simdgroups x 4 rows (M3)", errors.worst, _counts(launch),
                        _occupancy(families.affine_qmv_fast(bits, p.dtype)))
    M, N = d["M"], d["N"]

    def measure(m: int, n: int) -> dict[str, float]:
        x, w_q, scales, biases, ref = quantized_operands(m, n, K, bits, gs, p.dtype)
        # dispatched as the full M x N is (unsplit), one proxy tile doing a full-size tile's work
        _, launch = Q.qmm(x, w_q, scales, biases, group_size=gs, bits=bits, include=include(), dispatch_shape=(M, N))
        errors.check(launch.output, ref)
        return _counts(launch)

    total = count_models.gemm_counts(M, N, Q.QMM_TILE, Q.QMM_TILE, measure)
    return Measured("affine_qmm_t bm32 bn32 bk32 wm2 wn2 (M3)", errors.worst, total, _occupancy(families.affine_qmm_t(p.dtype)))


MLX = {"gemm": mlx_gemm, "attention": mlx_attention, "decode": mlx_decode, "softmax": mlx_rows, "row_sum": mlx_rows,
       "qmv": mlx_quantized, "qmm": mlx_quantized}
