"""Device codegen entry: lowered device IRModule -> stock TVM source module holding the MSL."""

from __future__ import annotations

from typing import Any

from ..host import make_source_module, tir
from ..version import __version__
from .math_functions import helper_definitions
from .printer import print_kernel

BANNER_PREFIX = "// tilelang_metal"
# Standard headers first, in this order; any other header after them, sorted.
HEADER_ORDER = ("metal_stdlib", "metal_simdgroup", "MetalPerformancePrimitives/MetalPerformancePrimitives.h")


def banner(kernel_names: list[str]) -> str:
    return f"{BANNER_PREFIX} {__version__}: {', '.join(kernel_names)}"


def _include_lines(headers: set[str]) -> list[str]:
    ordered = [h for h in HEADER_ORDER if h in headers] + sorted(headers - set(HEADER_ORDER))
    return [f"#include <{h}>" for h in ordered]


def generate_msl(mod: Any) -> str:
    """MSL for every kernel of the module in one file: the banner, one header holding the union of
    the kernels' includes, the helper functions any kernel calls (math helpers, atomic CAS loops;
    each once), then the kernels (sorted by name: the launchers find them by name)."""
    kernels = sorted(((str(gvar.name_hint), func) for gvar, func in mod.functions.items() if isinstance(func, tir.PrimFunc)), key=lambda kv: kv[0])
    headers: set[str] = set()
    helpers: set[str] = set()
    support: dict[str, str] = {}
    bodies = []
    for name, func in kernels:
        text, needs, calls, support_code = print_kernel(func, name)
        headers |= needs
        helpers |= calls
        support.update(support_code)
        bodies.append(text)
    head = [banner([name for name, _ in kernels]), *_include_lines(headers), "using namespace metal;", ""]
    head += helper_definitions(helpers) + [support[key] for key in sorted(support)]
    return "\n".join(head + bodies)


def build_metal(mod: Any, target: Any) -> Any:
    from ..pipeline import finalize_for_codegen

    return make_source_module(generate_msl(finalize_for_codegen(mod)), "metal")
