"""`execution_backend="emulator"`: run the plugin's MSL on the CPU (Linux or macOS) with torch CPU tensors.

Same calling convention as the other adapters (calling.py): outputs written in place, `out_idx`
outputs allocated and returned. Outputs start poisoned, so unwritten elements show up as NaN.
The emulator compiles one kernel per source, so a module with several kernels is split into one
source per kernel (the shared header + that kernel).
"""

from __future__ import annotations

import re
from typing import Any

from .binding import Device
from .calling import PluginKernelAdapter

CPU = Device("cpu", "emulator")
_KERNEL_START = re.compile(r"^\[\[kernel\b.*?\]\]\s*void\s+([A-Za-z_]\w*)\s*\(", re.MULTILINE)


def single_kernel_sources(msl: str) -> dict[str, str]:
    """kernel name -> the header of `msl` followed by that kernel alone (printer layout:
    header, then each `[[kernel ...]] void NAME(` to the next one)."""
    starts = list(_KERNEL_START.finditer(msl))
    if not starts:
        return {}
    header = msl[: starts[0].start()]
    out = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(msl)
        out[m.group(1)] = header + msl[m.start() : end]
    return out


class EmulatorKernelAdapter(PluginKernelAdapter):
    def compiled(self, kernel_name: str) -> Any:
        kernels = self.__dict__.setdefault("_kernels", {})
        if kernel_name not in kernels:
            from ..emulator import compile_kernel

            sources = single_kernel_sources(self.kernel_global_source)
            if len(sources) == 1:
                (source,) = sources.values()
            elif kernel_name in sources:
                source = sources[kernel_name]
            else:
                raise ValueError(f"kernel {kernel_name} is not in the module's MSL (kernels: {sorted(sources)})")
            kernels[kernel_name] = compile_kernel(source)
        return kernels[kernel_name]

    def make_runner(self) -> Any:
        def launch_one(launch: Any, shape: Any, bound: Any) -> None:
            self.compiled(launch.kernel_name).launch(launch.values(bound), shape.grid, shape.block)

        def run(*args: Any) -> Any:
            return self.call.run(args, CPU, True, launch_one)

        return run
