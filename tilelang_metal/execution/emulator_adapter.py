"""`execution_backend="emulator"`: run the plugin's MSL on the CPU (Linux or macOS) with torch CPU tensors.

Same calling convention as the other adapters (calling.py): outputs written in place, `out_idx`
outputs allocated and returned. Outputs start poisoned, so unwritten elements show up as NaN.
The emulator compiles one kernel per source, so a module with several kernels is split into one
source per kernel (the shared header + that kernel).
"""

from __future__ import annotations

from typing import Any

from .binding import Device
from .calling import PluginKernelAdapter

CPU = Device("cpu", "emulator")


class EmulatorKernelAdapter(PluginKernelAdapter):
    device = CPU
    shows_print_output = True  # T.print lines on stdout (docs/emulator.md, "T.print")

    def compiled(self, kernel_name: str) -> Any:
        kernels = self.__dict__.setdefault("_kernels", {})
        if kernel_name not in kernels:
            from ..emulator import compile_kernel, split_kernels

            sources = split_kernels(self.kernel_global_source)
            source = sources.get(kernel_name)
            if source is None:
                raise ValueError(f"kernel {kernel_name} is not in the module's MSL (kernels: {sorted(sources)})")
            kernels[kernel_name] = compile_kernel(source)
        return kernels[kernel_name]

    def make_runner(self) -> Any:
        def launch_one(launch: Any, shape: Any, bound: Any) -> None:
            self.compiled(launch.kernel_name).launch(launch.values(bound), shape.grid, shape.block)

        def run(*args: Any) -> Any:
            return self.call.run(args, CPU, True, launch_one)

        return run
