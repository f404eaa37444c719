"""GEMM on the Mac's GPU: the plugin vs torch.mm on MPS, mlx.core.matmul (if installed) and TileLang's
in-tree Metal backend, timed interleaved (ABBA) in one process, every result checked against an fp32
reference. Writes gemm.csv, gemm.md and gemm.png into --out (see docs/benchmarks.md).

    python benchmark/bench_gemm.py --out results/            # on a Mac (M1 or newer, torch with MPS)
    python benchmark/bench_gemm.py --dry-run --out /tmp/bg   # anywhere: small shapes, plugin in the emulator

Exit status: 0 when every plugin result matched the reference, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")  # plugin and in-tree lowerings never share a cache entry
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Row, Runner  # noqa: E402

BACKENDS = ("plugin", "torch-mps", "mlx", "in-tree")
DTYPES = {"fp16": ("float16", "float16"), "bf16": ("bfloat16", "bfloat16"), "fp16->fp32": ("float16", "float32"),
          "fp32": ("float32", "float32")}
LAYOUTS = ("NN", "NT", "TN")  # NT: B stored N x K (T.gemm transpose_B); TN: A stored K x M (transpose_A)
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2, "float32": 1e-3}  # max |C - ref| / max |ref|, by C's dtype


@dataclass(frozen=True)
class Shape:
    group: str
    m: int
    n: int
    k: int


FULL_SHAPES = (
    *(Shape("square", s, s, s) for s in (1024, 2048, 4096, 8192)),
    Shape("skinny", 4096, 4096, 256),
    Shape("skinny", 64, 4096, 4096),
    Shape("skinny", 1, 4096, 4096),
    Shape("ragged", 4000, 4000, 4000),
    Shape("ragged", 4095, 4097, 4096),
    Shape("fused", 4096, 4096, 4096),  # C = gelu_tanh(A @ B + bias): one plugin kernel vs GEMM + elementwise
)
GROUPS = ("square", "skinny", "ragged", "fused")
FUSED_LAYOUTS = ("NN",)  # the fused kernel (kernels.gemm_bias_gelu) takes A (M, K) and B (K, N)

# --dry-run: every shape class scaled down (about /25), each layout and dtype at least once: every
# code path of the harness, few enough kernels for the test-suite.
DRY_CASES = (
    (Shape("square", 128, 128, 128), "NN", "fp16"),
    (Shape("square", 128, 128, 128), "NT", "bf16"),
    (Shape("skinny", 128, 128, 32), "NN", "fp16->fp32"),
    (Shape("skinny", 1, 128, 128), "NT", "fp16"),
    (Shape("ragged", 160, 160, 160), "NN", "fp16"),  # like 4000^3: partial tiles in M and N, K a multiple of 16
    (Shape("ragged", 127, 129, 128), "NT", "bf16"),  # like 4095x4097x4096: odd M and N
    (Shape("square", 128, 128, 64), "TN", "fp16"),
    (Shape("square", 64, 128, 64), "NN", "fp32"),
    (Shape("fused", 100, 200, 64), "NN", "fp16"),  # bias + GELU epilogue, partial tiles
)


def case_of(shape: Shape, layout: str, dtype: str) -> dict[str, Any]:
    return {
        "label": f"{shape.group} {shape.m}x{shape.n}x{shape.k} {layout} {dtype}",
        "group": shape.group, "M": shape.m, "N": shape.n, "K": shape.k, "layout": layout, "dtype": dtype,
    }


def selected_cases(args: argparse.Namespace) -> list[tuple[Shape, str, str]]:
    if args.dry_run:
        cases = list(DRY_CASES)
    else:
        cases = [(s, lay, dt) for s in FULL_SHAPES for lay in LAYOUTS for dt in DTYPES
                 if s.group != "fused" or (lay in FUSED_LAYOUTS and dt in ("fp16", "bf16"))]
    return [(s, lay, dt) for s, lay, dt in cases
            if s.group in args.groups and lay in args.layouts and dt in args.dtypes]


# ---------------------------------------------------------------- problems and backends


class Problem:
    """Inputs of one GEMM on `device`, and its fp32 reference (computed there in float32)."""

    def __init__(self, shape: Shape, layout: str, dtype: str, device: str) -> None:
        import torch

        self.shape, self.layout = shape, layout
        self.in_dtype, self.out_dtype = DTYPES[dtype]
        gen = torch.Generator().manual_seed(shape.m * 31 + shape.n * 7 + shape.k)
        tdt = getattr(torch, self.in_dtype)
        a_shape = (shape.k, shape.m) if layout == "TN" else (shape.m, shape.k)
        self.a = torch.randn(*a_shape, generator=gen).to(tdt).to(device)
        b_shape = (shape.n, shape.k) if layout == "NT" else (shape.k, shape.n)
        self.b = torch.randn(*b_shape, generator=gen).to(tdt).to(device)
        self.a_mk = self.a.t() if layout == "TN" else self.a  # M x K and K x N views for libraries without a layout flag
        self.b_kn = self.b.t() if layout == "NT" else self.b
        self.reference = torch.mm(self.a_mk.float(), self.b_kn.float())
        self.fused = shape.group == "fused"
        if self.fused:  # C = gelu_tanh(A @ B + bias), bias float32
            self.bias = torch.randn(shape.n, generator=gen).to(device)
            self.reference = torch.nn.functional.gelu(self.reference + self.bias, approximate="tanh")
        self.flops = 2.0 * shape.m * shape.n * shape.k


def plugin_kernel(p: Problem, args: argparse.Namespace, *, dry_run: bool) -> Any:
    import tilelang

    from tilelang_metal import kernels as examples

    if p.fused:
        func = examples.gemm_bias_gelu(p.shape.m, p.shape.n, p.shape.k, args.block_m, args.block_n, dtype=p.in_dtype,
                                       out_dtype=p.out_dtype, threads=args.threads)
    else:
        func = examples.gemm_direct_global(
            p.shape.m, p.shape.n, p.shape.k, args.block_m, args.block_n, dtype=p.in_dtype, out_dtype=p.out_dtype,
            threads=args.threads, trans_A=p.layout == "TN", trans_B=p.layout == "NT", swizzle_panel=args.swizzle,
        )
    if dry_run:
        return tilelang.compile(func, out_idx=[-1], target=examples.metal4_target(), execution_backend="emulator")
    return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="torch")


def in_tree_kernel(p: Problem, args: argparse.Namespace) -> Any:
    """The same kernel built by TileLang's in-tree Metal backend (the plugin switched off meanwhile)."""
    import tilelang

    import tilelang_metal
    from tilelang_metal import kernels as examples

    func = examples.gemm_direct_global(
        p.shape.m, p.shape.n, p.shape.k, args.block_m, args.block_n, dtype=p.in_dtype, out_dtype=p.out_dtype,
        threads=args.threads, trans_A=p.layout == "TN", trans_B=p.layout == "NT",
    )
    tilelang_metal.deactivate()
    try:
        return tilelang.compile(func, out_idx=[-1], target="metal", execution_backend="torch")
    finally:
        tilelang_metal.activate()


