"""T.print in printed MSL: which kernels call it, and the backends that cannot show its output.

The printer keeps TileLang's device-function names (`debug_print_var`, ...; `host.vocab.DEBUG_PRINT_EXTERNS`,
reserved in names.py so no variable takes them). The emulator's shim implements them; on a Mac,
Metal's only shader output is `os_log` (MSL 3.2, `<metal_logging>`), which prints only when the
library is compiled with `MTLCompileOptions.enableLogging` and the command queue has a log state,
and neither `torch.mps.compile_shader` nor `mx.fast.metal_kernel` sets those up: the torch and mlx
backends refuse such kernels instead of dropping the output silently.
"""

from __future__ import annotations

import re

from ..host import DEBUG_PRINT_EXTERNS

_CALL = re.compile(r"\b(?:" + "|".join(DEBUG_PRINT_EXTERNS) + r")\s*\(")


def uses_debug_print(msl: str) -> bool:
    return _CALL.search(msl) is not None


def refuse_debug_print(msl: str, backend: str) -> None:
    if uses_debug_print(msl):
        raise ValueError(
            f'T.print runs only in the emulator: execution_backend="{backend}" compiles without Metal shader logging, '
            'so its output would be lost; use execution_backend="emulator" to print, or remove T.print'
        )
