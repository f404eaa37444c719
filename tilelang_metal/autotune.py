"""Autotuning Metal GEMMs: a configuration space the plugin can lower, for `tilelang.autotune`.

    space = config_space(4096, 4096, 4096, target="metal")     # tiles, threads, swizzle, path
    kernel = autotune_gemm(4096, 4096, 4096)                    # Mac: tilelang.autotune, real GPU timings
    ranked = rank_by_roofline(space, 256, 256, 256, chip=roofline.chip("M5"))   # anywhere: emulator counters

`autotune_gemm` times candidates on the GPU, so without one (no torch MPS: Linux) it refuses at once
with a one-line RuntimeError pointing to `rank_by_roofline`, instead of letting `execution_backend="auto"`
fall back to the emulator and time a large space on the CPU (at 4096^3: 180 candidates, about 70
compiled after 3 minutes and none timed yet; CPU times that say nothing about a GPU anyway). It does not return the ranking's first
choice instead: the ranking runs every candidate in the emulator, which is only affordable at
reduced sizes, so it is a separate, explicit call. `execution_backend="emulator"` still tunes
anywhere (CPU wall times, with a warning): for small spaces and tests.

A configuration is kept only when the plugin's own rules accept it: the instruction selection and
warp partition GemmMetal would use (`selection.select_inst`, `selection.warp_partition`) must give
a legal split, the threads fit a threadgroup, and the staged tiles fit Metal's 32 KiB of threadgroup
memory (`limits`). See docs/benchmarks.md (Autotuning).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from . import config as settings
from .isa import METAL4_FEATURE, SIMD_WIDTH
from .roofline import Chip, RooflineEstimate, estimate
from .selection import WarpPolicy, cooperative_instructions, select_inst, warp_partition

DIRECT_GLOBAL, SHARED = "direct_global", "shared"
PATHS = (DIRECT_GLOBAL, SHARED)
# Tiles of the fastest Metal GEMMs (MLX: 64x128 / 128x128 with 8-16 simdgroups) and smaller ones for small problems.
TILES = ((32, 32), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
THREADS = (128, 256, 512)
BLOCK_KS = (16, 32, 64)
STAGES = (0, 2, 3)
SWIZZLES = (0, 8)
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class GemmConfig:
    """One point of the space. block_k / num_stages apply to the shared path only (0 on direct-global,
    which owns its K loop)."""

    path: str
    block_m: int
    block_n: int
    threads: int
    block_k: int = 0
    num_stages: int = 0
    swizzle: int = 0  # T.use_swizzle panel, order "mlx"; 0 = off

    def as_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `autotune_gemm`'s tunable function (a `tilelang.autotune` config)."""
        return asdict(self)

    def describe(self) -> str:
        staging = f"x{self.block_k}, {self.num_stages} stages" if self.path == SHARED else ""
        return f"{self.path} {self.block_m}x{self.block_n}{staging}, {self.threads} threads, swizzle {self.swizzle or 'off'}"


def threadgroup_bytes(cfg: GemmConfig, dtype: str = "float16") -> int:
    """Threadgroup memory the configuration's kernel allocates: the shared path stages one A and one
    B tile per pipeline stage (tilelang multi-buffers them `num_stages` times); direct-global none."""
    if cfg.path != SHARED:
        return 0
    return (cfg.block_m + cfg.block_n) * cfg.block_k * _BYTES[dtype] * max(1, cfg.num_stages)


