"""Autotuning Metal GEMMs: a configuration space the plugin can lower, for `tilelang.autotune`.

    space = config_space(4096, 4096, 4096, target="metal")     # tiles, threads, swizzle, path
    kernel = autotune_gemm(4096, 4096, 4096)                    # Mac: tilelang.autotune, real GPU timings
    ranked = rank_by_roofline(space, 256, 256, 256, chip=roofline.chip("M5"))   # anywhere: emulator counters

`autotune_gemm` times candidates on the GPU, so without one (no torch MPS: Linux) it refuses at once
with a one-line RuntimeError pointing to `rank_by_roofline`, instead of letting `execution_backend="auto"`
fall back to the emulator and time a large space on the CPU (at 4096^3, when the space held 180 candidates: about 70
compiled after 3 minutes and none timed yet; CPU times that say nothing about a GPU anyway). It does not return the ranking's first
choice instead: the ranking runs every candidate in the emulator, which is only affordable at
reduced sizes, so it is a separate, explicit call. `execution_backend="emulator"` still tunes
anywhere (CPU wall times, with a warning): for small spaces and tests.

A configuration is kept only when the plugin's own rules accept it: the instruction selection and
warp partition GemmMetal would use (`planning.plan_gemm`) must give
a legal split, the threads fit a threadgroup, and the staged tiles fit Metal's 32 KiB of threadgroup
memory (`limits`). See docs/benchmarks.md (Autotuning).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from .. import config as settings
from ..performance import cost_model
from ..target.capabilities import TargetCapabilities, resolve_capabilities
from ..target.isa import METAL4_FEATURE, SIMD_WIDTH
from ..performance.cost_model import RooflineEstimate
from ..performance.register_budget import estimate_registers
from ..performance.roofline import Chip
from ..planning import plan_gemm
from ..selection import WarpPolicy, cooperative_instructions

DIRECT_GLOBAL, SHARED = "direct_global", "shared"
PATHS = (DIRECT_GLOBAL, SHARED)
# Tiles of the fastest Metal GEMMs (MLX: 64x128 / 128x128 with 8-16 simdgroups on M5, 64x64 / 32x64 with
# 2-4 simdgroups before) and smaller ones for small problems.
TILES = ((32, 32), (32, 64), (64, 64), (64, 128), (128, 64), (128, 128))
THREADS = (64, 128, 256, 512)
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


def rejection(cfg: GemmConfig, *, K: int = 64, dtype: str = "float16", target: Any = None, registers: bool = True) -> str | None:
    """Why the plugin would refuse `cfg` for a GEMM of reduction length K (None when it lowers), from
    the plugin's own rules; with `registers`, also a register estimate over the budget (such a kernel
    lowers, but spills: register_budget.py)."""
    from ..target.limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES

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
    capabilities = resolve_capabilities(target)
    if _partition(cfg, K, capabilities) is None:
        return f"no legal warp partition of a {cfg.block_m}x{cfg.block_n} tile over {cfg.threads // SIMD_WIDTH} simdgroups"
    if not registers:
        return None
    estimate_ = estimate_registers(cfg, dtype=dtype, target=capabilities, staging=False, fragment_ct=settings.fragment_ct())
    if not estimate_.fits:  # register staging and K-prefetch turn themselves off; this is what remains
        return (f"{cfg.block_m}x{cfg.block_n} on {cfg.threads} threads needs {estimate_.describe()} without register staging "
                f"or K-prefetch, over the register budget; use more threads or a smaller tile")
    return None


def _partition(cfg: GemmConfig, K: int, capabilities: TargetCapabilities) -> Any:
    """The warp partition GemmMetal would lower `cfg` with (None: no legal one), from the plugin's own
    selection; K is the GEMM's reduction length (the shared path's T.gemm spans one block_k)."""
    shared = cfg.path == SHARED
    c_scope = "local.fragment" if shared else "global"
    return plan_gemm(c_scope=c_scope, M=cfg.block_m, N=cfg.block_n, K=cfg.block_k if shared else K, threads=cfg.threads,
                     policy=WarpPolicy.SQUARE, capabilities=capabilities, fragment_ct=settings.fragment_ct()).partition


def _useful(extent: int, tile: int, candidates: Iterable[int]) -> bool:
    """False when a smaller candidate tile covers `extent` as well (the larger one only adds waste)."""
    return not any(t < tile and t >= extent for t in candidates)


@dataclass(frozen=True)
class SpaceReport:
    """The configurations `config_space` keeps and the ones it drops, each with its reason."""

    kept: list[GemmConfig]
    pruned: list[tuple[GemmConfig, str]]

    def describe(self) -> list[str]:
        return [f"kept {len(self.kept)}, pruned {len(self.pruned)}"] + [f"pruned {cfg.describe()}: {why}" for cfg, why in self.pruned]


def config_space(M: int, N: int, K: int, **options: Any) -> list[GemmConfig]:
    """Every configuration the plugin accepts for an M x N x K GEMM (`config_report(...).kept`; the
    options are `config_report`'s)."""
    return config_report(M, N, K, **options).kept


def config_report(
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
) -> SpaceReport:
    """Every configuration the plugin accepts for an M x N x K GEMM on `target` (default: this host's
    "metal"), minus the hopeless ones: tiles a smaller one covers as well, swizzle panels taller than
    the tile grid, simdgroups owning fewer than `min_simdgroup_elements` of C (one Metal 4 matmul2d
    destination by default: smaller shares leave the matrix units idle), and configurations whose
    register estimate is over the budget (register_budget.py). `pruned` says why each one went."""
    if dtype not in _BYTES:
        raise ValueError(f"dtype {dtype!r}: use one of {tuple(_BYTES)}")
    capabilities = resolve_capabilities(target)
    if min_simdgroup_elements is None:
        found = cooperative_instructions({METAL4_FEATURE})
        min_simdgroup_elements = found[0].m * found[0].n if found else 0
    ms, ns = sorted({t[0] for t in tiles}), sorted({t[1] for t in tiles})
    kept: list[GemmConfig] = []
    pruned: list[tuple[GemmConfig, str]] = []
    for path, (bm, bn), th, sw in itertools.product(paths, tiles, threads, swizzles):
        ks = [(bk, st) for bk in block_ks for st in stages if _useful(K, bk, block_ks)] if path == SHARED else [(0, 0)]
        configs = [GemmConfig(path, bm, bn, th, bk, st, sw) for bk, st in ks]
        why = None
        if not (_useful(M, bm, ms) and _useful(N, bn, ns)):
            why = f"a smaller tile covers the {M}x{N} problem as well"
        elif sw and math.ceil(M / bm) < sw:
            why = f"swizzle panel {sw} is taller than the {math.ceil(M / bm)} rows of tiles"
        elif bm * bn < min_simdgroup_elements * (th // SIMD_WIDTH):
            why = f"each of {th // SIMD_WIDTH} simdgroups would own fewer than {min_simdgroup_elements} elements of C"
        for cfg in configs:
            reason = why or rejection(cfg, K=K, dtype=dtype, target=capabilities)
            if reason is None:
                kept.append(cfg)
            else:
                pruned.append((cfg, reason))
    return SpaceReport(kept, pruned)


def build(cfg: GemmConfig, M: int, N: int, K: int, *, dtype: str = "float16", out_dtype: str | None = None,
          trans_B: bool = False) -> Any:
    """The configuration's kernel as a `T.prim_func` with parameters (A, B, C) on both paths."""
    from .. import kernels as examples

    out_dtype = out_dtype or dtype
    if cfg.path == DIRECT_GLOBAL:
        return examples.gemm_direct_global(M, N, K, cfg.block_m, cfg.block_n, dtype=dtype, out_dtype=out_dtype,
                                           threads=cfg.threads, trans_B=trans_B, swizzle_panel=cfg.swizzle)
    return examples.gemm_staged(M, N, K, cfg.block_m, cfg.block_n, cfg.block_k, dtype=dtype, out_dtype=out_dtype,
                                threads=cfg.threads, trans_B=trans_B, num_stages=cfg.num_stages, swizzle_panel=cfg.swizzle,
                                keep_staging=True)  # the shared path as configured, not bypassed


# ---------------------------------------------------------------- the cost model's order (tilelang_metal/performance/cost_model.py)

NEAR_TIE = cost_model.NEAR_TIE


def model_kernel(cfg: GemmConfig, K: int, *, target: Any, dtype: str = "float16") -> cost_model.GemmKernel:
    """The configuration's kernel as the cost model sees it (GemmMetal's instruction and partition,
    registers for operands of `dtype`)."""
    capabilities = resolve_capabilities(target)
    kernel = cost_model.from_config(cfg, K, metal4=capabilities.metal4, features=capabilities.features, dtype=dtype)
    if kernel is None:
        raise ValueError(f"{cfg.describe()}: no legal warp partition (config_space drops it)")
    return kernel


def traffic_model(cfg: GemmConfig, M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16",
                  out_dtype: str | None = None, target: Any = None) -> cost_model.Counts:
    """What one launch of the configuration does on `chip` (`cost_model.counts` of its kernel: work,
    core loads, memory traffic after cache reuse in a wave, occupancy); no kernel is built."""
    target = target if target is not None else target_for(chip)
    return cost_model.counts(model_kernel(cfg, K, target=target, dtype=dtype), M, N, K, chip=chip, dtype=dtype, out_dtype=out_dtype)


@dataclass(frozen=True)
class ModelRanked:
    config: GemmConfig
    estimate: cost_model.Estimate
    band: int = 0  # how many NEAR_TIE steps the time is above the best of its ranking


def rank_by_model(space: Sequence[GemmConfig], M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16",
                  out_dtype: str | None = None, target: Any = None) -> list[ModelRanked]:
    """Rank configurations by the cost model alone (`cost_model.rank`: time class, then operand reuse,
    memory traffic, core loads, resident threads); no kernel built or run, any problem size."""
    target = target if target is not None else target_for(chip)
    estimated = ((cfg, cost_model.predict(model_kernel(cfg, K, target=target, dtype=dtype), M, N, K, chip=chip, dtype=dtype, out_dtype=out_dtype))
                 for cfg in space)
    return [ModelRanked(r.item, r.estimate, r.band) for r in cost_model.rank(estimated)]


@dataclass(frozen=True)
class RouteCandidate:
    """One kernel the plugin can lower for a problem, as the cost model sees it, with its predicted seconds."""

    kernel: cost_model.GemmKernel | None  # None: the GEMV route
    seconds: float

    def describe(self) -> str:
        return self.kernel.describe() if self.kernel is not None else "gemv"


def route_candidates(M: int, N: int, K: int, *, chip: Chip, target: Any, space: Sequence[GemmConfig] | None = None,
                     dtype: str = "float16") -> list[RouteCandidate]:
    """Every route the plugin can lower for the problem on `target`, each configuration of the
    autotuner's space (tiled GEMM on both paths; split-K with 2-16 slices of at least MIN_SLICE_K;
    GEMV where it applies), with the cost model's predicted seconds: what the dispatch's pick is
    checked against (tests/unit/test_dispatch_agrees_with_model.py)."""
    from ..kernels.gemv import GEMV_MAX_ROWS
    from ..kernels.matmul import MAX_SPLITS, MIN_SLICE_K

    capabilities = resolve_capabilities(target)
    metal4, features = capabilities.metal4, capabilities.features
    space = space if space is not None else config_space(M, N, K, dtype=dtype, target=target)
    found: list[RouteCandidate] = []
    if min(M, N) <= GEMV_MAX_ROWS:
        found.append(RouteCandidate(None, cost_model.gemv_seconds(M, N, K, chip, dtype)))
    splits = [1] + [s for s in (2, 4, 8, 16) if s <= MAX_SPLITS and K // s >= MIN_SLICE_K]
    seen: set[cost_model.GemmKernel] = set()  # split-K launches unswizzled: both swizzle variants are one kernel
    for cfg in space:
        for s in splits:
            kernel = cost_model.from_config(cfg if s == 1 else replace(cfg, swizzle=0), K, metal4=metal4, features=features, splits=s,
                                            dtype=dtype)
            if kernel is not None and kernel not in seen:
                seen.add(kernel)
                found.append(RouteCandidate(kernel, cost_model.predict(kernel, M, N, K, chip=chip, dtype=dtype).seconds))
    return found


# ---------------------------------------------------------------- Linux: rank by roofline estimate


@dataclass(frozen=True)
class RankedConfig:
    config: GemmConfig
    estimate: RooflineEstimate  # the counters-only bounds (no caches)
    counts: dict[str, int]
    model: cost_model.Estimate | None = None  # the cost model with the counted figures: the ranking's order

    @property
    def issue_slots(self) -> int:
        """Tie-breaker between equal roofline times: memory instructions and barriers issued."""
        c = self.counts
        return (c["device_load_instructions"] + c["device_store_instructions"] + c["threadgroup_load_instructions"]
                + c["threadgroup_store_instructions"] + c["threadgroup_barriers"])


def target_for(chip: Chip) -> Any:
    """The Metal target a chip runs: Metal 4 cooperative tensors on M5 and newer, simdgroup MMA before."""
    from .. import kernels as examples

    return examples.metal4_target() if chip.generation >= 5 else examples.plain_metal_target()


def rank_by_roofline(space: Sequence[GemmConfig], M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16",
                     out_dtype: str | None = None, trans_B: bool = False, target: Any = None) -> list[RankedConfig]:
    """Rank configurations without a GPU: compile each for the emulator, count one launch
    (`emulator.counters`) and sort by the cost model's estimate on `chip` with the counted figures in
    place of its own (`cost_model.with_counted`: matrix work, device loads and stores, bank replays),
    then by memory traffic, then by issue slots. `estimate` keeps the counters-only bounds.

    Runs every kernel once on the CPU, so use it at reduced sizes (`rank_by_model` ranks any size
    without running anything); it orders tilings, it does not predict times."""
    import tilelang
    import torch

    from ..emulator import counters

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
        model_counts = traffic_model(cfg, M, N, K, chip=chip, dtype=dtype, out_dtype=out_dtype, target=target)
        model = cost_model.estimate(cost_model.with_counted(model_counts, total), chip)
        ranked.append(RankedConfig(cfg, cost_model.roofline_estimate(total, chip), total, model))
    return sorted(ranked, key=lambda r: (r.model.seconds, r.model.counts.dram_bytes, r.issue_slots))


# ---------------------------------------------------------------- Mac: tilelang.autotune with real timings


def shortlist(M: int, N: int, K: int, count: int, *, chip: Chip | None = None, dtype: str = "float16",
              out_dtype: str | None = None, target: Any = "metal") -> list[GemmConfig]:
    """The model's first `count` configurations of `config_space` (`rank_by_model` on `chip`, default
    this Mac's): a space to time in seconds instead of minutes. Large problems are compute-bound
    for most of the space, where the model orders its near-ties by operand reuse and memory traffic
    (estimates), so keep `count` well above 1."""
    from ..performance.roofline import detect_chip

    if count < 1:
        raise ValueError(f"shortlist count={count} must be at least 1")
    chip = chip if chip is not None else detect_chip()
    if chip is None:
        raise ValueError("a shortlist needs the chip whose model ranks the space and this host's chip is not known; "
                         "pass chip=roofline.chip('M4 Pro') (any name of roofline.CHIPS)")
    space = config_space(M, N, K, dtype=dtype, target=target)
    return [r.config for r in rank_by_model(space, M, N, K, chip=chip, dtype=dtype, out_dtype=out_dtype, target=target)[:count]]


def autotune_gemm(M: int, N: int, K: int, *, dtype: str = "float16", out_dtype: str | None = None, trans_B: bool = False,
                  space: Sequence[GemmConfig] | None = None, target: Any = "metal", execution_backend: str = "auto",
                  warmup: int = 25, rep: int = 100, top: int | None = None, chip: Chip | None = None) -> Any:
    """The fastest configuration's compiled kernel (`kernel(A, B) -> C`), chosen by `tilelang.autotune`
    timing each candidate on the device (torch MPS on a Mac) after checking it against torch.

    `top=N` times only the model's first N configurations (`shortlist`, ranked for `chip`, default
    this Mac's) instead of the whole space (222 at 4096^3); it cannot be combined with `space`.
    Without a GPU it refuses (see the module docstring). With execution_backend="emulator" it runs
    anywhere, but then the timings are CPU times of the emulator: use `rank_by_roofline` there instead."""
    import tilelang
    import torch

    from ..execution.backends import mps_available

    if execution_backend in ("auto", "torch") and not mps_available():
        raise RuntimeError(
            f"autotune_gemm({M}, {N}, {K}) times each candidate on the GPU, which needs a Mac (torch MPS); this host has "
            "none. Rank configurations without a GPU with autotune.rank_by_roofline(config_space(m, n, k)[:10], m, n, k, "
            "chip=roofline.chip('M5')) at reduced sizes, or pass execution_backend='emulator' to time a small space on the CPU."
        )
    out_dtype = out_dtype or dtype
    if top is not None and space is not None:
        raise ValueError("autotune_gemm takes space= or top=, not both: top ranks the whole space by the model and keeps its first configurations")
    if top is not None:
        candidates = shortlist(M, N, K, top, chip=chip, dtype=dtype, out_dtype=out_dtype, target=target)
    else:
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
