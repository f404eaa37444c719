"""`execution_backend="torch"` while the plugin is active: the MSL runs on the Mac's GPU through
torch's stock Metal path (`torch.mps.compile_shader`), with tilelang's calling convention
(calling.py): `out_idx` outputs allocated on the MPS device, buffers bound by name.
"""

from __future__ import annotations

from typing import Any

from .calling import PluginKernelAdapter


class MPSKernelAdapter(PluginKernelAdapter):
    _shader = None

    def make_runner(self) -> Any:
        import torch

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
