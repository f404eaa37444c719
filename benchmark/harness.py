"""Shared timing and reporting for the GPU benchmarks (bench_gemm.py, bench_attention.py).

Timing: every backend of one problem is timed in the same trial, in ABBA order (forward, then
backwards), so slow drift (thermal throttling, clocks ramping) hits all backends alike. One
measurement is `launches` back-to-back launches between two device synchronisations; a trial's
time for a backend is the mean of its two measurements; the report gives the median and the 90th
percentile over the trials.

Reporting: one `Row` per (problem, backend), written as CSV (every column), a Markdown table
(pivot: problems down, backends across, with the environment above it) and a PNG bar chart.
"""

from __future__ import annotations

import csv
import importlib.metadata
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# Row.status values
OK, NOT_AVAILABLE, ERROR, WRONG = "ok", "n/a", "error", "wrong"
DRY_RUN_NOTE = "EMULATOR DRY RUN: the plugin ran on the CPU emulator; timings mean nothing about a GPU"


@dataclass
class Runner:
    """One backend ready to run one problem: `launch()` enqueues one launch and returns its output;
    `sync()` waits for the device."""

    name: str
    launch: Callable[[], Any]
    sync: Callable[[], None] = lambda: None


@dataclass
class Row:
    """One (problem, backend) result. `case` holds the problem's own columns (shape, dtype, ...)."""

    case: dict[str, Any]
    backend: str
    status: str
    flops: float
    verified: bool = False
    rel_err: float | None = None
    median_s: float | None = None
    p90_s: float | None = None
    trials: int = 0
    launches: int = 0
    peak_tflops: float | None = None
    note: str = ""

    @property
    def label(self) -> str:
        return str(self.case.get("label", ""))

    @property
    def tflops(self) -> float | None:
        return None if not self.median_s else self.flops / self.median_s / 1e12

    @property
    def pct_peak(self) -> float | None:
        t = self.tflops
        return None if t is None or not self.peak_tflops else 100.0 * t / self.peak_tflops


# ---------------------------------------------------------------- timing


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (q in [0, 100])."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of no values")
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _measure(runner: Runner, launches: int) -> float:
    runner.sync()
    t0 = time.perf_counter()
    for _ in range(launches):
        runner.launch()
    runner.sync()
    return (time.perf_counter() - t0) / launches


def calibrate_launches(runners: Sequence[Runner], target_seconds: float, at_least: int, at_most: int) -> int:
    """Launches per measurement so that the slowest backend's measurement takes about
    `target_seconds` (bounded to [at_least, at_most])."""
    slowest = max(_measure(r, 1) for r in runners) if runners else 0.0
    if slowest <= 0:
        return at_least
    return max(at_least, min(at_most, math.ceil(target_seconds / slowest)))


def time_interleaved(runners: Sequence[Runner], *, trials: int, launches: int, warmup: int = 1) -> dict[str, list[float]]:
    """Seconds per launch of each runner, one value per trial, measured in ABBA order."""
    if trials < 1 or launches < 1:
        raise ValueError("trials and launches must be >= 1")
    for r in runners:
        for _ in range(warmup):
            r.launch()
        r.sync()
    times: dict[str, list[float]] = {r.name: [] for r in runners}
    order = list(runners)
    for _ in range(trials):
        pair: dict[str, list[float]] = {r.name: [] for r in runners}
        for r in order + order[::-1]:
            pair[r.name].append(_measure(r, launches))
        for name, values in pair.items():
            times[name].append(statistics.fmean(values))
        order = order[1:] + order[:1]  # rotate who goes first between trials
    return times


def record_times(row: Row, seconds: Sequence[float], launches: int) -> Row:
    row.median_s = statistics.median(seconds)
    row.p90_s = percentile(seconds, 90)
    row.trials, row.launches = len(seconds), launches
    return row


