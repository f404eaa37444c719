"""`execution_backend="torch"` while the plugin is active: the MSL runs on the Mac's GPU through
torch's stock Metal path (`torch.mps.compile_shader`), with tilelang's calling convention
(calling.py): `out_idx` outputs allocated on the MPS device, every kernel of the module launched in
host order with its own arguments.
"""

from __future__ import annotations

from typing import Any

from . import metal4_launch
from .binding import Device, torch_dtype
from .calling import PluginKernelAdapter

MPS = Device("mps", "torch")


def _scalar_buffer(value: Any, dtype: str) -> Any:
    """A `constant T&` argument as a one-element MPS tensor of exactly T (a Python number would be
    passed with torch's own width: 64-bit ints, 32-bit floats)."""
    import torch

    return torch.tensor([value], dtype=torch_dtype(dtype), device=MPS.type)


class MPSKernelAdapter(PluginKernelAdapter):
    device = MPS
    _library = None

    def library(self) -> Any:
        """The module's compiled MSL (at the first launch). A metal4 module is checked first: this
        Mac and torch must compile MSL 4.0 (metal4_launch.py)."""
        if self._library is None:
            import torch

            source = self.kernel_global_source
            names = ", ".join(dict.fromkeys(launch.kernel_name for launch in self.call.launches))
            if metal4_launch.needs_metal4(self.artifact):
                metal4_launch.check(names, metal4_launch.current("torch"))
            try:
                self._library = torch.mps.compile_shader(source)
            except Exception as err:
                explained = metal4_launch.explain_compile_error(names, err) if metal4_launch.needs_metal4(self.artifact) else None
                if explained is None:
                    raise
                raise explained from err
        return self._library

    def compiled(self, kernel_name: str) -> Any:
        return getattr(self.library(), kernel_name)

    def make_runner(self) -> Any:
        def launch_one(launch: Any, shape: Any, bound: Any) -> None:
            kernel = self.compiled(launch.kernel_name)
            threads = [g * b for g, b in zip(shape.grid, shape.block)]  # compile_shader takes total threads
            kernel(*launch.values(bound, _scalar_buffer), threads=threads, group_size=list(shape.block))

        def run(*args: Any) -> Any:
            return self.call.run(args, MPS, False, launch_one)

        return run
