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
    texts = [print_kernel(func, name, head) for name, func in kernels]
    starts = [text.index("[[kernel") for text in texts]
    # One header per file: the first kernel's, plus any #include a later kernel needs (MPP).
    header = texts[0][: starts[0]].splitlines()
    for text, start in zip(texts[1:], starts[1:]):
        for line in text[:start].splitlines():
            if line.startswith("#include") and line not in header:
                last = max(i for i, known in enumerate(header) if known.startswith("#include"))
                header.insert(last + 1, line)
    return "\n".join(header) + "\n" + "\n".join(text[start:] for text, start in zip(texts, starts))


def build_metal(mod: Any, target: Any) -> Any:
    return make_source_module(generate_msl(mod), "metal")