def measure_case(
    case: str,
    backends: Sequence[str],
    flops: float,
    peak: float | None,
    make_runner: Callable[[str], "Runner | str"],
    check: Callable[[str, Any], "tuple[float, float, str]"],
    *,
    dry_run: bool,
    trials: int,
    target_ms: float,
    max_launches: int,
) -> list[Row]:
    """One problem on every backend: build each runner (`make_runner(backend)` returns a Runner, or
    a string saying why the backend is not available), check its output once (`check(backend, out)`
    gives the relative error, the tolerance and a note for a correct result), then time the correct
    ones interleaved (a WRONG one is not launched again). A backend that raises is an `error` row, not
    the end of the benchmark."""
    rows: dict[str, Row] = {}
    runners: list[Runner] = []
    for backend in backends:
        row = rows[backend] = Row(case, backend, NOT_AVAILABLE, flops, peak_tflops=peak)
        try:
            made = make_runner(backend)
            if isinstance(made, str):
                row.note = made
                continue
            out = made.launch()
            made.sync()
            row.rel_err, tolerance, note = check(backend, out)
            row.verified = row.rel_err <= tolerance
            row.status = OK if row.verified else WRONG
            row.note = note if row.verified else f"max |out - ref| / max |ref| = {row.rel_err:.3g} > {tolerance}; not timed"
            if row.verified:  # a wrong result is never launched again, let alone timed
                runners.append(made)
        except Exception as err:  # a failing backend is a result, not the end of the benchmark
            row.status, row.note = ERROR, f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"
    if runners:
        launches = 1 if dry_run else calibrate_launches(runners, target_ms / 1e3, 3, max_launches)
        times = time_interleaved(runners, trials=trials, launches=launches, warmup=1 if dry_run else 3)
        for name, seconds in times.items():
            record_times(rows[name], seconds, launches)
    return list(rows.values())


MIN_TRIALS = 5  # fewer give no meaningful median and p90


def add_run_options(ap: Any, stem: str, *, dry_run_help: str, max_launches: int) -> None:
    """The options every benchmark takes: output directory, dry run and the timing budget."""
    ap.add_argument("--out", type=Path, default=Path("bench_results"), help=f"directory for {stem}.csv/.md/.png (default: %(default)s)")
    ap.add_argument("--dry-run", action="store_true", help=dry_run_help)
    ap.add_argument("--trials", type=int, default=7, help=f"timed trials per problem, >= {MIN_TRIALS} (default: %(default)s)")
    ap.add_argument("--target-ms", type=float, default=200.0, help="length of one measurement (launches back to back), ms (default: %(default)s)")
    ap.add_argument("--max-launches", type=int, default=max_launches, help="cap on launches per measurement (default: %(default)s)")


def check_run_options(ap: Any, args: Any) -> None:
    """Usage errors shared by the benchmarks: too few trials, or a GPU run without MPS."""
    if args.trials < MIN_TRIALS:
        ap.error(f"--trials {args.trials}: need at least {MIN_TRIALS} for a median and a p90")
    if not args.dry_run and not mps_available():
        ap.error("no MPS device: this benchmark times the Mac's GPU; use --dry-run elsewhere")


def relative_error(out: Any, ref: Any) -> float:
    """max |out - ref| / max |ref|, in float32 on the CPU."""
    o = out.float().cpu()
    r = ref.float().cpu()
    if o.shape != r.shape:
        raise ValueError(f"output shape {tuple(o.shape)} != reference shape {tuple(r.shape)}")
    scale = r.abs().max().item() or 1.0
    err = (o - r).abs().max().item()
    return float("inf") if math.isnan(err) else err / scale


# ---------------------------------------------------------------- environment


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git_commit() -> str:
    import subprocess

    try:
        out = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return out.stdout.strip() or "unknown"


def metal4_status(*, dry_run: bool) -> str:
    """One line: can this host's torch and MLX run the plugin's metal4 (MSL 4.0) kernels? The checks
    the torch and MLX backends make before a metal4 kernel's first launch
    (tilelang_metal.execution.metal4_launch), so a Mac without MSL 4.0 is told why its metal4 rows
    are errors, and which runtime to update."""
    if dry_run:
        return "not checked (dry run: the emulator runs the metal4 kernels)"
    import importlib.util

    from tilelang_metal.execution import metal4_launch

    parts = []
    for runtime, module in (("torch", "torch"), ("mlx", "mlx")):
        if importlib.util.find_spec(module) is None:
            parts.append(f"{runtime}: not installed")
            continue
        problems = metal4_launch.missing(metal4_launch.current(runtime))
        parts.append(f"{runtime}: " + ("yes" if not problems else "no, " + "; ".join(problems)))
    return "; ".join(parts)


