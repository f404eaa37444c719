"""Device codegen entry: lowered device IRModule -> a TVM module holding the MSL.

The plugin registers `pipeline.codegen_build` / `codegen_build_runtime`, which run the late passes
(`pipeline.finalize_for_codegen`) and call these; this package imports no pass module.
`build_metal` (tilelang's build_without_compile: the torch, emulator and mlx backends) makes a stock
source module with the standard signature; `build_metal_runtime` (tilelang's build with device
compile: execution_backend="tvm_ffi") makes a module of TVM's own Metal runtime, with the signature
that runtime launches (printer.TVM_RUNTIME). Where TVM has no Metal runtime (Linux, or
TVM_COMPILE_FORCE_FALLBACK set) device compile makes what TVM makes there: a module to inspect,
here the same source module as without device compile; launching it is refused
(host/install.py, refuse_unlaunchable_metal_module)."""

from __future__ import annotations

from typing import Any

from ..host import RuntimeFunctionInfo, kernel_launch_param_tags, make_metal_runtime_module, make_source_module, metal_runtime_unusable, tir
from ..version import __version__
from .artifact import KernelArtifact, artifact_of
from .debug_print import refuse_debug_print
from .math_functions import helper_definitions
from .printer import IMPORTED_SOURCE_KEY, STANDARD, TVM_RUNTIME, print_kernel

BANNER_PREFIX = "// tilelang_metal"
# Standard headers first, in this order; any other header after them, sorted.
HEADER_ORDER = ("metal_stdlib", "metal_simdgroup", "MetalPerformancePrimitives/MetalPerformancePrimitives.h")


def banner(kernel_names: list[str]) -> str:
    return f"{BANNER_PREFIX} {__version__}: {', '.join(kernel_names)}"


def _include_lines(headers: set[str]) -> list[str]:
    ordered = [h for h in HEADER_ORDER if h in headers] + sorted(headers - set(HEADER_ORDER))
    return [f"#include <{h}>" for h in ordered]


def generate_msl(mod: Any, signature: str = STANDARD) -> str:
    """MSL for every kernel of the module in one file: the banner, one header holding the union of
    the kernels' includes, the helper functions any kernel calls (math helpers, atomic CAS loops;
    each once), the sources the kernels import (T.import_source; each once), the kernels (sorted by
    name: the launchers find them by name), and last the artifact line (the kernels' records,
    codegen/artifact.py: `artifact_of` reads them back). Last, so that a reader of the source sees
    the kernel before one long line of JSON."""
    kernels = sorted(((str(gvar.name_hint), func) for gvar, func in mod.functions.items() if isinstance(func, tir.PrimFunc)), key=lambda kv: kv[0])
    headers: set[str] = set()
    helpers: set[str] = set()
    support: dict[str, str] = {}
    bodies = []
    records = []
    for name, func in kernels:
        text, needs, calls, support_code, record = print_kernel(func, name, signature)
        headers |= needs
        helpers |= calls
        support.update(support_code)
        bodies.append(text)
        records.append(record)
    artifact = KernelArtifact(convention=signature, kernels=tuple(records))
    head = [banner([name for name, _ in kernels]), *_include_lines(headers), "using namespace metal;", ""]
    head += helper_definitions(helpers) + [support[key] for key in sorted(support) if not key.startswith(IMPORTED_SOURCE_KEY)]
    head += [text for key, text in support.items() if key.startswith(IMPORTED_SOURCE_KEY)]  # T.import_source, in program order
    return "\n".join(head + bodies) + "\n" + artifact.line() + "\n"


def build_metal(mod: Any, target: Any) -> Any:
    """A source module of the MSL of `mod`, already through the late passes (pipeline.codegen_build)."""
    return make_source_module(generate_msl(mod), "metal")


def runtime_function_info(record: Any, func: Any) -> RuntimeFunctionInfo:
    """What TVM's Metal runtime needs to launch one kernel: the type of each argument the host
    passes (buffers as handles, scalars as the argument struct's members are packed: the kernel's
    artifact record) and the launch tags that name the trailing grid / threadgroup extents of each
    call (the host's launch)."""
    arg_types = ["handle"] * len(record.buffers)
    for param in record.bound[len(record.buffers):]:
        arg_types += [dtype for _, dtype in param.members]  # the one argument struct, after the buffers
    return RuntimeFunctionInfo(record.name, tuple(arg_types), tuple(str(tag) for tag in kernel_launch_param_tags(func)))


def build_metal_runtime(mod: Any, target: Any) -> Any:
    """TVM's Metal runtime module of `mod`, already through the late passes (pipeline.codegen_build_runtime)."""
    if metal_runtime_unusable() is not None:
        # Nothing can launch the argument-struct form here: keep the MSL the emulator and torch run,
        # so tilelang.lower gives the same kernel_source with and without device compile.
        return build_metal(mod, target)
    from .kernel_text import split_kernels

    msl = generate_msl(mod, TVM_RUNTIME)
    artifact = artifact_of(msl)
    refuse_debug_print(artifact, "tvm_ffi")  # TVM's runtime compiles without shader logging, like torch's
    per_kernel = split_kernels(msl)  # each kernel with the file's header: compiled on its own
    kernels = {str(gvar.name_hint): func for gvar, func in mod.functions.items() if isinstance(func, tir.PrimFunc)}
    infos = [runtime_function_info(artifact.kernel(name), func) for name, func in sorted(kernels.items())]
    return make_metal_runtime_module({info.name: per_kernel[info.name] for info in infos}, infos, msl)
