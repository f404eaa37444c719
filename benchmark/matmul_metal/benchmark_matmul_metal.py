"""The spec's GEMM benchmark (seed 000, section 5.6): torch MPS, MLX and tilelang_metal on the same
fp16 GEMM, fp32 accumulation and fp16 output, the default direct-global kernel (64x128 tiles, 128
threads). After `--warmup` launches, `--repeats` launches run back to back and TFLOP/s comes from
their MEAN latency (the spec's aggregation: not a median, not best-of-N). Every backend's output is
checked against an fp32 reference before it is timed; a wrong one is reported and not timed.

    TILELANG_DISABLE_CACHE=1 python benchmark/matmul_metal/benchmark_matmul_metal.py --m 4096 --n 4096 --k 4096 --warmup 10 --repeats 100
    python benchmark/matmul_metal/benchmark_matmul_metal.py              # the spec's four shapes
    python benchmark/matmul_metal/benchmark_matmul_metal.py --dry-run    # anywhere: small shapes, the plugin in the emulator

Exit status: 0 when every tilelang result matched the reference, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import harness  # noqa: E402

SPEC_SHAPES = ((4096, 4096, 4096), (2048, 2048, 2048), (4096, 2048, 4096), (2048, 4096, 4096))  # M x N x K
DRY_SHAPES = ((128, 256, 64), (64, 128, 128))
TOLERANCE = 1e-2  # max |C - ref| / max |ref| for fp16 output


def mean_seconds(launch: Callable[[], Any], sync: Callable[[], None], warmup: int, repeats: int) -> float:
    """Mean latency of `repeats` consecutive launches after `warmup` ones (one sync before, one after)."""
    for _ in range(warmup):
        launch()
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        launch()
    sync()
    return (time.perf_counter() - t0) / repeats


def backends_for(m: int, n: int, k: int, a: Any, b: Any, dry_run: bool) -> dict[str, tuple[Callable[[], Any], Callable[[], None]] | str]:
    """Each backend's (launch, sync), or why it cannot run here."""
    import tilelang
    import torch

    from tilelang_metal import kernels as examples

    func = examples.gemm_direct_global(m, n, k, 64, 128, dtype="float16", out_dtype="float16", threads=128)
    out: dict[str, Any] = {}
    if dry_run:
        kernel = tilelang.compile(func, out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator")
        out["tilelang"] = (lambda: kernel(a, b), lambda: None)
        out["torch-mps"] = "dry run: no MPS device"
        out["mlx"] = "dry run: no Metal GPU"
        return out
    kernel = tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="torch")
    out["tilelang"] = (lambda: kernel(a, b), harness.torch_mps_sync)
    out["torch-mps"] = (lambda: torch.mm(a, b), harness.torch_mps_sync)
    mx = harness.mlx_core()
    if mx is None:
        out["mlx"] = "mlx not installed or no Metal GPU"
    else:
        am, bm = (mx.array(x.float().cpu().numpy()).astype(mx.float16) for x in (a, b))
        runner = harness.mlx_runner("mlx", mx, lambda: mx.matmul(am, bm))

        def launch_mlx() -> Any:
            import numpy as np

            return torch.from_numpy(np.array(runner.launch().astype(mx.float32)))

        out["mlx"] = (launch_mlx, runner.sync)
        out["mlx-timed"] = (runner.launch, runner.sync)  # the timed launches skip the conversion
    return out


