"""Lowering time of the default GEMM (4096^3 fp16, direct-global, 64x128, 128 threads, metal4):
the plugin vs the in-tree backend, alternated in one process. Prints both medians and the ratio.

    python benchmark/bench_lower.py [--repeats 15] [--m 4096 --n 4096 --k 4096]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tilelang  # noqa: E402
from tilelang import tvm  # noqa: E402

import tilelang_metal  # noqa: E402
from tilelang_metal import kernels as examples  # noqa: E402


def lower_once(func, target) -> tuple[float, str]:
    t0 = time.perf_counter()
    with tvm.transform.PassContext(), target:
        source = tilelang.lower(func, target=target).kernel_source
    return time.perf_counter() - t0, source


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--m", type=int, default=4096)
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--k", type=int, default=4096)
    args = parser.parse_args()
    func = examples.gemm_direct_global(args.m, args.n, args.k)
    target = examples.metal4_target()

    times = {"plugin": [], "in-tree": []}
    for mode in ("plugin", "in-tree"):  # warm both paths once (imports, FFI, first-pass caches)
        (tilelang_metal.activate if mode == "plugin" else tilelang_metal.deactivate)()
        lower_once(func, target)
    for _ in range(args.repeats):
        for mode in ("plugin", "in-tree"):
            (tilelang_metal.activate if mode == "plugin" else tilelang_metal.deactivate)()
            seconds, source = lower_once(func, target)
            assert source.startswith("// tilelang_metal") == (mode == "plugin")
            times[mode].append(seconds)
    tilelang_metal.activate()
    plugin = statistics.median(times["plugin"])
    in_tree = statistics.median(times["in-tree"])
    print(f"lowering {args.m}x{args.n}x{args.k} fp16 direct-global GEMM, {args.repeats} alternated repeats")
    print(f"  plugin   median {plugin * 1e3:8.1f} ms")
    print(f"  in-tree  median {in_tree * 1e3:8.1f} ms")
    print(f"  ratio plugin / in-tree = {plugin / in_tree:.2f}x")


if __name__ == "__main__":
    main()
