"""`execution_backend="emulator"`: run the plugin's MSL on the CPU (Linux or macOS) with torch CPU tensors.

Same calling convention as the other adapters (calling.py): outputs written in place, `out_idx`
outputs allocated and returned. Outputs start poisoned, so unwritten elements show up as NaN.
"""

from __future__ import annotations

from typing import Any

from .calling import PluginKernelAdapter


class EmulatorKernelAdapter(PluginKernelAdapter):
    _kernel = None

    def compiled(self) -> Any:
        if self._kernel is None:
            from ..emulator import compile_kernel

            self._kernel = compile_kernel(self.kernel_global_source)
        return self._kernel

    def make_runner(self) -> Any:
        def run(*args: Any) -> Any:
            tensors, buffers = self.call.bind(args, "cpu", poison=True)
            self.compiled().launch(buffers, self.call.launch.grid, self.call.launch.block)
            return self.call.results(tensors)

        return run
