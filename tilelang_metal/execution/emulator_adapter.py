"""`execution_backend="emulator"`: run the plugin's MSL on the CPU (Linux or macOS) with torch CPU tensors.

Same calling convention as the other adapters (calling.py): outputs written in place, `out_idx`
outputs allocated and returned. Outputs start poisoned, so unwritten elements show up as NaN.
"""

from __future__ import annotations

from typing import Any

from .._host import base_kernel_adapter
from .calling import KernelCall

BaseKernelAdapter = base_kernel_adapter()


class EmulatorKernelAdapter(BaseKernelAdapter):
    def __init__(self, params: list, result_idx: Any, func_or_mod: Any, device_mod: Any, kernel_source: str, target: Any = None):
        self.kernel_global_source = kernel_source
        self._kernel = None
        self._params_for_call = (params, func_or_mod, device_mod)
        super().__init__(func_or_mod, params=params, result_idx=result_idx)

    @property
    def launch(self) -> Any:
        return self.call.launch

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        return self.kernel_global_source

    def compiled(self) -> Any:
        if self._kernel is None:
            from ..emulator import compile_kernel

            self._kernel = compile_kernel(self.kernel_global_source)
        return self._kernel

    def _convert_torch_func(self) -> Any:
        params, func, device_mod = self._params_for_call
        self.call = KernelCall(params, self.result_idx, func, device_mod)

        def run(*args: Any) -> Any:
            tensors, buffers = self.call.bind(args, "cpu", poison=True)
            self.compiled().launch(buffers, self.call.launch.grid, self.call.launch.block)
            return self.call.results(tensors)

        return run
