"""`execution_backend="torch"` while the plugin is active: the MSL runs on the Mac's GPU through
torch's stock Metal path (`torch.mps.compile_shader`), with tilelang's calling convention
(calling.py): `out_idx` outputs allocated on the MPS device, buffers bound by name.
"""

from __future__ import annotations

from typing import Any

from .._host import base_kernel_adapter
from .calling import KernelCall

BaseKernelAdapter = base_kernel_adapter()


class MPSKernelAdapter(BaseKernelAdapter):
    def __init__(self, params: list, result_idx: Any, func_or_mod: Any, device_mod: Any, kernel_source: str, target: Any = None):
        self.kernel_global_source = kernel_source
        self._params_for_call = (params, func_or_mod, device_mod)
        self._shader = None
        super().__init__(func_or_mod, params=params, result_idx=result_idx)

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        return self.kernel_global_source

    def _convert_torch_func(self) -> Any:
        import torch

        params, func, device_mod = self._params_for_call
        self.call = KernelCall(params, self.result_idx, func, device_mod)
        launch = self.call.launch
        threads = [g * b for g, b in zip(launch.grid, launch.block)]  # compile_shader takes total threads

        def run(*args: Any) -> Any:
            if self._shader is None:
                library = torch.mps.compile_shader(self.kernel_global_source)
                self._shader = getattr(library, launch.kernel_name)
            tensors, buffers = self.call.bind(args, "mps", poison=False)
            self._shader(*buffers, threads=threads, group_size=list(launch.block))
            return self.call.results(tensors)

        return run