def run_shape(m: int, n: int, k: int, args: argparse.Namespace) -> list[dict[str, Any]]:
    import torch

    device = "cpu" if args.dry_run else "mps"
    gen = torch.Generator().manual_seed(m + 3 * n + 7 * k)
    a = torch.randn(m, k, generator=gen).half().to(device)
    b = torch.randn(k, n, generator=gen).half().to(device)
    ref = a.float() @ b.float()
    rows = []
    made = backends_for(m, n, k, a, b, args.dry_run)
    for name in ("torch-mps", "mlx", "tilelang"):
        row: dict[str, Any] = {"M": m, "N": n, "K": k, "backend": name, "status": harness.NOT_AVAILABLE, "rel_err": "", "mean_ms": "", "tflops": "", "note": ""}
        entry = made[name]
        if isinstance(entry, str):
            row["note"] = entry
            rows.append(row)
            continue
        launch, sync = entry
        check_out = launch()
        sync()
        err = harness.relative_error(check_out, ref)
        row["rel_err"] = f"{err:.3g}"
        if err > TOLERANCE:
            row.update(status=harness.WRONG, note=f"max |C - ref| / max |ref| = {err:.3g} > {TOLERANCE}; not timed")
            rows.append(row)
            continue
        timed_launch, timed_sync = made.get(f"{name}-timed", entry)  # type: ignore[misc]
        seconds = mean_seconds(timed_launch, timed_sync, 0 if args.dry_run else args.warmup, 1 if args.dry_run else args.repeats)
        row.update(status=harness.OK, mean_ms=f"{seconds * 1e3:.4g}", tflops=f"{2.0 * m * n * k / seconds / 1e12:.4g}")
        rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]], dry_run: bool) -> str:
    lines = ["Shape\tPyTorch MPS\tMLX\tTileLang\tTileLang / MLX"]
    by_shape: dict[tuple[int, int, int], dict[str, dict[str, Any]]] = {}
    for r in rows:
        by_shape.setdefault((r["M"], r["N"], r["K"]), {})[r["backend"]] = r

    def cell(r: dict[str, Any]) -> str:
        if r["status"] == harness.OK:
            return f"{r['tflops']} TFLOPS"
        return "WRONG" if r["status"] == harness.WRONG else "n/a"

    for (m, n, k), per in by_shape.items():
        mine, mlx = per["tilelang"], per["mlx"]
        ratio = f"{float(mine['tflops']) / float(mlx['tflops']):.0%}" if mine["status"] == mlx["status"] == harness.OK else "n/a"
        lines.append(f"{m} x {n} x {k}\t{cell(per['torch-mps'])}\t{cell(mlx)}\t{cell(mine)}\t{ratio}")
    if dry_run:
        lines.append(harness.DRY_RUN_NOTE)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--m", type=int, default=None, help="rows of A and C (with --n and --k: one shape; default: the spec's four shapes)")
    ap.add_argument("--n", type=int, default=None, help="columns of B and C")
    ap.add_argument("--k", type=int, default=None, help="reduction length")
    ap.add_argument("--warmup", type=int, default=10, help="untimed launches before the timed ones (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=100, help="timed consecutive launches; TFLOP/s from their mean latency (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help="small shapes, the plugin in the CPU emulator, GPU backends n/a (for CI)")
    ap.add_argument("--out", type=Path, default=None, help="also write the rows as CSV into this directory (benchmark_matmul_metal.csv)")
    args = ap.parse_args(argv)
    given = [args.m, args.n, args.k]
    if any(v is not None for v in given) and not all(v is not None and v > 0 for v in given):
        ap.error("--m, --n and --k go together, each a positive integer")
    if args.warmup < 0 or args.repeats < 1:
        ap.error("--warmup must be >= 0 and --repeats >= 1")
    if not args.dry_run and not harness.mps_available():
        ap.error("no MPS device: this benchmark times the Mac's GPU; use --dry-run elsewhere")
    import tilelang_metal  # noqa: F401  (the plugin takes over target="metal")

    shapes = [tuple(given)] if args.m is not None else list(DRY_SHAPES if args.dry_run else SPEC_SHAPES)
    rows: list[dict[str, Any]] = []
    for m, n, k in shapes:
        print(f"{m} x {n} x {k} ...", flush=True)
        rows += run_shape(m, n, k, args)
        if args.out is not None:
            _write_csv(rows, args.out / "benchmark_matmul_metal.csv")  # after every shape: a crash keeps what ran
    print(_table(rows, args.dry_run))
    bad = [r for r in rows if r["backend"] == "tilelang" and r["status"] != harness.OK]
    return 1 if bad else 0


def _write_csv(rows: list[dict[str, Any]], path: Path) -> None:
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    raise SystemExit(main())