def rejection(cfg: GemmConfig, *, K: int = 64, dtype: str = "float16", target: Any = None) -> str | None:
    """Why the plugin would refuse `cfg` for a GEMM of reduction length K (None when it lowers), from
    the plugin's own rules."""
    from .limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES

    if cfg.path not in PATHS:
        return f"unknown path {cfg.path!r}; use one of {PATHS}"
    if cfg.threads % SIMD_WIDTH or cfg.threads > MAX_THREADS_PER_THREADGROUP:
        return f"threads={cfg.threads}: need a multiple of {SIMD_WIDTH} up to {MAX_THREADS_PER_THREADGROUP}"
    if cfg.swizzle and cfg.swizzle & (cfg.swizzle - 1):
        return f"swizzle panel {cfg.swizzle} is not a power of two"
    shared = cfg.path == SHARED
    if shared and cfg.block_k <= 0:
        return "the shared path needs block_k > 0"
    staged = threadgroup_bytes(cfg, dtype)
    if staged > THREADGROUP_MEMORY_BYTES:
        return f"stages {staged} B of threadgroup memory; Metal allows {THREADGROUP_MEMORY_BYTES}"
    c_scope = "local.fragment" if shared else "global"
    k_extent = cfg.block_k if shared else K  # direct-global: the T.gemm spans the whole K
    selection = select_inst(c_scope=c_scope, M=cfg.block_m, N=cfg.block_n, K=k_extent, threads=cfg.threads,
                            policy=WarpPolicy.SQUARE, has_metal4=_has_metal4(target),
                            route_fragments_to_cooperative_tensor=settings.fragment_ct(), features=_features(target))
    if warp_partition(selection, c_scope, WarpPolicy.SQUARE, cfg.block_m, cfg.block_n, cfg.threads // SIMD_WIDTH) is None:
        return f"no legal warp partition of a {cfg.block_m}x{cfg.block_n} tile over {cfg.threads // SIMD_WIDTH} simdgroups"
    return None


def _has_metal4(target: Any) -> bool:
    from .host import resolve_target
    from .target import has_metal4

    return has_metal4(resolve_target(target if target is not None else "metal"))


def _features(target: Any) -> frozenset[str]:
    from .host import resolve_target
    from .target import target_features

    return target_features(resolve_target(target if target is not None else "metal"))


def _useful(extent: int, tile: int, candidates: Iterable[int]) -> bool:
    """False when a smaller candidate tile covers `extent` as well (the larger one only adds waste)."""
    return not any(t < tile and t >= extent for t in candidates)


def config_space(
    M: int,
    N: int,
    K: int,
    *,
    dtype: str = "float16",
    target: Any = None,
    paths: Sequence[str] = PATHS,
    tiles: Sequence[tuple[int, int]] = TILES,
    threads: Sequence[int] = THREADS,
    block_ks: Sequence[int] = BLOCK_KS,
    stages: Sequence[int] = STAGES,
    swizzles: Sequence[int] = SWIZZLES,
    min_simdgroup_elements: int | None = None,
) -> list[GemmConfig]:
    """Every configuration the plugin accepts for an M x N x K GEMM on `target` (default: this host's
    "metal"), minus the hopeless ones: tiles a smaller one covers as well, swizzle panels taller than
    the tile grid, and simdgroups owning fewer than `min_simdgroup_elements` of C (one Metal 4
    matmul2d destination by default: smaller shares leave the matrix units idle)."""
    if dtype not in _BYTES:
        raise ValueError(f"dtype {dtype!r}: use one of {tuple(_BYTES)}")
    if min_simdgroup_elements is None:
        found = cooperative_instructions({METAL4_FEATURE})
        min_simdgroup_elements = found[0].m * found[0].n if found else 0
    ms, ns = sorted({t[0] for t in tiles}), sorted({t[1] for t in tiles})
    space = []
    for path, (bm, bn), th, sw in itertools.product(paths, tiles, threads, swizzles):
        if not (_useful(M, bm, ms) and _useful(N, bn, ns)):
            continue
        if sw and math.ceil(M / bm) < sw:
            continue
        if bm * bn < min_simdgroup_elements * (th // SIMD_WIDTH):
            continue
        ks = [(bk, st) for bk in block_ks for st in stages if _useful(K, bk, block_ks)] if path == SHARED else [(0, 0)]
        for bk, st in ks:
            cfg = GemmConfig(path, bm, bn, th, bk, st, sw)
            if rejection(cfg, K=K, dtype=dtype, target=target) is None:
                space.append(cfg)
    return space


def build(cfg: GemmConfig, M: int, N: int, K: int, *, dtype: str = "float16", out_dtype: str | None = None,
          trans_B: bool = False) -> Any:
    """The configuration's kernel as a `T.prim_func` with parameters (A, B, C) on both paths."""
    from . import kernels as examples

    out_dtype = out_dtype or dtype
    if cfg.path == DIRECT_GLOBAL:
        return examples.gemm_direct_global(M, N, K, cfg.block_m, cfg.block_n, dtype=dtype, out_dtype=out_dtype,
                                           threads=cfg.threads, trans_B=trans_B, swizzle_panel=cfg.swizzle)
    return examples.gemm_staged(M, N, K, cfg.block_m, cfg.block_n, cfg.block_k, dtype=dtype, out_dtype=out_dtype,
                                threads=cfg.threads, trans_B=trans_B, num_stages=cfg.num_stages, swizzle_panel=cfg.swizzle,
                                keep_staging=True)  # the shared path as configured, not bypassed


# ---------------------------------------------------------------- Linux: rank by roofline estimate


@dataclass(frozen=True)
class RankedConfig:
    config: GemmConfig
    estimate: RooflineEstimate
    counts: dict[str, int]

    @property
    def issue_slots(self) -> int:
        """Tie-breaker between equal roofline times: memory instructions and barriers issued."""
        c = self.counts
        return (c["device_load_instructions"] + c["device_store_instructions"] + c["threadgroup_load_instructions"]
                + c["threadgroup_store_instructions"] + c["threadgroup_barriers"])


def target_for(chip: Chip) -> Any:
    """The Metal target a chip runs: Metal 4 cooperative tensors on M5 and newer, simdgroup MMA before."""
    from . import kernels as examples

    generation = int(chip.name.split()[0].removeprefix("M"))
    return examples.metal4_target() if generation >= 5 else examples.plain_metal_target()


def rank_by_roofline(space: Sequence[GemmConfig], M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16",
                     out_dtype: str | None = None, trans_B: bool = False, target: Any = None) -> list[RankedConfig]:
    """Rank configurations without a GPU: compile each for the emulator, count one launch
    (`emulator.counters`) and sort by the roofline estimate on `chip` (then by issue slots).

    Runs every kernel once on the CPU, so use it at reduced sizes; the estimate ignores caches
    and occupancy (see roofline.py), it orders tilings, it does not predict times."""
    import tilelang
    import torch

    from .emulator import counters

    target = target if target is not None else target_for(chip)
    gen = torch.Generator().manual_seed(0)
    tdt = getattr(torch, dtype)
    a = torch.randn(M, K, generator=gen).to(tdt)
    b = torch.randn(*((N, K) if trans_B else (K, N)), generator=gen).to(tdt)
    ranked = []
    for cfg in space:
        kernel = tilelang.compile(build(cfg, M, N, K, dtype=dtype, out_dtype=out_dtype, trans_B=trans_B),
                                  out_idx=[-1], target=target, execution_backend="emulator")
        total = counters(kernel, a, b).total
        ranked.append(RankedConfig(cfg, estimate(total, chip), total))
    return sorted(ranked, key=lambda r: (r.estimate.seconds, r.issue_slots))


# ---------------------------------------------------------------- Mac: tilelang.autotune with real timings


def autotune_gemm(M: int, N: int, K: int, *, dtype: str = "float16", out_dtype: str | None = None, trans_B: bool = False,
                  space: Sequence[GemmConfig] | None = None, target: Any = "metal", execution_backend: str = "auto",
                  warmup: int = 25, rep: int = 100) -> Any:
    """The fastest configuration's compiled kernel (`kernel(A, B) -> C`), chosen by `tilelang.autotune`
    timing each candidate on the device (torch MPS on a Mac) after checking it against torch.

    Without a GPU it refuses (see the module docstring). With execution_backend="emulator" it runs
    anywhere, but then the timings are CPU times of the emulator: use `rank_by_roofline` there instead."""
    import tilelang
    import torch

    from .execution.backends import mps_available

    if execution_backend in ("auto", "torch") and not mps_available():
        raise RuntimeError(
            f"autotune_gemm({M}, {N}, {K}) times each candidate on the GPU, which needs a Mac (torch MPS); this host has "
            "none. Rank configurations without a GPU with autotune.rank_by_roofline(config_space(m, n, k)[:10], m, n, k, "
            "chip=roofline.chip('M5')) at reduced sizes, or pass execution_backend='emulator' to time a small space on the CPU."
        )
    out_dtype = out_dtype or dtype
    candidates = list(space) if space is not None else config_space(M, N, K, dtype=dtype, target=target)
    if not candidates:
        raise ValueError(f"no configuration of the space fits a {M}x{N}x{K} {dtype} GEMM on this target")

    def reference(A: Any, B: Any) -> Any:
        return (A.float() @ (B.float().T if trans_B else B.float())).to(getattr(torch, out_dtype))

    tolerance = 1e-2 if out_dtype != "float32" else 1e-3

    @tilelang.autotune(configs=[c.as_kwargs() for c in candidates], warmup=warmup, rep=rep, ref_prog=reference,
                       rtol=tolerance, atol=tolerance * math.sqrt(K))
    @tilelang.jit(out_idx=[-1], target=target, execution_backend=execution_backend)
    def tunable(path: str = DIRECT_GLOBAL, block_m: int = 64, block_n: int = 128, threads: int = 128, block_k: int = 0,
                num_stages: int = 0, swizzle: int = 0) -> Any:
        cfg = GemmConfig(path, block_m, block_n, threads, block_k, num_stages, swizzle)
        return build(cfg, M, N, K, dtype=dtype, out_dtype=out_dtype, trans_B=trans_B)

    return tunable()