def make_runner(backend: str, p: Problem, args: argparse.Namespace) -> Runner | str:
    """A Runner, or the reason the backend cannot run here (-> n/a)."""
    import torch

    on_mac = not args.dry_run
    if backend == "plugin":
        kernel = plugin_kernel(p, args, dry_run=args.dry_run)
        operands = (p.a, p.b, p.bias) if p.fused else (p.a, p.b)
        return Runner(backend, lambda: kernel(*operands), harness.torch_mps_sync if on_mac else lambda: None)
    if backend == "torch-mps":
        if not on_mac:
            return "dry run: no MPS device"
        if p.fused:  # what a torch user writes: addmm, then GELU (two kernels, C written and read again)
            bias = p.bias.to(p.a.dtype)
            return Runner(backend, lambda: torch.nn.functional.gelu(torch.addmm(bias, p.a_mk, p.b_kn), approximate="tanh"),
                          harness.torch_mps_sync)
        return Runner(backend, lambda: torch.mm(p.a_mk, p.b_kn), harness.torch_mps_sync)
    if backend == "mlx":
        mx = harness.mlx_core() if on_mac else None
        if mx is None:
            return "dry run: no Metal GPU" if not on_mac else "mlx not installed (pip install mlx)"
        mdt = {"float16": mx.float16, "bfloat16": mx.bfloat16, "float32": mx.float32}[p.in_dtype]
        a = mx.array(p.a.float().cpu().numpy()).astype(mdt)
        b = mx.array(p.b.float().cpu().numpy()).astype(mdt)
        a_mk = a.T if p.layout == "TN" else a
        b_kn = b.T if p.layout == "NT" else b
        if p.fused:  # addmm, then MLX's tanh-approximated GELU written out (mlx.core has no gelu)
            bias = mx.array(p.bias.cpu().numpy()).astype(mdt)

            def compute() -> Any:
                x = mx.addmm(bias, a_mk, b_kn)
                return 0.5 * x * (1.0 + mx.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
        else:
            def compute() -> Any:
                return mx.matmul(a_mk, b_kn)
        runner = harness.mlx_runner(backend, mx, compute)
        inner = runner.launch

        def launch_as_torch() -> Any:  # the verification reads torch tensors
            return _MlxResult(inner(), mx)

        return Runner(backend, launch_as_torch, runner.sync)
    if backend == "in-tree":
        if p.fused:
            return "not launched: the in-tree backend has no fused-epilogue kernel here (its fragment accumulator + T.Parallel epilogue fails to lower)"
        if p.shape.m % args.block_m or p.shape.n % args.block_n or p.shape.k % 16:
            # its direct-global kernel has no edge guards: a launch would write past C (other buffers, or a fault)
            return f"not launched: the in-tree kernel has no edge guards and {p.shape.m}x{p.shape.n}x{p.shape.k} is not a multiple of its {args.block_m}x{args.block_n}x16 tiles"
        if not on_mac:
            return "dry run: TileLang's in-tree backend runs on a Metal GPU only"
        kernel = in_tree_kernel(p, args)
        return Runner(backend, lambda: kernel(p.a, p.b), harness.torch_mps_sync)
    raise ValueError(f"unknown backend {backend!r}")


class _MlxResult:
    """An MLX array that converts to a CPU torch tensor on `.float()` (for harness.relative_error)."""

    def __init__(self, array: Any, mx: Any) -> None:
        self.array, self.mx = array, mx

    def float(self) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(np.array(self.array.astype(self.mx.float32)))

    @property
    def dtype(self) -> Any:
        import torch

        return {self.mx.bfloat16: torch.bfloat16, self.mx.float32: torch.float32}.get(self.array.dtype, torch.float16)


def run_case(shape: Shape, layout: str, dtype: str, args: argparse.Namespace, peak: float | None) -> list[Row]:
    import torch

    p = Problem(shape, layout, dtype, "cpu" if args.dry_run else "mps")

    def check(backend: str, out: Any) -> tuple[float, float, str]:
        note = "writes C in fp16 (no fp32-output mode here)" if dtype == "fp16->fp32" and backend != "plugin" else ""
        return harness.relative_error(out, p.reference), TOLERANCE[str(out.dtype).removeprefix("torch.")], note

    rows = harness.measure_case(case_of(shape, layout, dtype), args.backends, p.flops, peak, lambda b: make_runner(b, p, args), check,
                                dry_run=args.dry_run, trials=args.trials, target_ms=args.target_ms, max_launches=args.max_launches)
    if not args.dry_run:
        torch.mps.empty_cache()
    return rows


# ---------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    harness.add_run_options(ap, "gemm", dry_run_help="small shapes, plugin in the CPU emulator, GPU baselines n/a (for CI)", max_launches=200)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--groups", nargs="+", default=list(GROUPS), choices=GROUPS)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=LAYOUTS)
    ap.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    ap.add_argument("--chip", default=None, help="chip for the %% of peak column, e.g. 'M4 Pro' (default: this Mac's; 'M5' in a dry run)")
    ap.add_argument("--block-m", type=int, default=64, help="plugin kernel: rows of C per threadgroup (default: %(default)s)")
    ap.add_argument("--block-n", type=int, default=128, help="plugin kernel: columns of C per threadgroup (default: %(default)s)")
    ap.add_argument("--threads", type=int, default=128, help="plugin kernel: threads per threadgroup (default: %(default)s)")
    ap.add_argument("--swizzle", type=int, default=0, help="plugin kernel: T.use_swizzle panel, 0 = off (default: %(default)s)")
    return ap


def resolve_chip(args: argparse.Namespace) -> Any:
    from tilelang_metal.performance import roofline

    if args.chip:
        return roofline.chip(args.chip)
    if args.dry_run:
        return roofline.chip("M5")
    return roofline.detect_chip()


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    harness.check_run_options(ap, args)
    print(f"Metal 4 (MSL 4.0) kernels: {harness.metal4_status(dry_run=args.dry_run)}", flush=True)
    import tilelang_metal  # noqa: F401  (the plugin takes over target="metal")

    chip = resolve_chip(args)
    peak = chip.matrix_tflops if chip else None
    cases = selected_cases(args)
    if not cases:
        ap.error("no problem matches --groups/--layouts/--dtypes")
    rows: list[Row] = []
    for i, (shape, layout, dtype) in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case_of(shape, layout, dtype)['label']}", flush=True)
        rows += run_case(shape, layout, dtype, args, peak)
        harness.write_progress(rows, args.out, "gemm")
    env = harness.environment(chip, dry_run=args.dry_run)
    files = harness.write_all(
        rows, env, args.out, "gemm", title="GEMM: tilelang_metal vs torch MPS, MLX, in-tree TileLang", backends=args.backends,
        case_columns=["group", "M", "N", "K", "layout", "dtype"], ratio_of="plugin",
        ratio_to=[b for b in args.backends if b != "plugin"], peak_tflops=peak,
    )
    print(files["md"].read_text())
    print("wrote " + ", ".join(str(f) for f in files.values()))
    plugin_rows = [r for r in rows if r.backend == "plugin"]
    bad = [r for r in plugin_rows if not r.verified]
    for r in bad:
        print(f"plugin result not verified: {r.label}: {r.status} {r.note}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
