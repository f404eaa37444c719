"""The cost model (tilelang_metal/performance/cost_model.py) against GEMM throughput measured on real Macs.

    python benchmark/calibrate.py --dry-run --out DIR    # anywhere: published results vs the model's predictions
    python benchmark/calibrate.py --out DIR              # on a Mac: also times the same problems here

Writes DIR/calibration.csv (`source, chip, implementation, problem, published_tflops, predicted_tflops`,
then the model's error, the predicted kernel and a note; on a Mac `measured_tflops` for this machine's
rows) and prints the model's error per row. Every prediction comes from the same kernel's counts: MLX's
kernels through the configuration its dispatch picks (the MLX reference tier's port,
tests/mlx_reference/mlx_gemm.py and mlx_nax.py), the in-tree TileLang backend's kernel from the
configuration its source states. MPS results are context only (no kernel to count): no prediction.
The dry run goes through everything but the timing.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "tests" / "mlx_reference")]

TOLERANCE = 0.25  # the largest model error a calibration row may have (docs/performance.md, "Cost model")
COLUMNS = ("source", "chip", "implementation", "problem", "published_tflops", "predicted_tflops", "measured_tflops",
           "model_error", "kernel", "note")
MLX, TILELANG_IN_TREE, PLUGIN, MPS = "MLX", "TileLang in-tree Metal", "tilelang_metal", "MPS"

_SEED = "../shared/seeds/000_088498cdb05bd744.txt (the spec, 5.6 Current Performance Snapshot: MacBook Air M5, 10-core GPU, fp16, mean of 100)"
_M3_ULTRA = "https://github.com/ml-explore/mlx/issues/3196"
_M4_AIR = "https://dev.to/tinyalg/278-tflops-on-a-fanless-macbook-air-benchmarking-apples-m4-with-mlx-38n4"
_M4_MAX_MPS = "https://github.com/chsasank/device-benchmarks/pull/13"
_M1_PRO_MPS = "https://github.com/zzc0721/torch-performance-test-data/issues/191"
_M4_MAX = "https://github.com/jackzampolin/rustane/blob/941f126b59c5f065c40a8756c90b75a9a10c07bc/results/gpu_tflops_m4max.md"
_M2_ULTRA_424 = "https://github.com/ml-explore/mlx/pull/424"
_M2_ULTRA_1518 = "https://github.com/ml-explore/mlx/pull/1518"
GIB_FLOP = 2**30 / 1e12  # TFLOP per "GFLOP" of MLX's benchmarks/python/blas/bench_gemm.py, which divides by 1024**3


@dataclass(frozen=True)
class Published:
    """One published measurement: chip as `roofline.CHIPS` names it, with the GPU core count of the
    machine measured (None: the table's)."""

    source: str
    chip: str
    gpu_cores: int | None
    implementation: str
    M: int
    N: int
    K: int
    dtype: str
    tflops: float
    note: str = ""

    @property
    def problem(self) -> str:
        return f"{self.M}x{self.N}x{self.K} {self.dtype}"


# fmt: off
PUBLISHED: tuple[Published, ...] = (
    *(Published(_SEED, "M5", 10, impl, m, n, k, "float16", t)
      for (m, n, k), mlx, tl in (((4096, 4096, 4096), 12.7, 12.9), ((2048, 2048, 2048), 11.5, 12.8),
                                 ((4096, 2048, 4096), 12.5, 12.8), ((2048, 4096, 4096), 12.4, 12.6))
      for impl, t in ((MLX, mlx), (TILELANG_IN_TREE, tl))),
    *(Published(_SEED, "M5", 10, MPS, m, n, k, "float16", t, "PyTorch MPS: context, no kernel to count")
      for (m, n, k), t in (((4096, 4096, 4096), 13.6), ((2048, 2048, 2048), 13.6), ((4096, 2048, 4096), 13.6),
                           ((2048, 4096, 4096), 13.4))),
    # M3 Ultra, 60-core GPU, MLX 0.31.1 via mlx-swift, bf16, median of 15 (comment of 2026-08-11); C = M x N
    *(Published(_M3_ULTRA, "M3 Ultra", 60, MLX, m, n, k, "bfloat16", t)
      for m, k, n, t in ((4096, 5376, 4096, 17.5), (4096, 14336, 4096, 18.9), (4096, 14336, 5376, 18.7),
                         (15731, 2688, 4096, 18.1), (15731, 5376, 5376, 18.1), (15731, 14336, 4096, 16.7),
                         (15731, 14336, 5376, 16.4))),
    # M4 MacBook Air (fanless), MLX 0.28.0, bf16, mean of 5; the GPU core count is not stated (8 or 10):
    # the table's 10-core M4 is assumed
    *(Published(_M4_AIR, "M4", None, MLX, s, s, s, "bfloat16", t,
                "fanless: the author reports throttling across runs; GPU cores not stated (10 assumed)")
      for s, t in ((10000, 2.70), (20000, 2.78))),
    # M4 Max, 40-core GPU, MLX 0.31.0, table "Results" (2026-03-10); bench/gpu_tflops.py of the same commit:
    # inputs evaluated first, then per launch `a @ b; mx.eval(c)` timed by perf_counter, median of 100 after
    # 10 warmup. Its three 512-row problems (0.3 ms a launch) are left out: a host round trip per launch is
    # part of each time there and the model counts GPU time only (docs/performance.md, "Calibration")
    *(Published(_M4_MAX, "M4 Max", 40, MLX, m, n, k, dtype, t)
      for (m, n, k), dtype, t in (((4096, 4096, 4096), "float16", 14.74), ((4096, 4096, 4096), "float32", 13.07),
                                  ((8192, 8192, 8192), "float16", 14.26))),
    # M2 Ultra, float32, batch 1, "nn". #424: comment of 2024-01-18 ("recorded on an M2 Ultra"), "Post FLOPS"
    # column, from bench_gemm.py of that commit (80 x 5 launches per timing, GFLOP = 2**30 FLOP). #1518:
    # first benchmark comment (2024-10-25), column gflops_mx (the MLX release before the PR), its unit
    # taken as bench_gemm.py's. GPU cores not stated: 76, since #424's 4096^3 (22.0 TFLOPS) is above a
    # 60-core M2 Ultra's 21.5 TFLOPS peak. Both MLX versions pick the tile the port does (64x64x16, 2x2)
    *(Published(_M2_ULTRA_424, "M2 Ultra", 76, MLX, m, n, k, "float32", round(g * GIB_FLOP, 2),
                f"{g} GFLOP/s as posted (2**30 FLOP)")
      for m, n, k, g in ((1024, 1024, 2048, 13122.696), (4096, 4096, 4096, 20464.456))),
    *(Published(_M2_ULTRA_1518, "M2 Ultra", 76, MLX, m, n, k, "float32", round(g * GIB_FLOP, 2),
                f"{g} GFLOP/s as posted (2**30 FLOP assumed)")
      for m, n, k, g in ((1024, 4096, 11008, 19117.517), (2048, 4096, 11008, 19217.543),
                         (4096, 4096, 11008, 19131.385), (8192, 4096, 11008, 19118.967),
                         (1024, 11008, 4096, 19397.411), (2048, 11008, 4096, 19901.953),
                         (4096, 11008, 4096, 20224.684), (8192, 11008, 4096, 20370.913),
                         (4096, 4096, 4096, 20587.211), (4095, 4095, 4095, 17565.664),
                         (4097, 4097, 4097, 17311.481), (1333, 4096, 4096, 18111.473))),
    Published(_M4_MAX_MPS, "M4 Max", 40, MPS, 4096, 4096, 4096, "float32", 13.35, "PyTorch MPS float32: context, no kernel to count"),
    Published(_M1_PRO_MPS, "M1 Pro", 16, MPS, 4096, 4096, 4096, "float16", 4.75, "PyTorch MPS: context, no kernel to count"),
)
# fmt: on


def chip_of(p: Published) -> Any:
    from tilelang_metal.performance import roofline

    found = roofline.chip(p.chip)
    return found.scaled_to(p.gpu_cores) if p.gpu_cores else found


def mlx_size_class(chip: Any) -> str:
    """The last letter of the chip's GPU architecture name (`roofline.ARCHITECTURES`), which MLX's
    dispatch reads: the M1, M2, M4 and M5 Pro report their Max's 's', the M3 Pro 'p'."""
    return chip.architecture.size_letter


def kernel_for(implementation: str, chip: Any, M: int, N: int, K: int, dtype: str) -> Any:
    """The kernel the implementation runs for the problem on `chip`, as the cost model sees it; None
    for MPS (closed source)."""
    from tilelang_metal.performance import cost_model
    from tilelang_metal import kernels

    if implementation == MLX:
        klass = mlx_size_class(chip)
        if chip.generation >= 5:
            import mlx_nax

            bm, bn, bk, wm, wn = mlx_nax.gemm_tiles(M, N, K, klass)
            log = mlx_nax.swizzle_log_for(-(-M // bm), klass)
            swizzle = 1 << log if log else 0  # the tile width in blocks; 0: no swizzle
            return cost_model.mlx_kernel(bm, bn, bk, wm, wn, nax=True, swizzle=swizzle, dtype=dtype)
        import mlx_gemm
        import torch

        device = mlx_gemm.Device(f"applegpu_g{12 + chip.generation}{klass}")
        bm, bn, bk, wm, wn = mlx_gemm.gemm_tile(M, N, K, getattr(torch, dtype), False, False, device)
        return cost_model.mlx_kernel(bm, bn, bk, wm, wn, nax=False, dtype=dtype)
    if implementation == TILELANG_IN_TREE:  # the spec's benchmark: ct_global, block_M=64, block_N=128, threads=128
        return cost_model.plugin_kernel(cost_model.DIRECT_GLOBAL, 64, 128, 128, metal4=True, K=K, dtype=dtype)
    if implementation == PLUGIN:
        return kernels.matmul_config(M, N, K, dtype, chip=chip)
    return None


def predicted_tflops(implementation: str, chip: Any, M: int, N: int, K: int, dtype: str) -> tuple[float | None, str]:
    from tilelang_metal.performance import cost_model

    kernel = kernel_for(implementation, chip, M, N, K, dtype)
    if kernel is None:
        return None, ""
    flops = 2 * M * N * K
    if implementation == PLUGIN:
        return flops / cost_model.predict_choice(kernel, chip=chip) / 1e12, kernel.summary()
    est = cost_model.predict(kernel, M, N, K, chip=chip, dtype=dtype)
    return est.tflops(flops), f"{kernel.describe()}; {est.bound}-bound"


def row(p: Published, measured: float | None = None) -> dict[str, Any]:
    predicted, kernel = predicted_tflops(p.implementation, chip_of(p), p.M, p.N, p.K, p.dtype)
    error = None if predicted is None or not p.tflops else predicted / p.tflops - 1
    note = p.note
    if error is not None and abs(error) > TOLERANCE:
        note = f"outside {TOLERANCE:.0%}: {note}" if note else f"outside {TOLERANCE:.0%}"
    return {"source": p.source, "chip": chip_of(p).name + (f" ({p.gpu_cores}-core GPU)" if p.gpu_cores else ""),
            "implementation": p.implementation, "problem": p.problem, "published_tflops": p.tflops,
            "predicted_tflops": None if predicted is None else round(predicted, 2), "measured_tflops": measured,
            "model_error": None if error is None else round(error, 3), "kernel": kernel, "note": note}


# ---------------------------------------------------------------- on a Mac: the same problems, timed here


def timers(M: int, N: int, K: int, dtype: str) -> list[tuple[str, Callable[[], Any]]]:
    """(implementation, runner factory) for what this Mac can run: the plugin through torch MPS, MLX, MPS matmul."""
    import harness
    import torch

    tdt = getattr(torch, dtype)
    found: list[tuple[str, Callable[[], Any]]] = []
    if harness.mps_available():
        from tilelang_metal import kernels

        a, b = torch.randn(M, K, dtype=tdt, device="mps"), torch.randn(K, N, dtype=tdt, device="mps")
        kernel = kernels.matmul(M, N, K, dtype)
        found.append((PLUGIN, lambda: harness.Runner(PLUGIN, lambda: kernel(a, b), harness.torch_mps_sync)))
        found.append((MPS, lambda: harness.Runner(MPS, lambda: a @ b, harness.torch_mps_sync)))
    mx = harness.mlx_core()
    if mx is not None:
        xa, xb = mx.random.normal((M, K)).astype(getattr(mx, dtype)), mx.random.normal((K, N)).astype(getattr(mx, dtype))
        found.append((MLX, lambda: harness.mlx_runner(MLX, mx, lambda: xa @ xb)))
    return found


def measure_here(chip: Any, log: Callable[[str], None]) -> list[dict[str, Any]]:
    """The published problems, timed on this Mac (median of interleaved trials), beside the prediction."""
    import harness

    rows = []
    problems = sorted({(p.M, p.N, p.K, p.dtype) for p in PUBLISHED if max(p.M, p.N, p.K) <= 16384})
    for M, N, K, dtype in problems:
        runners = [make() for _, make in timers(M, N, K, dtype)]
        launches = harness.calibrate_launches(runners, 0.2, 1, 50)
        times = harness.time_interleaved(runners, trials=5, launches=launches)
        for r in runners:
            measured = 2 * M * N * K / harness.statistics.median(times[r.name]) / 1e12
            mine = Published(f"this Mac ({chip.name})", chip.name, chip.gpu_cores, r.name, M, N, K, dtype, measured)
            out = row(mine, round(measured, 2))
            rows.append(out)
            log(f"{chip.name} {r.name} {mine.problem}: measured {measured:.2f} TFLOPS, predicted {out['predicted_tflops']}")
    return rows


def write(rows: list[dict[str, Any]], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "calibration.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({k: "" if r[k] is None else r[k] for k in COLUMNS})
    return path


def main(argv: list[str] | None = None, log: Callable[[str], None] = print) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="directory for calibration.csv")
    ap.add_argument("--dry-run", action="store_true", help="published results and predictions only (no timing: any host)")
    args = ap.parse_args(argv)
    import tilelang_metal  # noqa: F401  (installs the plugin)
    from tilelang_metal.performance.roofline import detect_chip

    rows = [row(p) for p in PUBLISHED]
    if not args.dry_run:
        chip = detect_chip()
        if chip is None:
            ap.error("timing needs a Mac with a known Apple GPU (roofline.CHIPS); use --dry-run elsewhere")
        rows += measure_here(chip, log)
    path = write(rows, args.out)
    for r in rows:
        if r["model_error"] is not None:
            reference = r["measured_tflops"] or r["published_tflops"]
            log(f"{r['chip']:24s} {r['implementation']:24s} {r['problem']:26s} {reference:6.2f} TFLOPS, predicted "
                f"{r['predicted_tflops']:6.2f} ({r['model_error']:+.0%}){'  ' + r['note'] if r['note'] else ''}")
    errors = [abs(r["model_error"]) for r in rows if r["model_error"] is not None]
    log(f"wrote {path}: {len(rows)} rows, {len(errors)} predicted, largest model error {max(errors):.0%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
