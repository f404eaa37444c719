"""Emulator benchmark: compile time (cold / cached) and execution time of a 1024^3 fp16 GEMM.

The GEMM is a hand-written MSL kernel in the printer's shape (tests/emulator/emu_msl_kernels.py,
`mpp_gemm_bench`, also checked for correctness by the test-suite): MPP matmul2d(16, 32, 16)
cooperative tensors, threadgroup tile 64x128, 128 threads = 4 simdgroups each owning 32x64 = 2x2
destination tensors, K loop in steps of 16. Goal: <= 5 s execution on 2 cores.

    python benchmark/bench_emulator.py [--size 1024] [--repeat 3] [--workers N] [--no-racecheck]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "emulator"))

import emu_msl_kernels
import torch

import tilelang_metal.emulator as emu
from tilelang_metal.emulator.kernel import default_workers


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="M = N = K (multiple of 128)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--workers", type=int, default=None, help="worker threads (default: cores)")
    ap.add_argument("--no-racecheck", dest="racecheck", action="store_false", help="skip the racecheck timing")
    args = ap.parse_args()
    n = args.size
    src = emu_msl_kernels.mpp_gemm_bench(n, n, n)
    workers = args.workers or default_workers()

    # Compile times, in a private cache so that "cold" really is cold.
    with tempfile.TemporaryDirectory(prefix="tlm-bench-cache-") as cache:
        os.environ["TILELANG_METAL_EMULATOR_CACHE"] = cache
        emu.clear_memory_cache()
        _, cold_all = timed(lambda: emu.compile_kernel(src))  # runtime + kernel
        _, cold_kernel = timed(lambda: emu.compile_kernel(src, checked=False))  # kernel only
        emu.clear_memory_cache()
        _, cached_disk = timed(lambda: emu.compile_kernel(src))
        _, cached_mem = timed(lambda: emu.compile_kernel(src))
        stats = emu.build_stats()
        print(f"compile cold (runtime + kernel): {cold_all:8.3f} s")
        print(f"compile cold (kernel only)     : {cold_kernel:8.3f} s")
        print(f"compile cached (disk)          : {cached_disk * 1e3:8.2f} ms")
        print(f"compile cached (in process)    : {cached_mem * 1e6:8.1f} us")
        print(f"builds: {stats['kernel_builds']} kernel, {stats['runtime_builds']} runtime, {stats.get('prelude_builds', 0)} precompiled prelude")
        # Per-kernel cost once the runtime and the prelude exist: median of a few distinct kernels.
        kernel_times = []
        for extra in (128, 256, 384):
            other = emu_msl_kernels.mpp_gemm_bench(n, n + extra, n)
            kernel_times.append(timed(lambda: emu.compile_kernel(other, checked=False))[1])
        print(f"compile cold (further kernels) : {statistics.median(kernel_times):8.3f} s (median of 3)")

        torch.manual_seed(0)
        a = torch.randn(n, n, dtype=torch.float16)
        b = torch.randn(n, n, dtype=torch.float16)
        ref = a.float() @ b.float()
        grid = (n // 128, n // 64, 1)
        for checked in (True, False):
            k = emu.compile_kernel(src, checked=checked)
            times = []
            for _ in range(args.repeat):
                c = torch.zeros(n, n)
                t0 = time.perf_counter()
                k.launch([a, b, c], grid=grid, block=(128, 1, 1), workers=workers)
                times.append(time.perf_counter() - t0)
            err = (c - ref).abs().max().item()
            mode = "checked  " if checked else "unchecked"
            print(
                f"execute {n}x{n}x{n} fp16 GEMM, {mode}, {workers} worker(s): "
                f"best {min(times):.3f} s, median {statistics.median(times):.3f} s "
                f"({2 * n**3 / min(times) / 1e9:.2f} GFLOP/s), max |err| {err:.2e}"
            )
            if not err < 1e-2:
                print("ERROR: result differs from torch", file=sys.stderr)
                return 1
            if checked:
                checked_best = min(times)
        if args.racecheck:
            # racecheck runs each schedule on one worker: compare with a checked run on one worker too
            k = emu.compile_kernel(src)
            one_worker = []
            for _ in range(args.repeat):
                c = torch.zeros(n, n)
                one_worker.append(timed(lambda: k.launch([a, b, c], grid=grid, block=(128, 1, 1), workers=1))[1])
            emu.compile_kernel(src, instrument="racecheck")  # build outside the timing
            c = torch.zeros(n, n)
            seeds = (0, 1)
            _, rc_seconds = timed(lambda: emu.launch_racecheck(src, [a, b, c], grid, (128, 1, 1), seeds=seeds))
            per_schedule = rc_seconds / len(seeds)
            print(
                f"racecheck {n}x{n}x{n}, {len(seeds)} schedules (1 worker each): {rc_seconds:.3f} s, "
                f"{per_schedule:.3f} s per schedule = {per_schedule / min(one_worker):.1f}x the checked run on 1 worker "
                f"({min(one_worker):.3f} s), {per_schedule / checked_best:.1f}x on {workers} worker(s); "
                f"max |err| {(c - ref).abs().max().item():.2e}"
            )
    return plugin_kernel(n, args.repeat)


def plugin_kernel(n: int, repeat: int) -> int:
    """The same GEMM as the plugin generates it (default direct-global kernel, fp16 in/out)."""
    import tilelang

    from tilelang_metal import kernels as examples

    func = examples.gemm_direct_global(n, n, n)
    (kernel, seconds) = timed(lambda: tilelang.compile(func, out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator"))
    torch.manual_seed(0)
    a = torch.randn(n, n, dtype=torch.float16)
    b = torch.randn(n, n, dtype=torch.float16)
    kernel(a, b)  # build the emulator library once
    times = []
    for _ in range(repeat):
        c, t = timed(lambda: kernel(a, b))
        times.append(t)
    err = (c.float() - a.float() @ b.float()).abs().max().item()
    print(
        f"plugin-generated {n}^3 fp16 direct-global GEMM (lower {seconds:.2f} s): "
        f"best {min(times):.3f} s, median {statistics.median(times):.3f} s, max |err| {err:.3g} (fp16 output)"
    )
    return 0 if err < 0.02 * n**0.5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
