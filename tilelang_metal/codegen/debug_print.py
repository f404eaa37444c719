"""T.print in printed MSL: the backends that cannot show its output refuse the kernels whose
artifact records (codegen/artifact.py, `KernelRecord.prints`) say they call it.

The printer keeps TileLang's device-function names (`debug_print_var`, ...; `host.vocab.DEBUG_PRINT_EXTERNS`,
reserved in names.py so no variable takes them). The emulator's shim implements them; on a Mac,
Metal's only shader output is `os_log` (MSL 3.2, `<metal_logging>`), which prints only when the
library is compiled with `MTLCompileOptions.enableLogging` and the command queue has a log state,
and neither `torch.mps.compile_shader` nor `mx.fast.metal_kernel` sets those up: the torch and mlx
backends refuse such kernels instead of dropping the output silently.
"""

from __future__ import annotations

from .artifact import KernelArtifact


def refuse_debug_print(artifact: KernelArtifact, backend: str) -> None:
    """Refuse a module whose kernels call T.print (their artifact records say which) for `backend`."""
    if artifact.prints:
        raise ValueError(
            f'T.print runs only in the emulator: execution_backend="{backend}" compiles without Metal shader logging, '
            'so its output would be lost; use execution_backend="emulator" to print, or remove T.print'
        )
