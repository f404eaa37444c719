"""Shape-aware GEMM dispatch: `matmul_config(M, N, K, ...)` picks a kernel for C = A @ B by shape,
dtype and chip, `matmul(...)` compiles it. Every kernel it picks takes `(A (M, K), B (K, N))` and
returns C (M, N), so the caller never sees the route.

Routes (docs/performance.md, "Shape-aware GEMM dispatch", has the table and the sources of the numbers):

- `gemv` (kernels/gemv.py) when M or N is at most GEMV_MAX_ROWS: a GEMM tile of 64 or 128 rows
  would compute mostly padding, and the problem is bound by reading the large operand once;
- on the metal4 target (M5 and newer): the cost model (tilelang_metal/performance/cost_model.py) ranks every
  kernel the dispatch ships, kernels.gemm_direct_global on each METAL4_TILES tile and split-K on
  each with 2-16 K slices of at least MIN_SLICE_K, and the first is taken (`lower --explain` prints
  its predicted time and the runner-up's);
- on the plain metal target (M1-M4): MLX's four steel tiles ranked by the cost model within issue 35's
  bounds against MLX's tile for the chip (`_model_steel_tile`); the K split by the cost model: `split_k`
  (kernels/split_k.py) when the model predicts slices of K faster than the unsplit tile (few output
  tiles, long K; the combine kernel and its launch count against a split); `gemm` otherwise,
  kernels.gemm_staged on the ranked tile (MLX's steel tile for the chip class, `_steel_tile`, unless
  another is predicted more than KEEP_MLX_TILE faster), A and B staged through one threadgroup
  buffer each with rows padded by 16 bytes (16-byte copies, no bank conflicts, two barriers per K
  step, as MLX's loop), at least the threadgroups per core of MLX's tile; an operand
  whose row pitch (K or N) is not a multiple of 16 bytes is copied in 16-byte runs per thread
  (kernels.gemm.copy_runs) instead of T.copy's one element per thread; block swizzle on grids large
  enough for neighbouring threadgroups to share panels of A and B.

On plain metal the split-K slices are staged the same way (its tile, block_k and one stage). An M
(or N) from 9 to 48 gets a small-side tile on both routes (kernels/small_m.py: the small side rounded
up to 16 rows, one tile, 4 simdgroups), which keeps matrix operations per FLOP at most MLX's.

`batch=` (A (batch, M, K), B (batch, K, N) or `shared_B` (K, N)) runs on the grid's z axis on every
route; an `epilogue=` (bias, alpha * A @ B + beta * C as torch.addmm, residual, activations) on the
tiled route (kernels.gemm_batched): GEMV and split-K apply none yet, so such problems take the tiled
route, with the reason.

The thresholds that are not MLX's (minimum slice length, swizzle grid) are
heuristics of this module, not measurements on a Mac; each choice carries its one-line reason,
which `python -m tilelang_metal lower --explain` prints.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any

from ..performance.roofline import CHIPS, Chip, chip as chip_named, detect_chip
from ..target.capabilities import capabilities_of
from ..target.normalize import metal4_target, plain_metal_target
from .gemm import gemm_direct_global, gemm_staged
from .gemm_batched import EPILOGUES as BATCHED_EPILOGUES, check_batch, gemm_batched
from .gemv import DTYPES, GEMV_MAX_ROWS, gemv_small_m, gemv_small_n
from .small_m import small_side_tile
from .sizes import flags, integer_sizes
from .split_k import effective_splits, gemm_split_k

GEMM, GEMV, SPLIT_K = "gemm", "gemv", "split_k"
ROUTES = (GEMM, GEMV, SPLIT_K)
MIN_SLICE_K = 256  # K per split-K slice at least: its fp32 partial tile's round trip stays small next to its A and B reads
MAX_SPLITS = 16
SPLIT_BLOCK_K = 32  # metal4's split-K step (its staging is bypassed: the direct-global K loop)
STAGES = 1  # plain metal: threadgroup buffers per operand (MLX's steel loop; `_steel_tile` says why not 2)
SWIZZLE_PANEL = 8
SWIZZLE_MIN_TILES = 16  # tile rows and columns both at least this before swizzling (heuristic)
DEFAULT_CHIP = "M5"
# plain metal's candidate tiles: MLX's steel tiles (bm, bn, bk, simdgroups), those of its size classes
STEEL_TILES = ((64, 64, 16, 2), (64, 64, 16, 4), (64, 32, 32, 4), (32, 64, 16, 2))
KEEP_MLX_TILE = 0.01  # another steel tile replaces MLX's for the chip only when the model predicts it more than this faster


@dataclass(frozen=True)
class MatmulChoice:
    """What `matmul` builds for one problem and why. splits applies to split_k only, gemv_variant
    ("small_m": few rows of A; "small_n": few columns of B) to gemv only; block_k to split_k and to
    the staged gemm; stages (threadgroup buffers per operand) to the plain-metal gemm and split_k
    (0: the gemm reads device memory directly, kernels.gemm_direct_global)."""

    route: str
    M: int
    N: int
    K: int
    dtype: str
    out_dtype: str
    chip: str
    target: str  # "metal4" or "metal"
    block_m: int
    block_n: int
    threads: int
    block_k: int = 0
    swizzle: int = 0
    splits: int = 1
    stages: int = 0
    run_copies: tuple[str, ...] = ()  # staged operands copied in 16-byte runs (kernels.gemm.copy_runs)
    gemv_variant: str = ""
    trans_A: bool = False  # A stored (K, M)
    trans_B: bool = False  # B stored (N, K)
    reasons: tuple[str, ...] = ()
    batch: int = 0  # A (batch, M, K), out (batch, M, N) on the grid's z axis; 0: not batched
    shared_B: bool = False  # batched with one B (K, N) for every batch
    epilogue: str = "none"  # kernels.gemm_batched.EPILOGUES, fused on the accumulator
    alpha: float = 1.0  # the factor of A @ B (epilogues scale and alpha_beta)
    beta: float = 1.0  # the factor of C (epilogue alpha_beta)

    @property
    def simdgroups(self) -> int:
        return self.threads // 32

    def summary(self) -> str:
        layout = "".join(("T" if self.trans_A else "N", "T" if self.trans_B else "N"))
        layout = "" if layout == "NN" else f" {layout}"
        batch = f"{self.batch}x" if self.batch else ""
        shape = f"{batch}{self.M}x{self.N}x{self.K}{layout} {self.dtype}->{self.out_dtype} on {self.chip} ({self.target})"
        if self.batch:
            shape += ", B shared by the batch" if self.shared_B else ", B batched"
        if self.epilogue != "none":
            factors = {"scale": f"(alpha={self.alpha:g})", "alpha_beta": f"(alpha={self.alpha:g}, beta={self.beta:g})"}
            shape += f", epilogue {self.epilogue}{factors.get(self.epilogue, '')}"
        if self.route == GEMV:
            return f"matmul {shape}: gemv {self.gemv_variant}, {self.threads} threads"
        size = f"{self.block_m}x{self.block_n}" + (f"x{self.block_k}" if self.stages else "")
        staging = f", {self.stages} stage{'s' if self.stages > 1 else ''}" if self.stages else ""
        if self.run_copies:
            staging += f", {' and '.join(self.run_copies)} copied in 16-byte runs"
        tile = f"{size} tile{staging}, {self.threads} threads ({self.simdgroups} simdgroups), swizzle {self.swizzle or 'off'}"
        if self.route == SPLIT_K:
            return f"matmul {shape}: split_k in {self.splits} slices of K, {tile}"
        return f"matmul {shape}: gemm {'threadgroup-staged' if self.stages else 'direct-global'}, {tile}"

    def describe(self) -> list[str]:
        """The summary line, then one line per reason (what `lower --explain` prints)."""
        return [self.summary(), *(f"  because {reason}" for reason in self.reasons)]


def _resolve_chip(chip: str | Chip | None) -> tuple[Chip, str]:
    if isinstance(chip, Chip):
        return chip, f"chip {chip.name} ({chip.gpu_cores} GPU cores), as given"
    if chip is not None:
        found = chip_named(chip)
        return found, f"chip {found.name} ({found.gpu_cores} GPU cores), as given"
    found = detect_chip()
    if found is not None:
        return found, f"chip {found.name} ({found.gpu_cores} GPU cores), this Mac's"
    default = CHIPS[DEFAULT_CHIP]
    return default, f"no Apple GPU here: tuned for {default.name} ({default.gpu_cores} GPU cores); pass chip= to tune for another"


def _resolve_target(target: Any, on: Chip) -> tuple[str, str]:
    if target is None:
        name = "metal4" if on.generation >= 5 else "metal"
        return name, f"target {name}: {'M5 and newer have matmul2d hardware (metal4)' if name == 'metal4' else 'before M5, simdgroup matrices (no metal4 key)'}"
    if isinstance(target, str):
        if target not in ("metal4", "metal"):
            raise ValueError(f"matmul target={target!r} is not supported; use 'metal4', 'metal' or a tilelang Target")
        return target, f"target {target}, as given"
    name = capabilities_of(target).name
    return name, f"target {name}, from the given Target's keys"


INT32_MAX = 2**31 - 1


def _check(M: int, N: int, K: int, dtype: str, out_dtype: str) -> None:
    for name, value in (("M", M), ("N", N), ("K", K)):
        if value < 1:
            hint = ("C = A @ B over an empty K is all zeros: use torch.zeros((M, N)) instead of a kernel" if name == "K"
                    else "a matrix with no rows or columns has nothing to compute")
            raise ValueError(f"matmul needs {name} >= 1 (got {name}={value!r}); {hint}")
        if value > INT32_MAX:
            raise ValueError(f"matmul {name}={value} is over {INT32_MAX}, the largest extent a kernel's 32-bit shapes hold; split the product into smaller matmuls")
    for name, value in (("dtype", dtype), ("out_dtype", out_dtype)):
        if value not in DTYPES:
            raise ValueError(f"matmul {name}={value!r} is not supported; use one of {', '.join(DTYPES)}")


def _check_batch_epilogue(batch: Any, shared_B: Any, epilogue: Any, alpha: Any, beta: Any,
                          transposed: list[str]) -> tuple[int, float, float]:
    """(batch or 0, alpha, beta) once the batch and epilogue arguments are valid; one-line errors."""
    batch = check_batch("matmul", batch, shared_B)
    if epilogue not in BATCHED_EPILOGUES:
        raise ValueError(f"matmul epilogue={epilogue!r} is not supported; use one of {', '.join(BATCHED_EPILOGUES)}")
    for name, value, uses in (("alpha", alpha, ("scale", "alpha_beta")), ("beta", beta, ("alpha_beta",))):
        if value is None:
            continue
        if epilogue not in uses:
            raise ValueError(f"matmul {name}= applies to epilogue={' or '.join(map(repr, uses))} only (got epilogue={epilogue!r}); drop {name}=")
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"matmul {name}={value!r} must be a finite real number")
    if epilogue == "scale" and alpha is None:
        raise ValueError("matmul epilogue='scale' needs alpha= (out = alpha * (A @ B))")
    if transposed and (batch is not None or epilogue != "none"):
        raise ValueError(f"matmul: {' and '.join(transposed)} stored transposed with batch= or an epilogue is not supported yet; "
                         "transpose the operand with .transpose(-1, -2).contiguous() first")
    return batch or 0, float(1.0 if alpha is None else alpha), float(1.0 if beta is None else beta)


@dataclass(frozen=True)
class ChipTile:
    """The gemm route's tile for a chip class and problem: sizes, threads, K step and threadgroup
    buffers per operand (stages 0: no staging, the metal4 direct-global kernel), with the reason."""

    block_m: int
    block_n: int
    threads: int
    block_k: int
    stages: int
    reason: str


def steel_size_class(on: Chip) -> str:
    """MLX's device size class of a chip, read as MLX reads it: the last letter of the GPU's
    architecture name (`roofline.ARCHITECTURES`, sourced per chip), 'g' or 'p' "small", 'd' "large",
    any other "medium". Not the chip's name: the M2 and M4 Pro report 's', the Max's letter."""
    letter = on.architecture.size_letter
    return "small" if letter in "gp" else "large" if letter == "d" else "medium"


def _steel_tile(on: Chip, M: int, N: int, K: int, dtype: str, trans_A: bool, trans_B: bool, batch: int) -> ChipTile:
    """MLX's steel GEMM tile for the chip class (mlx/backend/metal/matmul.cpp, the steel_matmul tile
    selection of MLX 0.32: GEMM_TPARAM_MACRO), staged in one padded buffer per operand (MLX's loop:
    copy, barrier, multiply, barrier). Why MLX's tiles: at these sizes the registers (the accumulator
    of a 64x32 or 32x32 simdgroup tile, no register staging) and the threadgroup memory (one buffer,
    rows padded by 16 bytes) are MLX's, so a core holds as many threadgroups as it does for MLX's
    kernel (register_budget.threadgroups_per_core) and bank conflicts are none. A second stage would
    double the threadgroup memory or, with register staging, add the staged tile to the registers:
    either way fewer threadgroups per core. The wm x wn simdgroup grid is T.gemm's square partition
    of the tile over threads / 32 simdgroups, which is MLX's wm x wn for each of these tiles."""
    size_class = steel_size_class(on)
    nt = not trans_A and trans_B
    half = dtype in ("float16", "bfloat16")
    bm, bn, bk, simdgroups = 64, 64, 16, 4  # MLX's default (wm 2, wn 2): medium chips, and what no rule below changes
    if size_class == "small":
        if nt:
            bm, bn, bk, simdgroups = 64, 32, 32, 4
        elif half:
            bm, bn, bk, simdgroups = 64, 64, 16, 2
    elif size_class == "large":
        if max(batch, 1) * M * N >= 1 << 20:
            if half and 2 * max(M, N) > K:
                bm, bn, bk, simdgroups = 64, 64, 16, 2
            elif half and nt:
                bm, bn, bk, simdgroups = 64, 32, 32, 4
            elif half:
                bm, bn, bk, simdgroups = 32, 64, 16, 2
        elif half:
            bm, bn, bk, simdgroups = (64, 32, 32, 4) if nt else (64, 64, 16, 2)
        else:
            bm, bn, bk, simdgroups = (32, 64, 16, 2) if nt else (64, 32, 32, 4)
    why = (f"plain metal on {on.name} ({on.architecture.name}: MLX's {size_class} device class): MLX's steel tile {bm}x{bn}x{bk} on {simdgroups} "
           f"simdgroups, A and B staged in {STAGES} threadgroup buffer each, rows padded by 16 bytes (no bank conflicts), "
           "two barriers per K step: MLX's registers and threadgroup memory, so as many threadgroups per core")
    return ChipTile(bm, bn, 32 * simdgroups, bk, STAGES, why)


