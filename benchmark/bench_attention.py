"""Flash-attention forward on the Mac's GPU: the plugin's kernel (tilelang_metal.kernels.flash_attention_forward)
vs torch.nn.functional.scaled_dot_product_attention on MPS and mlx.core.fast.scaled_dot_product_attention
(if installed), timed interleaved (ABBA) in one run; prints the TFLOP/s ratios and writes attention.csv,
.md and .png into --out (see docs/benchmarks.md).

    python benchmark/bench_attention.py --out results/              # on a Mac
    python benchmark/bench_attention.py --dry-run --out /tmp/ba     # anywhere: one small shape in the emulator

Exit status: 0 when every plugin result matched the fp32 reference, 1 otherwise, 2 for a usage error.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

os.environ.setdefault("TILELANG_DISABLE_CACHE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import OK, Row, Runner  # noqa: E402

BACKENDS = ("plugin", "torch-mps", "mlx")
DTYPES = ("float16", "bfloat16")
TOLERANCE = {"float16": 1e-2, "bfloat16": 2e-2}  # max |O - ref| / max |ref|


@dataclass(frozen=True)
class Shape:
    batch: int
    heads: int
    seq_len: int
    head_dim: int
    causal: bool


FULL_SHAPES = tuple(
    Shape(b, h, s, d, causal)
    for (b, h, s, d) in ((4, 32, 1024, 128), (1, 32, 4096, 128), (4, 32, 2048, 64), (8, 16, 512, 64))
    for causal in (False, True)
)
DRY_SHAPES = (Shape(1, 2, 128, 64, False), Shape(1, 2, 128, 64, True), Shape(1, 1, 64, 128, False))


def case_of(shape: Shape, dtype: str) -> dict[str, Any]:
    return {
        "label": f"b{shape.batch} h{shape.heads} s{shape.seq_len} d{shape.head_dim}{' causal' if shape.causal else ''} {dtype}",
        "batch": shape.batch, "heads": shape.heads, "seq_len": shape.seq_len, "head_dim": shape.head_dim,
        "causal": shape.causal, "dtype": dtype,
    }


def attention_flops(s: Shape) -> float:
    """Q.K^T and P.V: 4 * b * h * s^2 * d multiply-adds counted as 2 FLOPs; half of it when causal."""
    full = 4.0 * s.batch * s.heads * s.seq_len * s.seq_len * s.head_dim
    return full / 2 if s.causal else full


class Problem:
    """q, k, v in (batch, seq, heads, dim) on `device`, the same in (batch, heads, seq, dim) for
    the libraries that take that layout, and the fp32 reference output (batch, seq, heads, dim)."""

    def __init__(self, shape: Shape, dtype: str, device: str) -> None:
        import torch

        self.shape, self.dtype = shape, dtype
        gen = torch.Generator().manual_seed(shape.seq_len * 13 + shape.head_dim)
        dims = (shape.batch, shape.seq_len, shape.heads, shape.head_dim)
        self.q, self.k, self.v = (torch.randn(*dims, generator=gen).to(getattr(torch, dtype)).to(device) for _ in range(3))
        self.q_bhsd, self.k_bhsd, self.v_bhsd = (x.transpose(1, 2).contiguous() for x in (self.q, self.k, self.v))
        self.reference = torch.cat([  # a few heads at a time: fp32 score matrices of long sequences are large
            torch.nn.functional.scaled_dot_product_attention(
                self.q_bhsd[:, h:h + 4].float(), self.k_bhsd[:, h:h + 4].float(), self.v_bhsd[:, h:h + 4].float(), is_causal=shape.causal)
            for h in range(0, shape.heads, 4)
        ], dim=1).transpose(1, 2).contiguous()
        self.flops = attention_flops(shape)


def plugin_builder() -> Any:
    """The plugin's flash-attention forward builder, or None while the plugin has none."""
    from tilelang_metal import kernels as examples

    return getattr(examples, "flash_attention_forward", None)




