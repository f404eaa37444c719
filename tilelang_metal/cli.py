"""`python -m tilelang_metal {lower,run,demo}`: inspect and execute the plugin's Metal GEMMs.

lower  print the MSL of a GEMM (default: the spec's fast path, 4096^3 fp16 direct-global on metal4)
run    lower, execute (torch MPS on a Mac, else the emulator) and compare with torch
demo   the main job: print the default kernel's MSL, then run it at a size that takes seconds
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tilelang_metal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("lower", "run", "demo"):
        p = sub.add_parser(name)
        big = name == "lower"
        p.add_argument("--m", type=int, default=4096 if big else 256)
        p.add_argument("--n", type=int, default=4096 if big else 256)
        p.add_argument("--k", type=int, default=4096 if big else 256)
        p.add_argument("--block-m", type=int, default=64)
        p.add_argument("--block-n", type=int, default=128)
        p.add_argument("--block-k", type=int, default=32, help="K step of the shared path's pipelined loop")
        p.add_argument("--threads", type=int, default=128)
        p.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
        p.add_argument("--out-dtype", default="float16", choices=["float16", "bfloat16", "float32"])
        p.add_argument("--path", default="direct_global", choices=["direct_global", "shared"], help="kernel idiom")
        p.add_argument("--target", default="metal4", choices=["metal4", "metal", "auto"], help="metal4: explicit Metal 4 keys; metal: no metal4; auto: target='metal' as this host normalizes it")
        p.add_argument("--swizzle", type=int, default=0, metavar="PANEL", help="T.use_swizzle(PANEL, order='mlx'); 0 = off")
        p.add_argument("--trans-a", action="store_true")
        p.add_argument("--trans-b", action="store_true")
        p.add_argument("--epilogue", default="none", choices=["none", "relu", "bias", "scale", "gelu_tanh", "silu"], help="shared path only")
        p.add_argument("--explain", action="store_true", help="print the path-selection decision and its reason")
        if name != "lower":
            p.add_argument("--backend", default="auto", choices=["auto", "emulator", "torch"])
    return parser


def _target(choice: str) -> Any:
    from .examples import metal4_target, plain_metal_target

    if choice == "metal4":
        return metal4_target()
    if choice == "metal":
        return plain_metal_target()
    return "metal"


def _build(args: argparse.Namespace) -> Any:
    from . import examples

    if args.path == "direct_global":
        return examples.gemm_direct_global(
            args.m, args.n, args.k, args.block_m, args.block_n, dtype=args.dtype, out_dtype=args.out_dtype,
            threads=args.threads, trans_A=args.trans_a, trans_B=args.trans_b, swizzle_panel=args.swizzle,
        )
    return examples.gemm_shared(
        args.m, args.n, args.k, args.block_m, args.block_n, args.block_k, dtype=args.dtype, out_dtype=args.out_dtype,
        threads=args.threads, trans_A=args.trans_a, trans_B=args.trans_b, epilogue=args.epilogue,
    )


def _with_decisions(fn: Any) -> tuple[Any, list[str]]:
    """Run `fn` and return its result with the plan of every T.gemm it lowered (each plan once:
    layout inference and lowering both plan the same GEMM)."""
    from .gemm import recorded_plans

    with recorded_plans() as plans:
        result = fn()
    return result, list(dict.fromkeys(plan.describe() for plan in plans))


def lower_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    import tilelang
    from tilelang import tvm

    from ._host import resolve_target

    func = _build(args)
    target = resolve_target(_target(args.target))

    def lower() -> str:
        with tvm.transform.PassContext(), target:  # T.copy / T.Parallel lowering needs the target in scope
            return tilelang.lower(func, target=target).kernel_source

    return _with_decisions(lower)


def _inputs(args: argparse.Namespace) -> tuple[list[Any], Any]:
    import torch

    torch.manual_seed(0)
    dt = getattr(torch, args.dtype)
    a = torch.randn((args.k, args.m) if args.trans_a else (args.m, args.k)).to(dt)
    b = torch.randn((args.n, args.k) if args.trans_b else (args.k, args.n)).to(dt)
    ref = (a.float().T if args.trans_a else a.float()) @ (b.float().T if args.trans_b else b.float())
    if args.path == "shared":
        bias = torch.randn(args.n)
        ref = _epilogue_reference(ref, bias, args.epilogue)
        return [a, b, bias], ref
    return [a, b], ref


def _epilogue_reference(x: Any, bias: Any, epilogue: str) -> Any:
    import torch

    if epilogue == "relu":
        return torch.relu(x)
    if epilogue == "bias":
        return x + bias
    if epilogue == "scale":
        return x * 0.5 + 1.0
    if epilogue == "gelu_tanh":
        return torch.nn.functional.gelu(x, approximate="tanh")
    if epilogue == "silu":
        return torch.nn.functional.silu(x)
    return x


def run_and_check(args: argparse.Namespace) -> float:
    import tilelang

    func = _build(args)
    inputs, ref = _inputs(args)
    backend = args.backend
    t0 = time.perf_counter()
    kernel = tilelang.compile(func, out_idx=[-1], target=_target(args.target), execution_backend=backend)
    t1 = time.perf_counter()
    if kernel.execution_backend == "torch":
        inputs = [x.to("mps") for x in inputs]
    out = kernel(*inputs)
    t2 = time.perf_counter()
    err = (out.float().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    print(
        f"[{kernel.execution_backend}] {args.m}x{args.n}x{args.k} {args.dtype}->{args.out_dtype}: "
        f"compile {t1 - t0:.2f}s, run {t2 - t1:.2f}s, max |C - torch| = {err:.4g} (max |C| = {scale:.4g})"
    )
    return err / scale


def main(argv: list[str] | None = None) -> int:
    import tilelang_metal  # noqa: F401  (activates the plugin)

    args = _parser().parse_args(argv)
    if args.command == "lower":
        source, decisions = lower_source(args)
        if args.explain:
            for line in decisions:
                print("// " + line)
        print(source)
        return 0
    if args.command == "demo":
        lower_args = _parser().parse_args(["lower"])
        source, decisions = lower_source(lower_args)
        print(source)
        for line in decisions:
            print("// selection: " + line)
        print(f"// running the same kernel at {args.m}x{args.n}x{args.k} ...")
    if args.explain and args.command == "run":
        _, decisions = lower_source(args)
        for line in decisions:
            print("// " + line)
    rel = run_and_check(args)
    tolerance = 2e-2 if args.out_dtype != "float32" or args.dtype != "float32" else 1e-4
    ok = rel <= tolerance
    print(f"relative error {rel:.3g} -> {'OK' if ok else 'MISMATCH'} (tolerance {tolerance})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
