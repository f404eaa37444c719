"""One cost model for Metal GEMMs: the autotuner's ranking (autotune.rank_by_model / rank_by_roofline), the
metal4 GEMM dispatch's pick (kernels.matmul: `rank` over the kernels it ships), the dispatch-agreement
check, the CLI's `profile` and the benchmarks' predictions (benchmark/calibrate.py) all go through
`predict` and `rank`; `roofline_estimate` below is the counters-only bound (docs/performance.md, "Cost model"). An estimate, not a
measurement.

A kernel is described by its tiling (`GemmKernel`: route, path, tile, simdgroup grid, matrix instruction,
K step, barriers per step, swizzle, split-K slices). `counts` derives what one launch does from that
alone (no kernel built, any size): matrix FLOPs and operations, the bytes its load instructions ask for
(`core_load_bytes`, what the emulator counts as `device_load_bytes` for aligned shapes), the threadgroup
panels that cross from the shared caches into the cores, memory traffic after cache reuse in a wave of
resident threadgroups (in launch order, which the block swizzle changes), threadgroup-memory traffic,
barriers, the per-simdgroup issue mix (fragment loads and copies per matrix operation) and occupancy
(registers, threadgroup memory, threads: register_budget). `estimate` turns counts into seconds on a
chip of `roofline.CHIPS`:

- compute: the busiest core's matrix FLOPs at its share of the peak, slowed by the load and copy
  instructions each simdgroup issues between its matrix operations (LOAD_ISSUE_CYCLES each), and by
  too few resident simdgroups to hide latency (LATENCY_HIDING_SIMDGROUPS);
- core loads: the threadgroups' A and B panels from the shared caches at CORE_LOAD_BYTES_PER_CYCLE per
  core (a direct-global kernel's simdgroups re-read their threadgroup's panels through the core's L1,
  so the panels, not every simdgroup's reads, cross the shared caches, while the chip's L1 holds a
  line per row of A of every resident threadgroup: on M1 / M2's 8 KB the rest is fetched again);
- on-core traffic: the load instructions' bytes (direct-global: through L1; staged: threadgroup memory
  reads and the copies' stores) at ON_CORE_BYTES_PER_CYCLE, plus one pass per bank replay;
- memory: what a wave of resident threadgroups reads from DRAM (each distinct panel once) plus the
  stores (and split-K's float32 partials) at the chip's bandwidth;
- barriers: BARRIER_CYCLES each, overlapped by the other threadgroups resident on the core;
- split-K's combine: a second kernel that starts when the slices are done, reads their float32
  partials and writes C at the chip's bandwidth (its own phase: nothing of the first kernel overlaps it);
- launches: KERNEL_LAUNCH_SECONDS per kernel (split-K: two).

Time = max(compute, core loads, on-core traffic, memory) + barriers + combine + launches. The
constants below are global (no per-problem factor) and are listed with their sources in
docs/performance.md.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

from ..target.isa import SIMD_WIDTH, MatrixInstruction
from .roofline import CACHE_LINE_BYTES, Chip
from ..planning import DIRECT_GLOBAL, SHARED  # the dataflow names a plan carries

# Philip Turner, metal-benchmarks (README, "On-Chip Memory"): ~32 bytes per cycle from the GPU's shared
# caches into one core; 4 schedulers (ALU quadrants) per core, each issuing for its simdgroups.
CORE_LOAD_BYTES_PER_CYCLE = 32
SCHEDULERS_PER_CORE = 4
# Estimates (no public figure): one simdgroup-wide access of 4 bytes per lane per cycle from L1 or
# threadgroup memory; issue cycles of one load or store instruction that the scheduler spends instead
# of a matrix operation; cycles a barrier holds its threadgroup; resident simdgroups per core (two per
# scheduler) below which memory latency shows.
ON_CORE_BYTES_PER_CYCLE = SIMD_WIDTH * 4
LOAD_ISSUE_CYCLES = 8
BARRIER_CYCLES = 64
LATENCY_HIDING_SIMDGROUPS = 2 * SCHEDULERS_PER_CORE
VECTOR_BYTES = 16  # the widest load or store one lane issues (a half8 / uint4)
# Estimate (no public figure for Apple GPUs): the GPU time between two dependent compute kernels of one
# command buffer (the dispatch, the drain of the first, the ramp of the second).
KERNEL_LAUNCH_SECONDS = 5e-6

GEMM, GEMV, SPLIT_K = "gemm", "gemv", "split_k"
_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


@dataclass(frozen=True)
class GemmKernel:
    """The tiling of one GEMM kernel, as the model sees it. `instruction` is the matrix instruction a
    simdgroup issues; `step_k` the K of one pass of the main loop (the staged tile's block_k; the
    instruction's k on direct-global); `barriers_per_step` per pass (staged: 1 with two or more stages
    and register staging, 2 otherwise, as MLX's steel loop)."""

    route: str
    path: str
    block_m: int
    block_n: int
    threads: int
    m_warp: int
    n_warp: int
    instruction: MatrixInstruction
    step_k: int
    barriers_per_step: int = 0
    stages: int = 0
    swizzle: int = 0
    splits: int = 1
    registers: int = 0  # per thread (register_budget estimate)
    name: str = ""

    @property
    def simdgroups(self) -> int:
        return self.threads // SIMD_WIDTH

    @property
    def share(self) -> tuple[int, int]:
        return self.block_m // self.m_warp, self.block_n // self.n_warp

    def describe(self) -> str:
        split = f", {self.splits} K slices" if self.splits > 1 else ""
        staging = f"x{self.step_k}, {self.stages} stages" if self.path == SHARED else ""
        return (self.name or f"{self.route} {self.path} {self.block_m}x{self.block_n}{staging}, {self.simdgroups} simdgroups, "
                f"swizzle {self.swizzle or 'off'}{split}")


@dataclass(frozen=True)
class Counts:
    """What one launch does, from the tiling alone (see the module docstring)."""

    matrix_flops: int
    matrix_ops: int
    busiest_core_flops: int
    busiest_core_threadgroups: int
    core_load_bytes: int  # what the load instructions ask for (emulator: device_load_bytes, aligned shapes)
    panel_bytes: int  # the threadgroups' A and B panels, crossing the shared caches into the cores
    on_core_bytes: int  # L1 reads (direct-global) or threadgroup reads and stores (staged)
    on_core_passes: int  # simdgroup-wide passes those take: ON_CORE_BYTES_PER_CYCLE each, or one per cache line a device fragment touches
    device_store_bytes: int
    dram_bytes: int
    barriers: int  # per threadgroup
    threadgroups: int  # of the launch (output tiles x K slices x batch)
    issue_overhead: float  # load / copy issue cycles per matrix-operation cycle of a simdgroup
    wave: int  # threadgroups resident at once on the whole GPU
    threadgroups_per_core: int
    threads_per_core: int
    operand_reuse: float  # matrix FLOPs per operand element a simdgroup loads
    threadgroup_replays: int = 0
    l1_miss_bytes: int = 0  # direct-global: extra bytes into the cores when L1 cannot keep A's rows across K steps
    combine_bytes: int = 0  # split-K's second kernel: the partials it reads and the C it writes
    launches: int = 1  # kernels launched one after the other

    @property
    def launch_barriers(self) -> int:
        """Every threadgroup's barriers: per FLOP, a tile's K step and area decide them."""
        return self.threadgroups * self.barriers


def _alu_per_quadrant_cycle(chip: Chip) -> float:
    """Matrix FLOPs one scheduler issues per cycle at the chip's peak."""
    return chip.matrix_tflops * 1e12 / (chip.gpu_cores * SCHEDULERS_PER_CORE * chip.clock_ghz * 1e9)


@functools.lru_cache(maxsize=4096)
def _wave_panels(tiles_m: int, tiles_n: int, panel: int, wave: int) -> tuple[int, int]:
    """(tile rows, tile columns) summed over the waves of `wave` threadgroups in launch order (MLX
    swizzle as transform/block_swizzle.py maps it; padding threadgroups return at once)."""
    import numpy as np

    if panel:
        index = np.arange(-(-tiles_m // panel) * tiles_n * panel)
        py, px = index // (tiles_n * panel), index % (tiles_n * panel)
        ty, tx = py * panel + px % panel, px // panel
        keep = ty < tiles_m
        ty, tx = ty[keep], tx[keep]
    else:
        index = np.arange(tiles_m * tiles_n)
        ty, tx = index // tiles_n, index % tiles_n
    wave_of = np.arange(ty.size) // wave
    rows = np.unique(wave_of * tiles_m + ty).size
    cols = np.unique(wave_of * tiles_n + tx).size
    return int(rows), int(cols)


def _l1_miss_bytes(kernel: GemmKernel, chip: Chip, threadgroups_per_core: int, kp: int, eb: int) -> float:
    """Bytes one direct-global threadgroup pulls into its core from the shared caches. A fragment row of A
    is `instruction.k` elements of a 128-byte line that the next K steps read on, so the L1 serves the
    simdgroups' repeats only while it holds a line per row of A for every resident threadgroup; the
    part of that working set over the chip's L1 (`Chip.l1_data_cache_bytes`) is fetched again: each
    simdgroup's A row a whole line per K step, each simdgroup its own rows of B (their lines are used
    up within the step). Where the L1 holds the rows (or its size is not published), the panels."""
    panel = (kernel.block_m + kernel.block_n) * kp * eb
    l1 = chip.l1_data_cache_bytes
    working_set = threadgroups_per_core * kernel.block_m * CACHE_LINE_BYTES
    if l1 is None or working_set <= l1:
        return panel
    inst = kernel.instruction
    refetched = (kernel.block_m * kernel.n_warp * (kp // inst.k) * max(CACHE_LINE_BYTES, inst.k * eb)
                 + kernel.block_n * kernel.m_warp * kp * eb)
    missed = 1 - l1 / working_set
    return panel + missed * max(0, refetched - panel)


def counts(kernel: GemmKernel, M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16", out_dtype: str | None = None,
           batch: int = 1) -> Counts:
    """The launch's counts on `chip` (core count and occupancy decide the waves)."""
    from .register_budget import threadgroups_per_core

    eb, ob = _BYTES[dtype], _BYTES[out_dtype or dtype]
    inst = kernel.instruction
    k_slice = -(-K // kernel.splits)
    kp = -(-k_slice // kernel.step_k) * kernel.step_k  # partial steps are computed whole
    tiles_m, tiles_n = -(-M // kernel.block_m), -(-N // kernel.block_n)
    tiles = tiles_m * tiles_n * kernel.splits * batch
    sm, sn = kernel.share
    tile_flops = 2 * kernel.block_m * kernel.block_n * kp
    staged = kernel.path == SHARED
    tg_bytes = (kernel.block_m + kernel.block_n) * kernel.step_k * eb * max(1, kernel.stages) if staged else 0
    occupancy = threadgroups_per_core(kernel.threads, tg_bytes, kernel.registers)
    per_core = occupancy.threadgroups
    busiest = -(-tiles // chip.gpu_cores)

    panel = (kernel.block_m + kernel.block_n) * kp * eb  # per threadgroup
    simdgroup_reads = (kernel.block_m * kernel.n_warp + kernel.block_n * kernel.m_warp) * kp * eb  # all its simdgroups
    core_load = panel if staged else simdgroup_reads
    on_core = simdgroup_reads + (panel if staged else 0)  # staged: fragment reads from, and copies into, threadgroup memory

    l1_miss = 0 if staged else tiles * _l1_miss_bytes(kernel, chip, per_core, kp, eb) - tiles * panel

    wave = chip.gpu_cores * per_core
    rows, cols = _wave_panels(tiles_m, tiles_n, kernel.swizzle, wave)
    slices = kernel.splits * batch
    dram = (rows * kernel.block_m + cols * kernel.block_n) * kp * eb * slices
    stores = M * N * ob * batch
    partials = M * N * 4 * kernel.splits * batch if kernel.splits > 1 else 0
    # split-K: the slices write float32 partials instead of C; the combine kernel reads them back and writes C
    dram += partials or stores
    combine = partials + stores if partials else 0

    # one simdgroup's issue per K step of the instruction: fragment loads (one instruction per 16 bytes
    # a lane) and its part of the staged copy (a 16-byte load and a 16-byte store per lane each)
    rows_f, cols_f = sm // inst.m, sn // inst.n
    lane_load = SIMD_WIDTH * VECTOR_BYTES
    fragment_loads = rows_f * -(-inst.m * inst.k * eb // lane_load) + cols_f * -(-inst.k * inst.n * eb // lane_load)
    copies = 2 * (kernel.block_m + kernel.block_n) * inst.k * eb / (kernel.threads * VECTOR_BYTES) if staged else 0.0
    op_cycles = inst.flops / _alu_per_quadrant_cycle(chip)
    # a fragment read straight from device memory touches one cache line per fragment row (rows are a
    # row pitch apart); threadgroup memory serves a whole simdgroup access per pass
    passes = -(-on_core // ON_CORE_BYTES_PER_CYCLE)
    if not staged:
        per_step = kernel.simdgroups * (rows_f * inst.m + cols_f * inst.k)
        passes = max(passes, per_step * (kp // inst.k))
    overhead = LOAD_ISSUE_CYCLES * (fragment_loads + copies) / (rows_f * cols_f * op_cycles)

    return Counts(
        matrix_flops=tiles * tile_flops,
        matrix_ops=tiles * tile_flops // inst.flops,
        busiest_core_flops=busiest * tile_flops,
        busiest_core_threadgroups=busiest,
        core_load_bytes=tiles * core_load,
        panel_bytes=tiles * panel,
        on_core_bytes=tiles * on_core,
        on_core_passes=tiles * passes,
        device_store_bytes=partials or stores,
        dram_bytes=dram,
        combine_bytes=combine,
        l1_miss_bytes=max(0, l1_miss),
        launches=2 if partials else 1,
        barriers=(kp // kernel.step_k) * kernel.barriers_per_step,
        threadgroups=tiles,
        issue_overhead=overhead,
        wave=wave,
        threadgroups_per_core=per_core,
        threads_per_core=per_core * kernel.threads,
        operand_reuse=2 * sm * sn / (sm + sn),
    )


@dataclass(frozen=True)
class Estimate:
    """Seconds per term (each an estimate) and their combination."""

    chip: Chip
    counts: Counts
    compute_seconds: float
    core_load_seconds: float
    on_core_seconds: float
    memory_seconds: float
    barrier_seconds: float
    combine_seconds: float = 0.0
    launch_seconds: float = 0.0

    @property
    def seconds(self) -> float:
        overlapped = max(self.compute_seconds, self.core_load_seconds, self.on_core_seconds, self.memory_seconds)
        return overlapped + self.barrier_seconds + self.combine_seconds + self.launch_seconds

    @property
    def terms(self) -> dict[str, float]:
        return {"compute": self.compute_seconds, "core loads": self.core_load_seconds, "on-core traffic": self.on_core_seconds,
                "memory": self.memory_seconds, "barriers": self.barrier_seconds, "combine": self.combine_seconds,
                "launches": self.launch_seconds}

    @property
    def bound(self) -> str:
        terms = dict(self.terms)
        for serial in ("barriers", "combine", "launches"):
            terms.pop(serial)
        return max(terms, key=terms.get)

    def tflops(self, useful_flops: float) -> float:
        return useful_flops / self.seconds / 1e12

    def describe(self) -> str:
        c = self.counts
        return (f"model estimate on {self.chip.name}: {self.seconds * 1e6:.1f} us, {self.bound}-bound ({c.matrix_flops} matrix FLOP, "
                f"issue overhead {c.issue_overhead:.2f}, {c.panel_bytes} panel bytes into the cores, {c.dram_bytes} memory bytes, "
                f"{c.threadgroups_per_core} threadgroups per core)")


def core_load_bandwidth(chip: Chip) -> float:
    """Bytes per second the shared caches deliver to all cores (Turner's per-core figure)."""
    return chip.gpu_cores * CORE_LOAD_BYTES_PER_CYCLE * chip.clock_ghz * 1e9


def estimate(c: Counts, chip: Chip) -> Estimate:
    """Seconds of a launch with counts `c` on `chip` (see the module docstring)."""
    clock = chip.clock_ghz * 1e9
    per_core_peak = chip.matrix_tflops * 1e12 / chip.gpu_cores
    resident_simdgroups = c.threads_per_core // SIMD_WIDTH
    hiding = min(1.0, resident_simdgroups / LATENCY_HIDING_SIMDGROUPS)
    compute = c.busiest_core_flops / per_core_peak * (1 + c.issue_overhead) / hiding
    core_loads = (c.panel_bytes + c.l1_miss_bytes) / core_load_bandwidth(chip)
    on_core = (c.on_core_passes + c.threadgroup_replays) / (chip.gpu_cores * clock)
    memory = c.dram_bytes / (chip.bandwidth_gbs * 1e9)
    barriers = c.busiest_core_threadgroups * c.barriers * BARRIER_CYCLES / (c.threadgroups_per_core * clock)
    combine = c.combine_bytes / (chip.bandwidth_gbs * 1e9)
    return Estimate(chip, c, compute, core_loads, on_core, memory, barriers, combine, c.launches * KERNEL_LAUNCH_SECONDS)


def predict(kernel: GemmKernel, M: int, N: int, K: int, *, chip: Chip, dtype: str = "float16", out_dtype: str | None = None,
            batch: int = 1) -> Estimate:
    return estimate(counts(kernel, M, N, K, chip=chip, dtype=dtype, out_dtype=out_dtype, batch=batch), chip)


# ---------------------------------------------------------------- kernels: the plugin's and MLX's


def _registers(block_m: int, block_n: int, m_warp: int, n_warp: int, inst: MatrixInstruction, shared: bool,
               staging_elements: int = 0, dtype: str = "float16") -> int:
    """Per thread, with operand fragments (and staged elements) of `dtype`: a float32 8x8 fragment holds
    two registers a lane where a 16-bit one holds one, which decides occupancy on fp32 tiles."""
    from .register_budget import gemm_registers

    part = SimpleNamespace(m_warp=m_warp, n_warp=n_warp)
    return gemm_registers(M=block_m, N=block_n, instruction=inst, partition=part, a_dtype=dtype, b_dtype=dtype,
                          acc_dtype="float32", shared=shared, staging_elements=staging_elements, staging_dtype=dtype).total


def plugin_kernel(path: str, block_m: int, block_n: int, threads: int, *, metal4: bool, block_k: int = 0, stages: int = 0,
                  swizzle: int = 0, splits: int = 1, K: int = 4096, route: str = GEMM, features: frozenset[str] = frozenset(),
                  dtype: str = "float16") -> GemmKernel | None:
    """The plugin's GEMM kernel of this tiling as GemmMetal plans it, its registers for operands of
    `dtype` (None: no legal warp partition)."""
    from .. import config as settings

    return _plugin_kernel(path, block_m, block_n, threads, metal4, block_k, stages, swizzle, splits, K, route, features,
                          settings.fragment_ct(), dtype)


@functools.lru_cache(maxsize=8192)  # the dispatch and the rankings ask for the same tilings again and again
def _plugin_kernel(path: str, block_m: int, block_n: int, threads: int, metal4: bool, block_k: int, stages: int, swizzle: int,
                   splits: int, K: int, route: str, features: frozenset[str], fragment_ct: bool, dtype: str) -> GemmKernel | None:
    from ..target.capabilities import capabilities_with
    from ..target.isa import METAL4_FEATURE
    from .register_budget import staging_elements
    from ..planning import plan_gemm
    from ..selection import WarpPolicy

    shared = path == SHARED
    c_scope = "local.fragment" if shared else "global"
    capabilities = capabilities_with(features | ({METAL4_FEATURE} if metal4 else frozenset()))
    planned = plan_gemm(c_scope=c_scope, M=block_m, N=block_n, K=block_k if shared else K, threads=threads,
                        policy=WarpPolicy.SQUARE, capabilities=capabilities, fragment_ct=fragment_ct)
    part = planned.partition
    if part is None:
        return None
    inst = planned.instruction
    staging = staging_elements(block_m, block_n, block_k, threads) if shared and stages >= 2 else 0
    regs = _registers(block_m, block_n, part.m_warp, part.n_warp, inst, shared, staging, dtype)
    return GemmKernel(route, path, block_m, block_n, threads, part.m_warp, part.n_warp, inst,
                      block_k if shared else inst.k, (1 if stages >= 2 else 2) if shared else 0, stages if shared else 0,
                      swizzle, splits, regs)


def from_config(cfg: Any, K: int, *, metal4: bool, features: frozenset[str] = frozenset(), splits: int = 1,
                dtype: str = "float16") -> GemmKernel | None:
    """The kernel of an autotuner configuration (`autotune.GemmConfig`)."""
    return plugin_kernel(cfg.path, cfg.block_m, cfg.block_n, cfg.threads, metal4=metal4, block_k=cfg.block_k,
                         stages=cfg.num_stages, swizzle=cfg.swizzle, splits=splits, K=K,
                         route=SPLIT_K if splits > 1 else GEMM, features=features, dtype=dtype)


def from_choice(choice: Any) -> GemmKernel | None:
    """The kernel `kernels.matmul_config` picked (None for the GEMV route, which `predict_choice` handles)."""
    if choice.route == GEMV:
        return None
    path = SHARED if choice.stages else DIRECT_GLOBAL
    return plugin_kernel(path, choice.block_m, choice.block_n, choice.threads, metal4=choice.target == "metal4",
                         block_k=choice.block_k, stages=choice.stages, swizzle=choice.swizzle, splits=choice.splits,
                         K=choice.K, route=choice.route, dtype=choice.dtype)


def _instruction(name_prefix: str) -> MatrixInstruction:
    from ..target.isa import REGISTRY

    return next(i for i in REGISTRY if i.name.startswith(name_prefix))


def mlx_kernel(bm: int, bn: int, bk: int, wm: int, wn: int, *, nax: bool, swizzle: int = 0, dtype: str = "float16") -> GemmKernel:
    """MLX's GEMM as its reference-tier configuration gives it: steel (threadgroup-staged, two barriers
    per K step of bk, simdgroup 8x8 matrices) or NAX (direct loads into matmul2d 16x32x16 fragments)."""
    threads = wm * wn * SIMD_WIDTH
    if nax:
        inst = _instruction("matmul2d_16x32x16")
        regs = _registers(bm, bn, wm, wn, inst, shared=False, dtype=dtype)
        return GemmKernel(GEMM, DIRECT_GLOBAL, bm, bn, threads, wm, wn, inst, inst.k, 0, 0, swizzle, 1, regs,
                          name=f"MLX NAX {bm}x{bn}x{bk}, {wm * wn} simdgroups")
    inst = _instruction("simdgroup_multiply_accumulate_8x8x8")
    regs = _registers(bm, bn, wm, wn, inst, shared=True, dtype=dtype)
    return GemmKernel(GEMM, SHARED, bm, bn, threads, wm, wn, inst, bk, 2, 1, swizzle, 1, regs,
                      name=f"MLX steel {bm}x{bn}x{bk}, {wm * wn} simdgroups")


# ---------------------------------------------------------------- every route, and the dispatch's pick


def gemv_seconds(M: int, N: int, K: int, chip: Chip, dtype: str = "float16") -> float:
    """The GEMV route (min(M, N) <= GEMV_MAX_ROWS): it streams the large operand once at the memory
    bandwidth, computing at the ALU rate (no matrix hardware)."""
    eb = _BYTES[dtype]
    alu_tflops = chip.matrix_tflops / (4 if chip.generation >= 5 else 1)
    streamed = max(2 * M * N * K / (alu_tflops * 1e12), (M * K + K * N + M * N) * eb / (chip.bandwidth_gbs * 1e9))
    return streamed + KERNEL_LAUNCH_SECONDS


def estimate_choice(choice: Any, *, chip: Chip) -> Estimate | None:
    """The model's estimate of the kernel `kernels.matmul_config` picked (None for the GEMV route,
    which has no tiling: `predict_choice` gives its seconds)."""
    if choice.route == GEMV:
        return None
    kernel = from_choice(choice)
    if kernel is None:
        raise ValueError(f"the model has no warp partition for {choice.summary()}")
    return predict(kernel, choice.M, choice.N, choice.K, chip=chip, dtype=choice.dtype, out_dtype=choice.out_dtype,
                   batch=max(1, choice.batch))


def predict_choice(choice: Any, *, chip: Chip) -> float:
    """Seconds of the kernel `kernels.matmul_config` picked."""
    if choice.route == GEMV:
        return gemv_seconds(choice.M, choice.N, choice.K, chip, choice.dtype)
    return estimate_choice(choice, chip=chip).seconds


# ---------------------------------------------------------------- ranking: the autotuner's and the dispatch's order

# Times within this fraction of each other are one class: the model's inputs (peaks, bandwidths, the
# register estimate, the estimated constants above) are estimates, and a finer difference between two
# tilings of a large problem is how their tile counts round over the cores (0.06% between 32x32 and
# 64x128 tiles of 4096^2 on a 10-core M4).
NEAR_TIE = 0.02


@dataclass(frozen=True)
class Ranked:
    """One ranked item (an autotuner configuration, a dispatch candidate) with its estimate and its
    class: how many NEAR_TIE steps its time is above the best of the ranking."""

    item: Any
    estimate: Estimate
    band: int = 0

    @property
    def seconds(self) -> float:
        return self.estimate.seconds

    @property
    def key(self) -> tuple:
        """Time class first; then more operand reuse per simdgroup (fewer fragment loads per matrix
        FLOP), less memory traffic (where the swizzle helps; split-K's partials), fewer core loads,
        more resident threads."""
        c = self.estimate.counts
        return (self.band, -c.operand_reuse, c.dram_bytes, c.core_load_bytes, -c.threads_per_core, self.estimate.seconds)


def _band(seconds: float, best: float) -> int:
    return int(math.log(seconds / best) / math.log1p(NEAR_TIE)) if seconds > best else 0


def rank(estimated: Iterable[tuple[Any, Estimate]]) -> list[Ranked]:
    """(item, estimate) pairs in the model's order: time class, then the tie-breakers of `Ranked.key`."""
    pairs = list(estimated)
    if not pairs:
        return []
    best = min(e.seconds for _, e in pairs)
    return sorted((Ranked(item, e, _band(e.seconds, best)) for item, e in pairs), key=lambda r: r.key)


def with_counted(c: Counts, total: dict[str, int]) -> Counts:
    """`c` with the figures the emulator counted for one launch (`emulator.counters(...).total`) in
    place of the model's: matrix FLOPs and operations (the busiest core's share scaled alike), the
    bytes the load and store instructions move, and bank replays where counted."""
    from .roofline import matrix_flops

    flops = sum(int(total.get(name, 0)) * per for name, per in matrix_flops().items())
    ops = sum(int(total.get(name, 0)) for name in matrix_flops())
    return replace(c, matrix_flops=flops, matrix_ops=ops,
                   busiest_core_flops=round(c.busiest_core_flops * flops / c.matrix_flops) if c.matrix_flops else flops,
                   core_load_bytes=int(total.get("device_load_bytes", c.core_load_bytes)),
                   device_store_bytes=int(total.get("device_store_bytes", c.device_store_bytes)),
                   threadgroup_replays=int(total.get("threadgroup_replays", c.threadgroup_replays)))


# ---------------------------------------------------------------- counters alone (no tiling known)


@dataclass(frozen=True)
class RooflineEstimate:
    """The model's two bounds that counted figures alone give, when the tiling is not known (the CLI's
    `profile` of any kernel): matrix FLOPs at the chip's peak, device bytes moved by the load and store
    instructions at its bandwidth (no cache reuse: it over-counts memory traffic of tiles that re-read
    panels). A lower bound on the time, not a prediction."""

    chip: Chip
    matrix_flops: int
    device_bytes: int
    compute_seconds: float
    memory_seconds: float

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.memory_seconds)

    @property
    def bound(self) -> str:
        return "compute" if self.compute_seconds >= self.memory_seconds else "memory"

    def describe(self) -> str:
        return (
            f"roofline estimate on {self.chip.name} ({self.chip.matrix_tflops:g} TFLOP/s, {self.chip.bandwidth_gbs:g} GB/s): "
            f"{self.seconds * 1e6:.1f} us, {self.bound}-bound ({self.matrix_flops} matrix FLOP, {self.device_bytes} device bytes)"
        )


def roofline_estimate(total: dict[str, int], chip: Chip) -> RooflineEstimate:
    """The counters-only bounds of one launch (`counters(...).total`) on `chip`."""
    from .roofline import matrix_flops

    flops = sum(int(total.get(name, 0)) * per for name, per in matrix_flops().items())
    moved = int(total.get("device_load_bytes", 0)) + int(total.get("device_store_bytes", 0))
    return RooflineEstimate(chip, flops, moved, flops / (chip.matrix_tflops * 1e12), moved / (chip.bandwidth_gbs * 1e9))
