"""Device codegen entry: lowered device IRModule -> stock TVM source module holding the MSL."""

from __future__ import annotations

from typing import Any

from .._host import make_source_module, tir
from ..version import __version__
from .printer import print_kernel

BANNER_PREFIX = "// tilelang_metal"


def banner(kernel_names: list[str]) -> str:
    return f"{BANNER_PREFIX} {__version__}: {', '.join(kernel_names)}"


def generate_msl(mod: Any) -> str:
    """MSL for every kernel of the module, one file, the banner on its first line."""
    kernels = [(str(gvar.name_hint), func) for gvar, func in mod.functions.items() if isinstance(func, tir.PrimFunc)]
    kernels.sort(key=lambda item: item[0])
    names = [name for name, _ in kernels]
    head = banner(names)
    sources = []
    for i, (name, func) in enumerate(kernels):
        text = print_kernel(func, name, head)
        if i > 0:  # one header per file
            text = text[text.index("[[kernel"):]
        sources.append(text)
    return "\n".join(sources)


def build_metal(mod: Any, target: Any) -> Any:
    return make_source_module(generate_msl(mod), "metal")