def environment(chip: Any, *, dry_run: bool, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What the numbers were measured on: chip and its peak (from tilelang_metal.performance.roofline), OS,
    Python and library versions."""
    mac = platform.mac_ver()[0]
    env = {
        "chip": f"{chip.name} ({chip.gpu_cores} GPU cores)" if chip else f"unknown ({platform.machine()})",
        "chip peak (fp16 matrix)": (f"{chip.matrix_tflops:g} TFLOP/s{' (estimated)' if chip.estimated else ''}, "
                                    f"{chip.bandwidth_gbs:g} GB/s; {chip.source}") if chip else "n/a",
        "os": f"macOS {mac}" if mac else f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }
    for dist in ("tilelang", "tilelang-metal", "torch", "mlx", "numpy", "matplotlib"):
        env[dist] = _version(dist)
    env["tilelang_metal commit"] = _git_commit()
    env["Metal 4 (MSL 4.0) kernels"] = metal4_status(dry_run=dry_run)
    if dry_run:
        env["mode"] = DRY_RUN_NOTE
    env.update(extra or {})
    return env


# ---------------------------------------------------------------- writers


def _fmt(x: float | None, digits: int = 4) -> str:
    return "" if x is None else f"{x:.{digits}g}"


def write_csv(rows: Sequence[Row], path: Path) -> Path:
    case_keys = list(dict.fromkeys(k for r in rows for k in r.case))
    metric_keys = ["backend", "status", "verified", "rel_err", "median_ms", "p90_ms", "tflops", "pct_peak",
                   "trials", "launches", "peak_tflops", "note"]
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(case_keys + metric_keys)
        for r in rows:
            w.writerow([r.case.get(k, "") for k in case_keys] + [
                r.backend, r.status, r.verified, _fmt(r.rel_err, 3),
                _fmt(r.median_s and r.median_s * 1e3), _fmt(r.p90_s and r.p90_s * 1e3),
                _fmt(r.tflops), _fmt(r.pct_peak, 3), r.trials, r.launches, _fmt(r.peak_tflops), r.note,
            ])
    return path


def _cell(r: Row | None) -> str:
    if r is None or r.status == NOT_AVAILABLE:
        return "n/a"
    if r.status == ERROR:
        return "error"
    text = _fmt(r.tflops, 3) or "-"
    if r.pct_peak is not None:
        text += f" ({r.pct_peak:.3g}%)"
    return text if r.status == OK else f"WRONG {text}"


def write_markdown(rows: Sequence[Row], env: dict[str, str], path: Path, *, title: str, backends: Sequence[str],
                   case_columns: Sequence[str], ratio_of: str, ratio_to: Sequence[str]) -> Path:
    """Pivot table: one line per problem, one TFLOPS column per backend (with % of the chip's
    peak), then `ratio_of` / each of `ratio_to` (median TFLOPS ratios, where both ran and verified)."""
    lines = [f"# {title}", ""]
    lines += [f"- **{k}**: {v}" for k, v in env.items()]
    lines += ["", "TFLOP/s from the median of the trials (p90 and errors in the CSV); in brackets % of the chip's "
              "peak. `n/a`: backend not available here; `error`: it failed (CSV note); `WRONG`: its result failed "
              "the check against the fp32 reference.", ""]
    header = list(case_columns) + list(backends) + [f"{ratio_of} / {b}" for b in ratio_to]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault(r.label, {})[r.backend] = r
    for label, per_backend in by_case.items():
        case = next(iter(per_backend.values())).case
        cells = [str(case.get(c, "")) for c in case_columns]
        cells += [_cell(per_backend.get(b)) for b in backends]
        mine = per_backend.get(ratio_of)
        for other_name in ratio_to:
            other = per_backend.get(other_name)
            ok = mine and other and mine.status == OK and other.status == OK and mine.tflops and other.tflops
            cells.append(f"{mine.tflops / other.tflops:.2f}x" if ok else "n/a")
        lines.append("| " + " | ".join(cells) + " |")
    notes = [f"- {r.label} / {r.backend}: {r.note}" for r in rows if r.note and r.status in (ERROR, WRONG)]
    if notes:
        lines += ["", "Failures:", ""] + notes
    path.write_text("\n".join(lines) + "\n")
    return path


def write_chart(rows: Sequence[Row], env: dict[str, str], path: Path, *, title: str, backends: Sequence[str],
                peak_tflops: float | None) -> Path:
    """Grouped bars: TFLOP/s per problem and backend; the right axis reads the same bars as % of peak."""
    try:
        import matplotlib
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the benchmark chart needs matplotlib: pip install -e '.[bench]' (or pip install matplotlib)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(dict.fromkeys(r.label for r in rows))
    table = {(r.label, r.backend): r for r in rows}
    width = 0.8 / max(1, len(backends))
    fig, ax = plt.subplots(figsize=(min(40.0, max(8.0, 0.35 * len(labels) * max(1, len(backends)) / 2 + 3)), 5.5))
    for i, backend in enumerate(backends):
        xs, ys = [], []
        for j, label in enumerate(labels):
            r = table.get((label, backend))
            if r is not None and r.status == OK and r.tflops is not None:
                xs.append(j + (i - (len(backends) - 1) / 2) * width)
                ys.append(r.tflops)
        ax.bar(xs, ys, width, color=f"C{i}", label=backend if ys else f"{backend} (n/a)")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s (median)")
    subtitle = env.get("mode", "") or f"{env.get('chip', '')}, {env.get('os', '')}"
    ax.set_title(f"{title}\n{subtitle}", fontsize=9)
    if peak_tflops:
        ax.secondary_yaxis("right", functions=(lambda t: 100.0 * t / peak_tflops, lambda p: p * peak_tflops / 100.0)).set_ylabel(
            f"% of peak ({peak_tflops:g} TFLOP/s)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_progress(rows: Sequence[Row], out_dir: Path, stem: str) -> Path:
    """The CSV of the rows so far, rewritten after every problem: an interrupted or crashed run keeps
    what it measured."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return write_csv(rows, out_dir / f"{stem}.csv")


def write_all(rows: Sequence[Row], env: dict[str, str], out_dir: Path, stem: str, *, title: str, backends: Sequence[str],
              case_columns: Sequence[str], ratio_of: str, ratio_to: Sequence[str], peak_tflops: float | None,
              chart: bool = True) -> dict[str, Path]:
    """CSV and Markdown always; the PNG chart when `chart` and matplotlib is installed (otherwise one
    line says it was skipped: the measured numbers are in the other two files)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {
        "csv": write_csv(rows, out_dir / f"{stem}.csv"),
        "md": write_markdown(rows, env, out_dir / f"{stem}.md", title=title, backends=backends, case_columns=case_columns,
                             ratio_of=ratio_of, ratio_to=ratio_to),
    }
    if chart:
        try:
            files["png"] = write_chart(rows, env, out_dir / f"{stem}.png", title=title, backends=backends, peak_tflops=peak_tflops)
        except ModuleNotFoundError as err:
            print(f"chart skipped: {err}", file=sys.stderr)
    return files


def mps_available() -> bool:
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def mlx_core() -> Any | None:
    """`mlx.core` where MLX is installed and has a GPU, else None."""
    try:
        import mlx.core as mx

        return mx if mx.metal.is_available() else None
    except Exception:
        return None


def mlx_runner(name: str, mx: Any, compute: Callable[[], Any]) -> Runner:
    """A Runner for an MLX computation: launches are queued (`async_eval`) and waited for at sync.
    Only the last output is kept (the stream runs in order, so waiting for it waits for all; keeping
    every output of a long measurement would hold gigabytes)."""
    last: list[Any] = []

    def launch() -> Any:
        out = compute()
        if hasattr(mx, "async_eval"):
            mx.async_eval(out)
            last[:] = [out]
        else:
            mx.eval(out)
        return out

    def sync() -> None:
        if last:
            mx.eval(*last)
            last.clear()
        if hasattr(mx, "synchronize"):
            mx.synchronize()

    return Runner(name, launch, sync)


def torch_mps_sync() -> None:
    import torch

    torch.mps.synchronize()