def run_target(args: argparse.Namespace) -> Any:
    """The target the plugin's kernel is built for: --target in a dry run, this Mac's Metal otherwise."""
    if not args.dry_run:
        return "metal"
    from tilelang_metal import kernels as examples

    return examples.metal4_target() if args.target == "metal4" else examples.plain_metal_target()


def blocks_for(shape: Shape, dtype: str, args: argparse.Namespace) -> tuple[int, int]:
    """--block-m / --block-n where given; otherwise the kernel's own defaults at this head_dim on the
    run's dataflow (kernels/attention.py, `attention_blocks`: the largest blocks whose register
    estimate fits the budget and, on plain metal, whose K and V tiles fit threadgroup memory)."""
    from tilelang_metal.kernels.attention_config import attention_blocks, attention_dataflow

    blocks = attention_blocks(shape.head_dim, dataflow=attention_dataflow(run_target(args)), dtype=dtype, row_bounds=shape.causal,
                              block_m=args.block_m, block_n=args.block_n, threads=args.threads)
    return blocks.block_m, blocks.block_n


def make_runner(backend: str, p: Problem, args: argparse.Namespace) -> Runner | str:
    import torch

    on_mac = not args.dry_run
    s = p.shape
    if backend == "plugin":
        build = plugin_builder()
        if build is None:
            return "tilelang_metal.kernels.flash_attention_forward is not available in this version"
        block_m, block_n = blocks_for(s, p.dtype, args)
        if args.dry_run:
            kernel = build(s.batch, s.heads, s.seq_len, s.head_dim, causal=s.causal, dtype=p.dtype, block_m=block_m,
                           block_n=block_n, threads=args.threads, target=run_target(args), execution_backend="emulator")
            return Runner(backend, lambda: kernel(p.q, p.k, p.v))
        kernel = build(s.batch, s.heads, s.seq_len, s.head_dim, causal=s.causal, dtype=p.dtype, block_m=block_m,
                       block_n=block_n, threads=args.threads, target="metal", execution_backend="torch")
        return Runner(backend, lambda: kernel(p.q, p.k, p.v), harness.torch_mps_sync)
    if backend == "torch-mps":
        if not on_mac:
            return "dry run: no MPS device"
        sdpa = torch.nn.functional.scaled_dot_product_attention
        return Runner(backend, lambda: sdpa(p.q_bhsd, p.k_bhsd, p.v_bhsd, is_causal=s.causal).transpose(1, 2), harness.torch_mps_sync)
    if backend == "mlx":
        mx = harness.mlx_core() if on_mac else None
        if mx is None:
            return "dry run: no Metal GPU" if not on_mac else "mlx not installed (pip install mlx)"
        mdt = {"float16": mx.float16, "bfloat16": mx.bfloat16}[p.dtype]
        q, k, v = (mx.array(x.float().cpu().numpy()).astype(mdt) for x in (p.q_bhsd, p.k_bhsd, p.v_bhsd))
        scale = 1.0 / math.sqrt(s.head_dim)
        mask = "causal" if s.causal else None
        runner = harness.mlx_runner(backend, mx, lambda: mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask))
        inner = runner.launch

        def launch_as_torch() -> Any:  # (b, h, s, d) MLX array -> (b, s, h, d) torch tensor on `.float()`
            return _MlxAttention(inner(), mx)

        return Runner(backend, launch_as_torch, runner.sync)
    raise ValueError(f"unknown backend {backend!r}")


class _MlxAttention:
    def __init__(self, array: Any, mx: Any) -> None:
        self.array, self.mx = array, mx

    def float(self) -> Any:
        import numpy as np
        import torch

        return torch.from_numpy(np.array(self.array.astype(self.mx.float32))).transpose(1, 2).contiguous()


def run_case(shape: Shape, dtype: str, args: argparse.Namespace, peak: float | None) -> list[Row]:
    p = Problem(shape, dtype, "cpu" if args.dry_run else "mps")

    def check(backend: str, out: Any) -> tuple[float, float, str]:
        return harness.relative_error(out, p.reference), TOLERANCE[dtype], ""

    return harness.measure_case(case_of(shape, dtype), args.backends, p.flops, peak, lambda b: make_runner(b, p, args), check,
                                dry_run=args.dry_run, trials=args.trials, target_ms=args.target_ms, max_launches=args.max_launches)


