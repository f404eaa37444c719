"""tilelang's calling convention for a lowered Metal kernel, shared by the plugin's adapters.

Tensors come in host-parameter order; with `out_idx` the outputs are allocated here and returned.
The kernel itself may have dropped buffers it never touches, so its buffers are picked from the
host list by name (positional passing would shift every later buffer).
"""

from __future__ import annotations

from typing import Any

from .._host import base_kernel_adapter
from .launch import LaunchShape, launch_shape

KERNEL_DTYPES = ("float16", "bfloat16", "float32", "int32", "int64", "int16", "int8", "uint8", "bool")


def torch_dtype(dtype: Any) -> Any:
    """torch's dtype of the same name (the names coincide for every dtype Metal kernels take)."""
    import torch

    if str(dtype) not in KERNEL_DTYPES:
        raise TypeError(f"no torch dtype for kernel parameter dtype {dtype}")
    return getattr(torch, str(dtype))


class KernelCall:
    def __init__(self, params: list, result_idx: list[int], func: Any, device_mod: Any):
        self.params = params
        self.outputs = list(result_idx)
        host_names = [func.buffer_map[v].name if v in func.buffer_map else v.name for v in func.params]
        gvar, device_func = next(iter(device_mod.functions.items()))
        scalars = [v.name for v in device_func.params if v.dtype != "handle"]
        if scalars:
            raise ValueError(
                f"kernel {gvar.name_hint} has scalar parameters {scalars} (dynamic shapes); the plugin's "
                "Metal launchers run static shapes only. Use concrete sizes (e.g. specialize with @tilelang.jit)."
            )
        self.launch: LaunchShape = launch_shape(device_mod)
        self.device_positions = [host_names.index(v.name) for v in device_func.params]

    def bind(self, args: tuple, device: Any, poison: bool) -> tuple[list, list]:
        """(all host tensors in parameter order, the kernel's buffers in its own order)."""
        import torch

        expected = len(self.params) - len(self.outputs)
        if len(args) != expected:
            raise TypeError(f"kernel {self.launch.kernel_name} takes {expected} tensors, got {len(args)}")
        inputs = iter(args)
        tensors = []
        for i, param in enumerate(self.params):
            if i in self.outputs:
                shape = [int(d) for d in param.shape]
                dtype = torch_dtype(param.dtype)
                if poison:  # outputs start as NaN / -1, so elements the kernel never writes show up
                    fill = float("nan") if dtype.is_floating_point else -1
                    tensors.append(torch.full(shape, fill, dtype=dtype, device=device))
                else:
                    tensors.append(torch.empty(shape, dtype=dtype, device=device))
            else:
                tensors.append(next(inputs))
        return tensors, [tensors[i] for i in self.device_positions]

    def results(self, tensors: list) -> Any:
        outs = [tensors[i] for i in self.outputs]
        if not outs:
            return None
        return outs[0] if len(outs) == 1 else outs


class PluginKernelAdapter(base_kernel_adapter()):
    """What the plugin's adapters share: the MSL source and a KernelCall bound at construction.

    tilelang's base class builds the callable (`_convert_torch_func`) inside its own __init__, so
    the call plan is made there, from arguments stashed before delegating.
    """

    def __init__(self, params: list, result_idx: Any, func_or_mod: Any, device_mod: Any, kernel_source: str, target: Any = None):
        self.kernel_global_source = kernel_source
        self._call_inputs = (params, func_or_mod, device_mod)
        super().__init__(func_or_mod, params=params, result_idx=result_idx)

    @property
    def launch(self) -> LaunchShape:
        return self.call.launch

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        return self.kernel_global_source

    def _convert_torch_func(self) -> Any:
        params, func, device_mod = self._call_inputs
        self.call = KernelCall(params, self.result_idx, func, device_mod)
        return self.make_runner()

    def make_runner(self) -> Any:
        raise NotImplementedError
