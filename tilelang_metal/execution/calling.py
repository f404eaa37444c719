"""tilelang's calling convention for a lowered Metal kernel, shared by the plugin's adapters.

Tensors come in host-parameter order; with `out_idx` the outputs are allocated here and returned.
The kernel itself may have dropped buffers it never touches, so its buffers are picked from the
host list by name (positional passing would shift every later buffer).
"""

from __future__ import annotations

from typing import Any

from .launch import LaunchShape, launch_shape

TORCH_DTYPES = {
    "float16": "float16",
    "bfloat16": "bfloat16",
    "float32": "float32",
    "int32": "int32",
    "int64": "int64",
    "int16": "int16",
    "int8": "int8",
    "uint8": "uint8",
    "bool": "bool",
}


def torch_dtype(dtype: Any) -> Any:
    import torch

    try:
        return getattr(torch, TORCH_DTYPES[str(dtype)])
    except KeyError:
        raise TypeError(f"no torch dtype for kernel parameter dtype {dtype}") from None


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