# metal4: the direct-global tiles (block_m, block_n, threads) the dispatch may ship, for the cost model to
# rank with each K split. First the in-tree backend's 64x128 on 4 simdgroups (32x64 of C each; the only
# metal4 tile measured on a Mac here: the spec's M5 table, 12.9 / 12.8 TFLOPS at 4096^3 / 2048^3), then
# the same share on other tiles (128x64 on 4, 128x128 on 8, 64x64 on 2 for grids that divide unevenly
# over the cores), then MLX's NAX tiles (32x32 per simdgroup: 64x128 on 8, 128x128 on 16). Exact ties in
# the model's order go to the earlier tile.
METAL4_TILES = ((64, 128, 128), (128, 64, 128), (128, 128, 256), (64, 64, 64), (64, 128, 256), (128, 128, 512))


def _swizzle_for(M: int, N: int, block_m: int, block_n: int) -> int:
    return SWIZZLE_PANEL if min(-(-M // block_m), -(-N // block_n)) >= SWIZZLE_MIN_TILES else 0


def _metal4_candidates(M: int, N: int, K: int, *, splittable: bool, swizzle_ok: bool, common: dict[str, Any],
                       tiles: tuple[tuple[int, int, int], ...] = METAL4_TILES) -> list[MatmulChoice]:
    """Every kernel the metal4 dispatch can ship for the problem: each METAL4_TILES direct-global tile
    (block swizzle where the grid is SWIZZLE_MIN_TILES a side), and where `splittable` each power-of-two
    count of K slices of at least MIN_SLICE_K, up to MAX_SPLITS."""
    found: list[MatmulChoice] = []
    most = max(1, min(MAX_SPLITS, K // MIN_SLICE_K)) if splittable and K >= 2 * MIN_SLICE_K else 1
    counts = sorted({effective_splits(K, 2**e, SPLIT_BLOCK_K) for e in range(1, most.bit_length())} - {1})
    for block_m, block_n, threads in tiles:
        found.append(MatmulChoice(GEMM, **common, block_m=block_m, block_n=block_n, threads=threads,
                                  swizzle=_swizzle_for(M, N, block_m, block_n) if swizzle_ok else 0))
        found += [MatmulChoice(SPLIT_K, **common, block_m=block_m, block_n=block_n, threads=threads, block_k=SPLIT_BLOCK_K,
                               splits=splits) for splits in counts]
    return found


def _model_pick(candidates: list[MatmulChoice], on: Chip, reasons: list[str], shipped: str) -> MatmulChoice:
    """The candidate the cost model ranks first (`cost_model.rank`), with reasons naming what was ranked
    (`shipped`), its predicted time and the runner-up's. Any list of choices the dispatch can build
    (route x tile x split count) may be ranked: metal4 passes `_metal4_candidates`; plain metal's
    staged tiles may be passed the same way once they settle (docs/performance.md, "Dispatch agreement")."""
    from ..performance import cost_model

    ranked = cost_model.rank((c, cost_model.estimate_choice(c, chip=on)) for c in candidates)
    first = ranked[0]
    pick = first.item
    tile = f"{pick.block_m}x{pick.block_n} on {pick.simdgroups} simdgroups" + (f", {pick.splits} K slices" if pick.route == SPLIT_K else "")
    why = [f"the cost model's first of {len(ranked)} candidates the {pick.target} dispatch ships ({shipped}): {tile}, "
           f"predicted {first.seconds * 1e6:.1f} us on {on.name}, {first.estimate.bound}-bound (an estimate)"]
    if len(ranked) > 1:
        second = ranked[1].item
        other = f"{second.block_m}x{second.block_n} on {second.simdgroups} simdgroups" + (
            f", {second.splits} K slices" if second.route == SPLIT_K else "")
        tie = (f" (the same {cost_model.NEAR_TIE:.0%} time class: operand reuse, memory traffic, core loads, resident threads, "
               "then the tile order decide)") if ranked[1].band == first.band else ""
        why.append(f"the runner-up, {other}, is predicted {ranked[1].seconds * 1e6:.1f} us{tie}")
    if pick.route == SPLIT_K:
        why.append(f"{pick.splits} slices of {-(-pick.K // pick.splits)} of K, partials in an fp32 workspace summed in a fixed "
                   "order (deterministic)")
    if pick.swizzle:
        why.append(f"swizzle in panels of {pick.swizzle}, so threadgroups running together share rows of A and columns of B in cache")
    return replace(pick, reasons=tuple(reasons + why))


def _plain_split_ranking(on: Chip, M: int, N: int, K: int, dtype: str, out_dtype: str, batch: int, block_m: int,
                         block_n: int, threads: int, block_k: int, stages: int, swizzle: int, splittable: bool) -> list[Any]:
    """Plain metal: the staged tile unsplit and, where `splittable`, in each power-of-two count of K
    slices of at least MIN_SLICE_K, in the cost model's order (`cost_model.rank`: within NEAR_TIE, less
    memory traffic, so unsplit). The split's second kernel (the combine) and its launch count against
    it: a rule on the tile count alone split 1024^3 on the Ultra chips, where the model predicts the
    combine costs more than the slices gain."""
    from ..performance import cost_model

    most = max(1, min(MAX_SPLITS, K // MIN_SLICE_K)) if splittable else 1
    counts = [1] + sorted({effective_splits(K, 2**e, block_k) for e in range(1, most.bit_length())} - {1})
    estimated = []
    for count in counts:
        kernel = cost_model.plugin_kernel(cost_model.SHARED, block_m, block_n, threads, metal4=False, block_k=block_k,
                                          stages=stages, swizzle=0 if count > 1 else swizzle, splits=count, K=K,
                                          route=SPLIT_K if count > 1 else GEMM, dtype=dtype)
        if kernel is not None:
            estimated.append((count, cost_model.predict(kernel, M, N, K, chip=on, dtype=dtype, out_dtype=out_dtype,
                                                        batch=max(1, batch))))
    return cost_model.rank(estimated)


def _plain_split(on: Chip, M: int, N: int, K: int, dtype: str, out_dtype: str, batch: int, block_m: int, block_n: int,
                 threads: int, block_k: int, stages: int, swizzle: int) -> tuple[int, list[str]]:
    """The K slices of the staged tile (`_plain_split_ranking`'s first), with the reason."""
    ranked = _plain_split_ranking(on, M, N, K, dtype, out_dtype, batch, block_m, block_n, threads, block_k, stages, swizzle,
                                  splittable=True)
    if not ranked:
        return 1, []
    first = ranked[0]
    unsplit = next(r for r in ranked if r.item == 1)
    options = ", ".join(f"{r.item}: {r.seconds * 1e6:.1f} us" for r in sorted(ranked, key=lambda r: r.item))
    counts = sorted(r.item for r in ranked)
    why = (f"the cost model ranks the tile unsplit and in {', '.join(str(c) for c in counts[1:])} K slices (predicted "
           f"{options} on {on.name}, estimates): {'unsplit' if first.item == 1 else f'{first.item} slices'}")
    if first.item > 1:
        why += f", {unsplit.seconds / first.seconds:.2f}x faster than unsplit"
    return first.item, [why]


def _tile_name(tile: ChipTile) -> str:
    return f"{tile.block_m}x{tile.block_n}x{tile.block_k} on {tile.threads // 32}"


def steel_tile_ranking(on: Chip, mlx_tile: ChipTile, M: int, N: int, K: int, dtype: str, out_dtype: str, batch: int, *,
                       splittable: bool, swizzle_ok: bool) -> list[tuple[ChipTile, Any]]:
    """Plain metal's candidates (issue 35 item 1): MLX's four steel tiles (STEEL_TILES) as the cost model
    predicts them on the problem, each with its best K split where `splittable` (`_plain_split_ranking`'s
    first), kept where a core holds at least the threadgroups of MLX's tile for the chip (the
    register_budget estimate the model uses) and the tiles load at most the device bytes of MLX's
    (compare_mlx's load instructions and device transactions per FLOP: a 32x64 tile where MLX's is
    64x64 reads B's panel twice as often, whatever the model predicts) and pass at most its barriers
    (a 16-deep K step on a 32x64 tile passes two per 32x64x16 of work, MLX's 64x32x32 two per 64x32x32);
    fastest first. Every one is replay-free (rows padded by 16 bytes; a transposed or odd-pitch operand
    copied in 16-byte runs, each stored with one instruction); a tile a small side would shrink
    (kernels/small_m.py) is not one of them."""
    found = []
    for bm, bn, bk, simdgroups in STEEL_TILES:
        if small_side_tile(M, N, bm, bn, "metal") is not None:
            continue
        swizzle = _swizzle_for(M, N, bm, bn) if swizzle_ok else 0
        ranked = _plain_split_ranking(on, M, N, K, dtype, out_dtype, batch, bm, bn, 32 * simdgroups, bk, STAGES, swizzle,
                                      splittable)
        if ranked:
            found.append((ChipTile(bm, bn, 32 * simdgroups, bk, STAGES, ""), ranked[0].estimate))
    mlx = next((estimate for tile, estimate in found if tile == replace(mlx_tile, reason="")), None)
    if mlx is not None:  # issue 35's bounds against MLX's kernel: occupancy at least its, device loads and barriers at most its
        bound = mlx.counts
        found = [(tile, estimate) for tile, estimate in found
                 if estimate.counts.threadgroups_per_core >= bound.threadgroups_per_core
                 and estimate.counts.core_load_bytes <= bound.core_load_bytes
                 and estimate.counts.launch_barriers <= bound.launch_barriers]
    return sorted(found, key=lambda pair: pair[1].seconds)


def _model_steel_tile(on: Chip, mlx_tile: ChipTile, M: int, N: int, K: int, dtype: str, out_dtype: str, batch: int, *,
                      splittable: bool, swizzle_ok: bool) -> tuple[ChipTile, str]:
    """The candidate of `steel_tile_ranking` the model predicts fastest, MLX's tile for the chip unless
    another is more than KEEP_MLX_TILE faster: a difference that small is model noise (its inputs are
    estimates), and MLX's tile is the one measured on that class of chip. With the reason."""
    ranked = steel_tile_ranking(on, mlx_tile, M, N, K, dtype, out_dtype, batch, splittable=splittable, swizzle_ok=swizzle_ok)
    plain_mlx = replace(mlx_tile, reason="")
    mlx = next((estimate for tile, estimate in ranked if tile == plain_mlx), None)
    if mlx is None:  # no candidate the model can plan: MLX's tile by rule
        return mlx_tile, ""
    fastest, best = ranked[0]
    pick = plain_mlx if best.seconds * (1 + KEEP_MLX_TILE) >= mlx.seconds else fastest
    times = ", ".join(f"{_tile_name(tile)}: {estimate.seconds * 1e6:.1f} us" for tile, estimate in ranked)
    why = (f"the cost model ranks MLX's steel tiles with at least the {mlx.counts.threadgroups_per_core} threadgroups per core "
           f"and at most the device loads and barriers of MLX's {_tile_name(plain_mlx)} simdgroups (predicted on {on.name}, estimates: {times}): ")
    if pick == plain_mlx:
        why += (f"MLX's tile kept" + (f" (the fastest, {_tile_name(fastest)}, is within {KEEP_MLX_TILE:.0%})" if fastest != plain_mlx else
                                      ", the fastest"))
    else:
        why += f"{_tile_name(pick)} simdgroups, {mlx.seconds / best.seconds:.3f}x faster than MLX's tile"
    return pick, why


def matmul_config(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    out_dtype: str | None = None,
    *,
    chip: str | Chip | None = None,
    target: Any = None,
    trans_A: bool = False,
    trans_B: bool = False,
    batch: int | None = None,
    shared_B: bool = False,
    epilogue: str = "none",
    alpha: float | None = None,
    beta: float | None = None,
) -> MatmulChoice:
    """The kernel `matmul` builds for C (M, N) = A (M, K) @ B (K, N), with its reasons. `chip`: a
    name of `roofline.CHIPS` or a `Chip` (default: this Mac's, else M5); `target`: "metal4",
    "metal" or a Target (default: metal4 on M5 and newer, else metal). `trans_A`: A is stored
    (K, M); `trans_B`: B is stored (N, K); such problems take the tiled GEMM route.

    `batch`: A is (batch, M, K), B (batch, K, N) or with `shared_B` one (K, N), the output
    (batch, M, N), the batch on the grid's z axis. `epilogue` (kernels.gemm_batched.EPILOGUES) is
    fused on the accumulator: bias (N,), alpha * (A @ B) (scale), alpha * (A @ B) + beta * C
    (alpha_beta: torch.addmm / baddbmm; beta defaults to 1, beta=0 does not read C), A @ B + C
    (residual), relu, gelu_tanh, silu. Batched or epilogued problems take the tiled GEMM route."""
    out_dtype = out_dtype or dtype
    M, N, K = integer_sizes("matmul", M=M, N=N, K=K)
    _check(M, N, K, dtype, out_dtype)
    for name, flag in (("trans_A", trans_A), ("trans_B", trans_B)):
        if not isinstance(flag, bool):
            raise ValueError(f"matmul {name}={flag!r} must be True or False")
    transposed = [name for name, flag in (("A", trans_A), ("B", trans_B)) if flag]
    batch, alpha, beta = _check_batch_epilogue(batch, shared_B, epilogue, alpha, beta, transposed)
    on, chip_reason = _resolve_chip(chip)
    target_name, target_reason = _resolve_target(target, on)
    reasons = [chip_reason, target_reason]
    common = {"M": M, "N": N, "K": K, "dtype": dtype, "out_dtype": out_dtype, "chip": on.name, "target": target_name,
              "trans_A": trans_A, "trans_B": trans_B, "batch": batch, "shared_B": shared_B, "epilogue": epilogue,
              "alpha": alpha, "beta": beta}
    if batch:
        reasons.append(f"batch={batch} on the grid's z axis ({'one B (K, N) for every batch' if shared_B else 'B (batch, K, N)'})")
    if epilogue != "none":
        reasons.append(f"epilogue {epilogue} on the float32 accumulator before the one store: the tiled GEMM "
                       "(kernels.gemm_batched); the GEMV and split-K kernels apply no epilogue yet")
    # kernels.gemm_batched (the tiled GEMM) and split-K take a batch; an epilogue only the tiled GEMM
    tiled_only = ([f"batch={batch}"] if batch else []) + ([f"epilogue {epilogue}"] if epilogue != "none" else [])
    if transposed:
        reasons.append(f"{' and '.join(transposed)} stored transposed: the GEMV and split-K kernels read A (M, K) and "
                       "B (K, N) only, so the tiled GEMM, which reads either layout")

    if min(M, N) <= GEMV_MAX_ROWS and not transposed and epilogue == "none":
        small_m = M <= N
        side, value = ("M", M) if small_m else ("N", N)
        variant = "small_m" if small_m else "small_n"
        axis = "columns of B with vector loads along N" if small_m else "rows of A with vector loads along K"
        reasons.append(f"{side}={value} <= {GEMV_MAX_ROWS}: GEMV streams the {axis}; a 64-row GEMM tile would compute "
                       f"{64 - value} padding {'rows' if small_m else 'columns'} of every 64")
        return MatmulChoice(GEMV, **common, block_m=0, block_n=0, threads=128, gemv_variant=variant, reasons=tuple(reasons))

    if target_name == "metal4":  # the cost model picks the tile and the K split (docs/performance.md, "Cost model")
        if tiled_only:
            reasons.append(f"a grid of tiles{' per batch' if batch else ''}: no swizzle (kernels.gemm_batched launches tiles in grid order)")
        if epilogue != "none" and K >= 2 * MIN_SLICE_K:
            reasons.append(f"epilogue {epilogue}: split-K applies no epilogue yet, so only the tiled GEMM (kernels.gemm_batched) is ranked")
        elif K < 2 * MIN_SLICE_K and not transposed:
            reasons.append(f"K={K} < {2 * MIN_SLICE_K}: too short to split (slices of at least {MIN_SLICE_K}), so only tiled GEMMs are ranked")
        tiles = METAL4_TILES
        small = small_side_tile(M, N, *METAL4_TILES[0][:2], target_name)  # 9..48 rows, or few columns (kernels/small_m.py)
        if small is not None:  # ranked first: exact ties go to it
            tiles = (small[:3],) + tuple(t for t in METAL4_TILES if t != small[:3])
        candidates = _metal4_candidates(M, N, K, splittable=not transposed and epilogue == "none", swizzle_ok=not tiled_only,
                                        common=common, tiles=tiles)
        shipped = f"direct-global tiles {', '.join(f'{m}x{n}/{t // 32}' for m, n, t in tiles)}, each with K slices where allowed"
        pick = _model_pick(candidates, on, reasons, shipped)
        if small is not None and (pick.block_m, pick.block_n, pick.threads) == small[:3]:
            pick = replace(pick, reasons=pick.reasons[:len(reasons)] + (small[3],) + pick.reasons[len(reasons):])
        return pick

    # plain metal (M1-M4): MLX's steel tiles ranked by the cost model (at least MLX's threadgroups per core),
    # then the K split; the model's agreement is checked in tests/unit/test_dispatch_agrees_with_model.py
    tile = _steel_tile(on, M, N, K, dtype, trans_A, trans_B, batch)
    reasons.append(tile.reason)
    small = small_side_tile(M, N, tile.block_m, tile.block_n, target_name)  # 9..48 rows, or few columns (kernels/small_m.py)
    # row pitches as stored: A (M, K) has rows of K elements, A^T (K, M) rows of M; B (K, N) of N, B^T (N, K) of K
    pitches = (("M" if trans_A else "K", M if trans_A else K), ("K" if trans_B else "N", K if trans_B else N))
    odd_pitch = [value * (4 if dtype == "float32" else 2) % 16 != 0 for _, value in pitches]
    # every dtype and layout is ranked: the model's registers follow the operand type (fp32 fragments take
    # two registers a lane: 101 for 64x64x16 on 2, as printed), steel_tile_ranking keeps out a tile that
    # passes more barriers than MLX's, and a transposed or odd-pitch operand's copies replay no bank on any
    # steel tile (copy_runs stores each 16-byte run with one instruction;
    # test_tiles_the_model_picks_over_mlx_s_match_torch_under_racecheck)
    if small is None:
        tile, why = _model_steel_tile(on, tile, M, N, K, dtype, out_dtype, batch, swizzle_ok=not tiled_only,
                                      splittable=K >= 2 * MIN_SLICE_K and not transposed and epilogue == "none")
        reasons += [why] if why else []
    block_m, block_n, threads, block_k, stages = tile.block_m, tile.block_n, tile.threads, tile.block_k, tile.stages
    if small is not None:
        block_m, block_n, threads, small_reason = small
        reasons.append(small_reason)
    elif M <= block_m // 2 and block_m > 64:
        block_m, threads = 64, threads // 2
        reasons.append(f"M={M} fills at most half a 128-row tile: 64x{block_n} on {threads // 32} simdgroups instead")

    tiles_m, tiles_n = -(-M // block_m), -(-N // block_n)
    tiles = tiles_m * tiles_n * max(batch, 1)
    swizzle = SWIZZLE_PANEL if min(tiles_m, tiles_n) >= SWIZZLE_MIN_TILES and not tiled_only else 0
    splits = 1
    if K >= 2 * MIN_SLICE_K and not transposed and epilogue != "none":
        reasons.append(f"epilogue {epilogue}: split-K applies no epilogue yet, so the tiled GEMM (kernels.gemm_batched), unsplit")
    elif K >= 2 * MIN_SLICE_K and not transposed:
        splits, why = _plain_split(on, M, N, K, dtype, out_dtype, batch, block_m, block_n, threads, block_k, stages, swizzle)
        reasons += why
    run_copies = tuple(operand for operand, is_odd in zip("AB", odd_pitch) if is_odd) if stages else ()
    if run_copies and tiled_only:
        reasons.append(f"row pitch of {' and '.join(run_copies)} is not a multiple of 16 bytes, but batched or epilogued operands "
                       "are staged with T.copy (copy_runs reads 2-D operands only): one element per thread")
        run_copies = ()
    if run_copies:
        odd = sorted({f"{name}={value}" for (name, value), is_odd in zip(pitches, odd_pitch) if is_odd})
        verb = "are not multiples" if len(odd) > 1 else "is not a multiple"
        reasons.append(f"row pitch {' and '.join(odd)} ({dtype}) {verb} of 16 bytes: T.copy would stage "
                       f"{' and '.join(run_copies)} one element per thread, so each thread copies runs of 16 bytes "
                       "(kernels.gemm.copy_runs: one packed 16-byte move per run inside the matrix)")
    if splits > 1:
        reasons.append(f"{splits} slices of {-(-K // splits)} of K ({tiles * splits} threadgroups; slices >= {MIN_SLICE_K}, "
                       f"at most {MAX_SPLITS}), partials in an fp32 workspace summed in a fixed order (deterministic)")
        return MatmulChoice(SPLIT_K, **common, block_m=block_m, block_n=block_n, threads=threads, block_k=block_k,
                            splits=splits, stages=stages, run_copies=run_copies, reasons=tuple(reasons))
    if transposed and K >= 2 * MIN_SLICE_K:
        reasons.append("split-K takes untransposed operands only: unsplit")
    elif K < 2 * MIN_SLICE_K:
        reasons.append(f"K={K} < {2 * MIN_SLICE_K}: too short to split (slices of at least {MIN_SLICE_K})")

    if tiled_only:
        reasons.append(f"a {tiles_m}x{tiles_n} grid of tiles{f' per batch' if batch else ''}: no swizzle (kernels.gemm_batched "
                       "launches tiles in grid order)")
    elif swizzle:
        reasons.append(f"a {tiles_m}x{tiles_n} grid of tiles: swizzle in panels of {swizzle}, so threadgroups running together "
                       "share rows of A and columns of B in cache")
    else:
        reasons.append(f"a {tiles_m}x{tiles_n} grid of tiles: no swizzle (below {SWIZZLE_MIN_TILES} tiles on a side)")
    return MatmulChoice(GEMM, **common, block_m=block_m, block_n=block_n, threads=threads, swizzle=swizzle,
                        **({"block_k": block_k, "stages": stages, "run_copies": run_copies} if stages else {}), reasons=tuple(reasons))


def matmul_program(choice: MatmulChoice, *, trans_A: bool = False, trans_B: bool = False) -> Any:
    """The `T.prim_func` of a choice (compile with `out_idx=[-1]`), in the operand layouts the
    choice was made for; trans_A / trans_B (the gemm route only) add a transpose to it: A stored
    (K, M), B stored (N, K), the same tile and kernel."""
    if not isinstance(choice, MatmulChoice):
        raise ValueError(f"matmul_program choice={choice!r} must be a MatmulChoice; build one with kernels.matmul_config(M, N, K)")
    flags("matmul_program", trans_A=trans_A, trans_B=trans_B)
    M, N, K, dtype, out_dtype = choice.M, choice.N, choice.K, choice.dtype, choice.out_dtype
    trans_A, trans_B = trans_A or choice.trans_A, trans_B or choice.trans_B
    if (trans_A or trans_B) and choice.route != GEMM:
        raise ValueError(f"matmul: the {choice.route} route takes A (M, K) and B (K, N) only; transpose the operands "
                         "with .t().contiguous() first, or build kernels.gemm_staged / gemm_direct_global with trans_A / trans_B")
    if choice.route == GEMM and (choice.batch or choice.epilogue != "none"):
        if trans_A or trans_B:
            raise ValueError("matmul: a transposed operand with batch= or an epilogue is not supported yet; transpose "
                             "the operand with .transpose(-1, -2).contiguous() first")
        return gemm_batched(M, N, K, choice.block_m, choice.block_n, choice.block_k or SPLIT_BLOCK_K,
                            batch=choice.batch or None, shared_B=choice.shared_B, dtype=dtype, out_dtype=out_dtype,
                            threads=choice.threads, num_stages=choice.stages, epilogue=choice.epilogue,
                            alpha=choice.alpha, beta=choice.beta)
    if choice.route == GEMV:
        build = gemv_small_m if choice.gemv_variant == "small_m" else gemv_small_n
        return build(M, N, K, dtype=dtype, out_dtype=out_dtype, batch=choice.batch or None, shared_B=choice.shared_B)
    if choice.route == SPLIT_K:
        return gemm_split_k(M, N, K, choice.splits, choice.block_m, choice.block_n, choice.block_k, dtype=dtype,
                            out_dtype=out_dtype, threads=choice.threads, num_stages=choice.stages,
                            copy_in_runs=choice.run_copies, batch=choice.batch or None, shared_B=choice.shared_B)
    if choice.stages:
        return gemm_staged(M, N, K, choice.block_m, choice.block_n, choice.block_k, dtype=dtype, out_dtype=out_dtype,
                           threads=choice.threads, trans_A=trans_A, trans_B=trans_B, num_stages=choice.stages,
                           swizzle_panel=choice.swizzle, keep_staging=True, copy_in_runs=choice.run_copies)
    return gemm_direct_global(M, N, K, choice.block_m, choice.block_n, dtype=dtype, out_dtype=out_dtype,
                              threads=choice.threads, trans_A=trans_A, trans_B=trans_B, swizzle_panel=choice.swizzle)


def choice_target(choice: MatmulChoice) -> Any:
    return metal4_target() if choice.target == "metal4" else plain_metal_target()


def matmul(
    M: int,
    N: int,
    K: int,
    dtype: str = "float16",
    out_dtype: str | None = None,
    *,
    chip: str | Chip | None = None,
    target: Any = None,
    execution_backend: str | None = None,
    trans_A: bool = False,
    trans_B: bool = False,
    batch: int | None = None,
    shared_B: bool = False,
    epilogue: str = "none",
    alpha: float | None = None,
    beta: float | None = None,
) -> Any:
    """The compiled kernel `matmul_config` chooses, called as `kernel(A, B) -> C` (A (K, M) with
    `trans_A`, B (N, K) with `trans_B`), `kernel(A, B, bias)` with epilogue "bias", `kernel(A, B, C)`
    with "alpha_beta" or "residual"; batched operands with `batch` (see `matmul_config`)."""
    choice = matmul_config(M, N, K, dtype, out_dtype, chip=chip, target=target, trans_A=trans_A, trans_B=trans_B,
                           batch=batch, shared_B=shared_B, epilogue=epilogue, alpha=alpha, beta=beta)
    return compile_choice(choice, execution_backend)


def compile_choice(choice: MatmulChoice, execution_backend: str | None = None, *, trans_A: bool = False,
                   trans_B: bool = False) -> Any:
    import tilelang

    kwargs = {"execution_backend": execution_backend} if execution_backend else {}
    program = matmul_program(choice, trans_A=trans_A, trans_B=trans_B)
    return tilelang.compile(program, out_idx=[-1], target=choice_target(choice), **kwargs)
