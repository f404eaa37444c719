"""`T.import_source` on Metal: the imported text must be MSL, checked at the start of lowering.

The printer puts each imported source into the kernel file once, before the kernels
(codegen/build.py), where `T.call_extern` reaches its functions. The rule for "is MSL" is the
language's definition, not a compile: MSL is C++14 without the features its specification removes,
and a kernel file compiled from a string (torch's compile_shader, MLX, TVM's runtime) can include
Metal's own headers only. So a source is refused, naming the first offending line, when it
- includes any other header (`#include <cuda_fp16.h>`, `"my_helpers.h"`),
- uses a C++ feature MSL removes: inline assembly (`asm`, PTX included), `goto`, `virtual`,
  exceptions, `new`, `thread_local` / `register`, `dynamic_cast`, `typeid`,
- or uses a CUDA declaration qualifier (`__device__`, `__global__`, `__shared__`, ...), which no
  Metal header defines.
Anything else that is not MSL (a misspelt or CUDA-only function, a type error) is left to the MSL
compiler, which names it where the kernel is built (the emulator, or Metal on first launch).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import MetalLoweringError
from ..host import IMPORT_SOURCE_ATTR, tir
from .function_pass import per_function_pass

METAL_HEADERS = re.compile(r"metal_\w+|MetalPerformancePrimitives/\w+\.h")
NOT_IN_MSL = {
    "asm": "inline assembly", "__asm__": "inline assembly", "__asm": "inline assembly",
    "goto": "goto", "virtual": "virtual functions", "try": "exceptions", "catch": "exceptions", "throw": "exceptions",
    "new": "the new operator", "thread_local": "thread_local storage", "register": "the register qualifier",
    "dynamic_cast": "dynamic_cast", "typeid": "type identification",
}
CUDA_QUALIFIERS = ("__device__", "__global__", "__host__", "__shared__", "__constant__", "__managed__",
                   "__forceinline__", "__noinline__", "__launch_bounds__", "__grid_constant__")
_TOKEN = re.compile(r"#\s*include\s*[<\"]([^>\"\n]*)[>\"]|\b[A-Za-z_]\w*\b")
_COMMENT_OR_LITERAL = re.compile(r"//[^\n]*|/\*.*?\*/|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'", re.S)


def _without_comments_and_literals(text: str) -> str:
    """Comments blanked, string and character literals emptied (header names kept), newlines kept."""

    def blank(m: re.Match[str]) -> str:
        piece = m.group(0)
        if piece[0] in "\"'" and re.search(r"#\s*include\s*$", text[: m.start()].rsplit("\n", 1)[-1]):
            return piece  # the quoted name of an #include
        return piece[0] + re.sub(r"[^\n]", " ", piece[1:-1]) + piece[-1] if piece[0] in "\"'" else re.sub(r"[^\n]", " ", piece)

    return _COMMENT_OR_LITERAL.sub(blank, text)


def import_refusal(source: str) -> str | None:
    """Why `source` is not MSL by the rule above (with its line in the source), or None."""
    text = _without_comments_and_literals(source)
    for m in _TOKEN.finditer(text):
        line = text.count("\n", 0, m.start()) + 1
        header, token = m.group(1), m.group(0)
        if header is not None:
            if not METAL_HEADERS.fullmatch(header.strip()):
                return f"line {line} includes {header.strip()}, which is not a Metal header"
        elif token in CUDA_QUALIFIERS:
            return f"line {line} uses {token}, a CUDA qualifier"
        elif token in NOT_IN_MSL:
            return f"line {line} uses {token} ({NOT_IN_MSL[token]}, which MSL does not have)"
    return None


def _text(value: Any) -> str:
    return str(getattr(value, "value", value))  # a StringImm, or the annotation's string


def imported_sources(func: Any) -> list[str]:
    """The texts imported into `func`, in program order (block annotations before lowering, attribute
    statements after)."""
    found: list[str] = []

    def visit(node: Any) -> None:
        if isinstance(node, tir.AttrStmt) and str(node.attr_key) == IMPORT_SOURCE_ATTR:
            found.append(_text(node.value))
        annotations = getattr(node, "annotations", None)
        if annotations is not None and IMPORT_SOURCE_ATTR in annotations:
            found.append(_text(annotations[IMPORT_SOURCE_ATTR]))

    tir.stmt_functor.pre_order_visit(func.body, lambda node: visit(node) is None)
    return found


def _checked(func: Any) -> Any:
    kernel = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "main"
    for source in imported_sources(func):
        why = import_refusal(source)
        if why is not None:
            raise MetalLoweringError(
                f"kernel {kernel}: T.import_source on Metal takes MSL, but the imported source {why}; "
                "import an MSL version of the code (Metal headers only) or write it in TileLang"
            )
    return func


CheckImportedSources = per_function_pass("tilelang_metal.CheckImportedSources", _checked)