def ratio_lines(rows: list[Row]) -> list[str]:
    """One line per problem: the plugin's TFLOP/s over each baseline's, from this run's medians."""
    lines = []
    by_case: dict[str, dict[str, Row]] = {}
    for r in rows:
        by_case.setdefault(r.label, {})[r.backend] = r
    for label, per in by_case.items():
        mine = per.get("plugin")
        parts = []
        for name, other in per.items():
            if name == "plugin":
                continue
            ok = mine and mine.status == OK and other.status == OK and mine.tflops and other.tflops
            parts.append(f"plugin / {name} = {mine.tflops / other.tflops:.2f}x" if ok else f"plugin / {name} = n/a")
        plugin_text = f"{mine.tflops:.3g} TFLOP/s" if mine and mine.status == OK and mine.tflops else (mine.status if mine else "n/a")
        lines.append(f"{label}: plugin {plugin_text}; " + "; ".join(parts))
    return lines


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    harness.add_run_options(ap, "attention", dry_run_help="one small shape, plugin in the CPU emulator, GPU baselines n/a", max_launches=100)
    ap.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    ap.add_argument("--dtypes", nargs="+", default=["float16"], choices=DTYPES)
    ap.add_argument("--target", default="metal4", choices=["metal4", "metal"], help="--dry-run only: the emulated target (default: %(default)s)")
    ap.add_argument("--chip", default=None, help="chip for the %% of peak column (default: this Mac's; 'M5' in a dry run)")
    ap.add_argument("--block-m", type=int, default=None, help="plugin kernel: query rows per threadgroup (default: the kernel's, by the register estimate)")
    ap.add_argument("--block-n", type=int, default=None, help="plugin kernel: key rows per K/V step (default: the kernel's, by the register estimate)")
    ap.add_argument("--threads", type=int, default=128, help="plugin kernel: threads per threadgroup (default: %(default)s)")
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    harness.check_run_options(ap, args)
    print(f"Metal 4 (MSL 4.0) kernels: {harness.metal4_status(dry_run=args.dry_run)}", flush=True)
    import tilelang_metal  # noqa: F401
    from tilelang_metal.performance import roofline

    chip = roofline.chip(args.chip) if args.chip else roofline.chip("M5") if args.dry_run else roofline.detect_chip()
    peak = chip.matrix_tflops if chip else None
    if args.dry_run:
        print(harness.DRY_RUN_NOTE + " (this run only proves the harness works)")
    cases = [(s, dt) for s in (DRY_SHAPES if args.dry_run else FULL_SHAPES) for dt in args.dtypes]
    rows: list[Row] = []
    for i, (shape, dtype) in enumerate(cases, 1):
        print(f"[{i}/{len(cases)}] {case_of(shape, dtype)['label']}", flush=True)
        rows += run_case(shape, dtype, args, peak)
        harness.write_progress(rows, args.out, "attention")
    env = harness.environment(chip, dry_run=args.dry_run)
    files = harness.write_all(
        rows, env, args.out, "attention", title="Flash-attention forward: tilelang_metal vs torch SDPA (MPS), MLX SDPA",
        backends=args.backends, case_columns=["batch", "heads", "seq_len", "head_dim", "causal", "dtype"], ratio_of="plugin",
        ratio_to=[b for b in args.backends if b != "plugin"], peak_tflops=peak,
    )
    print(files["md"].read_text())
    print("TFLOP/s ratios (this run):")
    for line in ratio_lines(rows):
        print("  " + line)
    if args.dry_run:
        print(harness.DRY_RUN_NOTE)
    print("wrote " + ", ".join(str(f) for f in files.values()))
    bad = [r for r in rows if r.backend == "plugin" and not r.verified]
    for r in bad:
        print(f"plugin result not verified: {r.label}: {r.status} {r.note}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
