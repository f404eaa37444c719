"""`python -m tilelang_metal {lower,run,demo,profile,cache}`: inspect and execute the plugin's Metal GEMMs.

lower    print the MSL of a GEMM (default: 4096^3 fp16, the kernel kernels.matmul picks for the shape and
         chip: GEMV, split-K or a direct-global GEMM tile; --explain says which and why); with --bits, of
         kernels.quantized_matmul (x @ dequantize(w).T in MLX's affine format; --explain: vector or tiled)
run      lower, execute (torch MPS on a Mac, else the emulator) and compare with torch
demo     the main job: print the default kernel's MSL, then run it at a size that takes seconds
profile  run a GEMM once in the emulator and print what it did (memory traffic, barriers, matrix
         operations; in total and per kind of threadgroup) with a roofline estimate for an Apple GPU
cache    the emulator's build cache: `cache info` (path, entries, size, limit), `cache clear`

Exit status: 0 success, 1 the result does not match torch, 2 a usage or kernel error (one line on
stderr; add --debug for the traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Iterator
from typing import Any, NoReturn

DTYPES = ("float16", "bfloat16", "float32")
EPILOGUES = ("none", "relu", "bias", "scale", "gelu_tanh", "silu")
AUTO_EPILOGUES = ("none", "relu", "bias", "scale", "alpha_beta", "gelu_tanh", "silu", "residual")  # kernels.matmul's
AUTO_ONLY = ("--batch", "--shared-b", "--alpha", "--beta")
QUANTIZED_BITS = (2, 3, 4, 5, 6, 8)
QUANTIZED_GROUPS = (32, 64, 128)
EXIT_MISMATCH, EXIT_USAGE = 1, 2


class UsageError(ValueError):
    """A flag combination the CLI refuses before building anything."""


class _OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag prints one line (no usage block) and exits with status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be a positive integer")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be 0 (off) or a positive integer")
    return value


def _add_kernel_flags(p: argparse.ArgumentParser, big: bool) -> None:
    size = 4096 if big else 256
    p.add_argument("--m", type=_positive_int, default=size, help="rows of A and C (default: %(default)s)")
    p.add_argument("--n", type=_positive_int, default=size, help="columns of B and C (default: %(default)s)")
    p.add_argument("--k", type=_positive_int, default=size, help="reduction length (default: %(default)s)")
    p.add_argument("--block-m", type=_positive_int, default=None, help="rows of C per threadgroup; --path direct_global or shared (default: 64)")
    p.add_argument("--block-n", type=_positive_int, default=None, help="columns of C per threadgroup; --path direct_global or shared (default: 128 on direct_global, 64 on shared)")
    p.add_argument("--block-k", type=_positive_int, default=None, help="K step of the shared path's pipelined loop; --path shared only (default: 32)")
    p.add_argument("--threads", type=_positive_int, default=None, help="threads per threadgroup, a multiple of 32 for T.gemm; --path direct_global or shared (default: 128)")
    p.add_argument("--dtype", default="float16", choices=DTYPES, help="dtype of A and B (default: %(default)s)")
    p.add_argument("--out-dtype", default=None, choices=DTYPES, help="dtype of C (default: the --dtype value)")
    p.add_argument("--path", default="auto", choices=["auto", "direct_global", "shared"],
                   help="auto: kernels.matmul picks GEMV, split-K or a GEMM tile by shape, dtype and chip (--explain gives the reasons); "
                        "direct_global: T.gemm on global tiles; shared: shared staging with a fragment accumulator (on metal4 its staging-only "
                        "buffers are bypassed unless TILELANG_METAL_STAGING_BYPASS=0; --explain says) (default: %(default)s)")
    p.add_argument("--target", default=None, choices=["metal4", "metal", "auto"],
                   help="metal4: explicit Metal 4 keys; metal: no metal4; auto: target='metal' as this host normalizes it "
                        "(default: metal4; for profile --chip, the target that chip gets: metal4 on M5 and newer, else metal)")
    p.add_argument("--swizzle", type=_non_negative_int, default=None, metavar="PANEL",
                   help="T.use_swizzle(PANEL, order='mlx'), a power of two, 0 = off; --path direct_global or shared (default: 0)")
    p.add_argument("--trans-a", action="store_true", help="A is stored K x M (default: off)")
    p.add_argument("--trans-b", action="store_true", help="B is stored N x K (default: off)")
    p.add_argument("--epilogue", default=None, choices=AUTO_EPILOGUES,
                   help="epilogue on the accumulator: with --path auto kernels.matmul's (alpha_beta: alpha * A @ B + beta * C, residual: "
                        "A @ B + C, scale: alpha * A @ B), with --path shared the shared kernel's (not alpha_beta or residual) (default: none)")
    p.add_argument("--batch", type=_positive_int, default=None, help="A (batch, M, K), B (batch, K, N): kernels.matmul's batch; --path auto only (default: none)")
    p.add_argument("--shared-b", action="store_true", help="with --batch: one B (K, N) for every batch; --path auto only (default: off)")
    p.add_argument("--alpha", type=float, default=None, help="the factor of A @ B for --epilogue scale (required there) / alpha_beta; --path auto only (default: 1)")
    p.add_argument("--beta", type=float, default=None, help="the factor of C for --epilogue alpha_beta; --path auto only (default: 1)")
    p.add_argument("--bits", type=int, default=None, choices=QUANTIZED_BITS,
                   help="B is the transpose of an MLX-quantized weight w (N, K) with this many bits: kernels.quantized_matmul "
                        "(lower and run only; default: off, an fp GEMM)")
    p.add_argument("--group-size", type=int, default=None, choices=QUANTIZED_GROUPS,
                   help="with --bits: the quantization group along K (default: 64)")
    p.add_argument("--explain", action="store_true", help="print the path-selection decision and its reason (default: off)")
    p.add_argument("--debug", action="store_true", help="on an error, print the full traceback instead of one line (default: off)")
    p.add_argument("--verbose", action="store_true", help="keep TileLang's INFO log lines (compile start / end) in the output (default: off)")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="python -m tilelang_metal", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    helps = {"lower": "print the MSL of a GEMM", "run": "run a GEMM and compare with torch", "demo": "print the default MSL, then run the GEMM",
             "profile": "count what a GEMM does in the emulator, with a roofline estimate"}
    for name in ("lower", "run", "demo", "profile"):
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        _add_kernel_flags(p, big=name == "lower")
        if name in ("run", "demo"):
            p.add_argument("--backend", default="auto", choices=["auto", "emulator", "torch"],
                           help="execution backend: torch (MPS, Mac only), emulator (CPU), auto: torch where MPS is, else emulator (default: %(default)s)")
        from .performance.roofline import CHIPS

        use = "the roofline estimate and --path auto's choice" if name == "profile" else "--path auto's choice of kernel"
        p.add_argument("--chip", default=None, choices=list(CHIPS), metavar="CHIP",
                       help=f"Apple GPU for {use}, one of: {', '.join(CHIPS)} (default: this Mac's, else M5)")
    p = sub.add_parser("cache", help="the emulator's build cache: info or clear", description="the emulator's build cache")
    p.add_argument("action", choices=["info", "clear"], help="info: path, entry count, size and limit; clear: remove every entry (required, no default)")
    p.add_argument("--debug", action="store_true", help="on an error, print the full traceback instead of one line (default: off)")
    return parser


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB"


def cache_command(action: str) -> int:
    """`cache info` / `cache clear` (imports neither tilelang nor torch)."""
    from .emulator import cache
    from .emulator.toolchain import cache_dir

    root = cache_dir()
    if action == "clear":
        removed = cache.clear(root)
        print(f"removed {removed} entries from {root}")
        return 0
    found = cache.info(root)
    print(f"path:    {found.path}")
    print(f"entries: {found.entries}")
    print(f"size:    {_mib(found.size)}")
    print(f"limit:   {_mib(found.limit)} (TILELANG_METAL_EMULATOR_CACHE_MB; least recently used entries are evicted)")
    return 0


def validate(args: argparse.Namespace) -> argparse.Namespace:
    """Refuse flags that do not apply to the chosen path (they would be silently ignored) and fill
    the path-dependent defaults."""
    if args.command == "cache":
        return args
    if getattr(args, "backend", None) == "torch" and not _mps_available():
        raise UsageError("--backend torch runs the kernel on a Mac's GPU through torch's MPS backend, which this machine does "
                         "not have; use --backend emulator (or auto) to run it on the CPU")
    if args.out_dtype is None:
        args.out_dtype = args.dtype
    if args.bits is not None or args.group_size is not None:
        return _choose_quantized(args)
    if args.path == "auto":
        return _choose(args)
    if args.target is None:
        args.target = _chip_target(args.chip) if args.command == "profile" and args.chip else "metal4"
    shared = args.path == "shared"
    auto_only = [flag for flag, value in zip(AUTO_ONLY, (args.batch, args.shared_b or None, args.alpha, args.beta)) if value is not None]
    if auto_only:
        raise UsageError(f"{auto_only[0]} applies to --path auto only (kernels.matmul's batched / epilogue kernel); drop --path {args.path}")
    if args.epilogue is not None and args.epilogue not in EPILOGUES:
        raise UsageError(f"--epilogue {args.epilogue} is kernels.matmul's (--path auto) only; drop --path {args.path}")
    if not shared:
        if args.epilogue is not None:
            raise UsageError(f"--epilogue {args.epilogue} applies to --path shared only (the direct-global kernel has no accumulator fragment); add --path shared")
        if args.block_k is not None:
            raise UsageError("--block-k applies to --path shared only (direct-global owns its K loop); add --path shared or drop --block-k")
    if args.epilogue is None:
        args.epilogue = "none"
    if args.block_m is None:
        args.block_m = 64
    if args.threads is None:
        args.threads = 128
    if args.swizzle is None:
        args.swizzle = 0
    if args.block_n is None:
        args.block_n = 64 if shared else 128
    if args.block_k is None:
        args.block_k = 32
    return args


def _choose(args: argparse.Namespace) -> argparse.Namespace:
    """--path auto: refuse the flags that pin one kernel (the choice would ignore them), then ask
    kernels.matmul; its target becomes --target."""
    pinned = [flag for flag, value in (("--block-m", args.block_m), ("--block-n", args.block_n), ("--block-k", args.block_k),
                                       ("--threads", args.threads), ("--swizzle", args.swizzle))
              if value is not None]
    if pinned:
        path = "shared" if "--block-k" in pinned else "direct_global"
        raise UsageError(f"{pinned[0]} pins one kernel, but --path auto picks the kernel by shape and chip; add --path {path} to use {pinned[0]}")
    from .host import resolve_target
    from .kernels.matmul import matmul_config

    target = resolve_target("metal") if args.target == "auto" else args.target
    args.choice = matmul_config(args.m, args.n, args.k, args.dtype, args.out_dtype, chip=args.chip, target=target,
                                trans_A=args.trans_a, trans_B=args.trans_b, batch=args.batch, shared_B=args.shared_b,
                                epilogue=args.epilogue or "none", alpha=args.alpha, beta=args.beta)
    args.target = args.choice.target
    return args


def _choose_quantized(args: argparse.Namespace) -> argparse.Namespace:
    """--bits: kernels.quantized_matmul's kernel for the shape (vector or tiled, quantized_matmul_route);
    the flags of the fp GEMMs do not apply and are refused."""
    if args.bits is None:
        raise UsageError("--group-size applies with --bits only (a quantized weight); add --bits 4 or drop --group-size")
    if args.command not in ("lower", "run"):
        raise UsageError(f"--bits applies to lower and run only; drop it for {args.command}")
    fp_only = [flag for flag, value in (("--path", None if args.path == "auto" else args.path), ("--block-m", args.block_m),
                                        ("--block-n", args.block_n), ("--block-k", args.block_k), ("--threads", args.threads),
                                        ("--swizzle", args.swizzle), ("--trans-a", args.trans_a or None), ("--trans-b", args.trans_b or None),
                                        ("--epilogue", args.epilogue), ("--batch", args.batch), ("--shared-b", args.shared_b or None),
                                        ("--alpha", args.alpha), ("--beta", args.beta))
               if value is not None]
    if fp_only:
        raise UsageError(f"{fp_only[0]} applies to the fp GEMMs, not to --bits (kernels.quantized_matmul picks its own kernel); drop {fp_only[0]}")
    if args.out_dtype != args.dtype:
        raise UsageError("--out-dtype must equal --dtype with --bits (kernels.quantized_matmul writes x's dtype); drop --out-dtype")
    from .kernels.quantized_matmul import quantized_matmul_route

    if args.group_size is None:
        args.group_size = 64
    if args.target is None:
        args.target = "metal4"
    args.path = "quantized"
    args.route, args.route_reason = quantized_matmul_route(args.m)
    return args


def _chip_target(name: str) -> str:
    """The target the plugin gives `target="metal"` on that chip: the metal4 key from M5 on (with
    macOS 26 and its SDK; the plugin's host policy), plain metal before."""
    from .performance.roofline import chip

    return "metal4" if chip(name).generation >= 5 else "metal"


def _mps_available() -> bool:
    import torch

    return bool(torch.backends.mps.is_available())


@contextlib.contextmanager
def _tilelang_log_level(level: str | None) -> Iterator[None]:
    """TileLang logs an INFO line at the start and end of every compile: noise in the CLI's output.
    Its import sets the level, so this sets it after importing, and restores it for in-process callers."""
    if level is None:
        yield
        return
    import tilelang

    before = tilelang.logger.level
    tilelang.set_log_level(level)
    try:
        yield
    finally:
        tilelang.set_log_level(before)


def _target(choice: str) -> Any:
    from .kernels import metal4_target, plain_metal_target

    if choice == "metal4":
        return metal4_target()
    if choice == "metal":
        return plain_metal_target()
    return "metal"


def _build(args: argparse.Namespace) -> Any:
    from . import kernels as examples

    if args.path == "auto":
        return examples.matmul_program(args.choice)
    if args.path == "quantized":
        return examples.quantized_matmul_program(args.m, args.n, args.k, bits=args.bits, group_size=args.group_size,
                                                 dtype=args.dtype, route=args.route)
    if args.path == "direct_global":
        return examples.gemm_direct_global(
            args.m, args.n, args.k, args.block_m, args.block_n, dtype=args.dtype, out_dtype=args.out_dtype,
            threads=args.threads, trans_A=args.trans_a, trans_B=args.trans_b, swizzle_panel=args.swizzle,
        )
    return examples.gemm_shared(
        args.m, args.n, args.k, args.block_m, args.block_n, args.block_k, dtype=args.dtype, out_dtype=args.out_dtype,
        threads=args.threads, trans_A=args.trans_a, trans_B=args.trans_b, epilogue=args.epilogue, swizzle_panel=args.swizzle,
    )


def lowered_decisions(artifact: Any) -> list[str]:
    """The decisions the lowering recorded on the IR (`ir_attrs.DECISIONS_ATTR`) of a lowered
    kernel (`tilelang.lower`'s result): shared-staging bypass, register staging / K-prefetch turned
    off for registers, the plan of every T.gemm, in the order they were taken."""
    from .core.ir_attrs import decisions_of

    funcs = [f for mod in (artifact.host_mod, artifact.device_mod) if mod is not None for f in mod.functions.values()]
    return decisions_of(funcs)


def lower_source(args: argparse.Namespace) -> tuple[str, list[str]]:
    import tilelang

    from .host import resolve_target
    from .host.passes import pass_context

    func = _build(args)
    target = resolve_target(_target(args.target))
    with pass_context(), target:  # T.copy / T.Parallel lowering needs the target in scope
        artifact = tilelang.lower(func, target=target)
    decisions = lowered_decisions(artifact)
    if args.path == "auto":
        decisions = args.choice.describe() + decisions
    if args.path == "quantized":
        decisions = [f"quantized_matmul {args.bits}-bit, group {args.group_size}: {args.route} kernel ({args.route_reason})"] + decisions
    return artifact.kernel_source, decisions


def _inputs(args: argparse.Namespace) -> tuple[list[Any], Any]:
    import torch

    torch.manual_seed(0)
    dt = getattr(torch, args.dtype)
    if args.path == "quantized":
        from .kernels import dequantize, quantize

        x, w = torch.randn(args.m, args.k).to(dt), torch.randn(args.n, args.k).to(dt)
        w_q, scales, biases = quantize(w, bits=args.bits, group_size=args.group_size)
        ref = x.double() @ dequantize(w_q, scales, biases, bits=args.bits, group_size=args.group_size).double().T
        return [x, w_q, scales, biases], ref.float()
    if args.path == "auto" and (args.choice.batch or args.choice.epilogue != "none"):
        return _matmul_inputs(args.choice, dt)
    a = torch.randn((args.k, args.m) if args.trans_a else (args.m, args.k)).to(dt)
    b = torch.randn((args.n, args.k) if args.trans_b else (args.k, args.n)).to(dt)
    ref = (a.float().T if args.trans_a else a.float()) @ (b.float().T if args.trans_b else b.float())
    if args.path == "shared":
        bias = torch.randn(args.n)
        ref = _epilogue_reference(ref, bias, args.epilogue)
        return [a, b, bias], ref
    return [a, b], ref


def _matmul_inputs(choice: Any, dt: Any) -> tuple[list[Any], Any]:
    """Inputs and torch's result for a batched or epilogued kernels.matmul choice (baddbmm / addmm semantics)."""
    import torch

    lead = (choice.batch,) if choice.batch else ()
    a = torch.randn(*lead, choice.M, choice.K).to(dt)
    b = torch.randn(*(() if choice.shared_B else lead), choice.K, choice.N).to(dt)
    ref = torch.matmul(a.float(), b.float())
    if choice.epilogue in ("bias", "alpha_beta", "residual"):
        extra = torch.randn(choice.N).to(dt) if choice.epilogue == "bias" else torch.randn(*lead, choice.M, choice.N).to(dt)
        if choice.epilogue == "alpha_beta":
            ref = choice.alpha * ref + (choice.beta * extra.float() if choice.beta else 0)
        else:
            ref = ref + extra.float()
        return [a, b, extra], ref
    if choice.epilogue == "scale":
        return [a, b], choice.alpha * ref
    return [a, b], _epilogue_reference(ref, None, choice.epilogue)


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
    """Compile (lowering + building the kernel: g++ in the emulator, the Metal library on MPS), run
    once (the launch alone is timed), compare with torch; returns max |C - ref| / max |ref|."""
    import tilelang

    func = _build(args)
    inputs, ref = _inputs(args)
    t0 = time.perf_counter()
    kernel = tilelang.compile(func, out_idx=[-1], target=_target(args.target), execution_backend=args.backend)
    kernel.adapter.warm_up()  # build the kernel now, so "run" is the launch alone
    t1 = time.perf_counter()
    on_mps = kernel.execution_backend == "torch"
    if on_mps:
        import torch

        inputs = [x.to("mps") for x in inputs]
        torch.mps.synchronize()
        t1 = time.perf_counter()
    out = kernel(*inputs)
    if on_mps:
        torch.mps.synchronize()
    t2 = time.perf_counter()
    err = (out.float().cpu() - ref).abs().max().item()
    scale = ref.abs().max().item() or 1.0
    print(
        f"[{kernel.execution_backend}] {args.m}x{args.n}x{args.k} {args.dtype}->{args.out_dtype}: "
        f"compile {t1 - t0:.2f}s, run {t2 - t1:.2f}s, max |C - torch| = {err:.4g} (max |C| = {scale:.4g})"
    )
    return err / scale


def _one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else type(err).__name__


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by what was asked for (flags, kernel, host): reported in one line. Anything
    else is a bug and keeps its traceback."""
    from .errors import UnsupportedHostError

    return (ValueError, UnsupportedHostError)


def profile(args: argparse.Namespace) -> None:
    """Print the emulator's counts of one launch: the total, then each distinct per-threadgroup
    profile with how many threadgroups share it (interior vs edge tiles), then the roofline estimate."""
    import tilelang

    from .performance import roofline
    from .performance import cost_model
    from .emulator import COUNTER_NAMES, counters

    kernel = tilelang.compile(_build(args), out_idx=[-1], target=_target(args.target), execution_backend="emulator")
    inputs, _ = _inputs(args)
    stats = counters(kernel, *inputs)
    kind = args.choice.route if args.path == "auto" else args.path
    print(f"// counts of one launch of the {args.m}x{args.n}x{args.k} {args.dtype} {kind} GEMM on target {args.target} (emulator)")
    if args.path == "auto":
        print("// " + args.choice.summary())
    width = max(len(name) for name in COUNTER_NAMES)
    for name in COUNTER_NAMES:
        print(f"{name:<{width}}  {stats.total[name]}")
    kinds: dict[tuple[int, ...], list[tuple[int, int, int]]] = {}
    for pos, row in sorted(stats.threadgroups.items()):
        kinds.setdefault(tuple(row[name] for name in COUNTER_NAMES), []).append(pos)
    print(f"// {len(stats.threadgroups)} threadgroups, {len(kinds)} distinct per-threadgroup profile(s):")
    for values, positions in sorted(kinds.items(), key=lambda kv: -len(kv[1])):
        nonzero = ", ".join(f"{name}={v}" for name, v in zip(COUNTER_NAMES, values) if v)
        print(f"//   {len(positions)} like {positions[0]}: {nonzero or 'nothing'}")
    chip = roofline.chip(args.chip) if args.chip else roofline.detect_chip() or roofline.chip("M5")
    estimate = cost_model.roofline_estimate(stats.total, chip)
    print(f"// ESTIMATE, not a measurement: {estimate.describe()}")
    if args.path == "auto" and args.choice.route != "gemv":  # the dispatch's kernel: the cost model with these counts
        tiled = cost_model.estimate_choice(args.choice, chip=chip)
        print(f"// cost model ESTIMATE with these counts: {cost_model.estimate(cost_model.with_counted(tiled.counts, stats.total), chip).describe()}")
    print(f"// chip figures ({'partly estimated' if chip.estimated else 'as stated by Apple'}): {chip.source}")


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "cache":
        return cache_command(args.action)
    if args.command == "profile":
        profile(args)
        return 0
    if args.command == "lower":
        source, decisions = lower_source(args)
        if args.explain:
            for line in decisions:
                print("// " + line)
        print(source)
        return 0
    if args.command == "demo":
        lower_args = validate(_parser().parse_args(["lower"]))
        source, decisions = lower_source(lower_args)
        print(source)
        for line in decisions:
            print("// selection: " + line)
        print(f"// running the kernel --path {args.path} picks at {args.m}x{args.n}x{args.k} ...")
    if args.explain and args.command == "run":
        _, decisions = lower_source(args)
        for line in decisions:
            print("// " + line)
    rel = run_and_check(args)
    tolerance = 2e-2 if args.out_dtype != "float32" or args.dtype != "float32" else 1e-4
    ok = rel <= tolerance
    print(f"relative error {rel:.3g} -> {'OK' if ok else 'MISMATCH'} (tolerance {tolerance})")
    return 0 if ok else EXIT_MISMATCH


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)  # exits with status 2 on a bad flag, before any heavy import
    try:
        import tilelang_metal  # noqa: F401  (activates the plugin once tilelang is imported)

        quiet = args.command != "cache" and not args.verbose
        with _tilelang_log_level("WARNING" if quiet else None):
            return _dispatch(validate(args))
    except _user_errors() as err:
        if args.debug:
            import traceback

            traceback.print_exc()
        else:
            print(f"python -m tilelang_metal {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
