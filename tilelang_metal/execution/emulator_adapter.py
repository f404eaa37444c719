"""`execution_backend="emulator"`: run the plugin's MSL on the CPU (Linux or macOS) with torch CPU tensors.

Same calling convention as tilelang's other adapters: tensors in parameter order, outputs written
in place; with `out_idx`, the output tensors are allocated here and returned.
"""

from __future__ import annotations

from typing import Any

from .._host import base_kernel_adapter
from .launch import launch_shape

BaseKernelAdapter = base_kernel_adapter()


def _torch_dtype(dtype: Any) -> Any:
    import torch

    table = {
        "float16": torch.float16,
        "bfloat16": torch.bfloat16,
        "float32": torch.float32,
        "int32": torch.int32,
        "int64": torch.int64,
        "int16": torch.int16,
        "int8": torch.int8,
        "uint8": torch.uint8,
        "bool": torch.bool,
    }
    try:
        return table[str(dtype)]
    except KeyError:
        raise TypeError(f"the emulator has no torch dtype for {dtype}") from None


class EmulatorKernelAdapter(BaseKernelAdapter):
    def __init__(self, params: list, result_idx: Any, func_or_mod: Any, device_mod: Any, kernel_source: str, target: Any = None):
        self.kernel_global_source = kernel_source
        self.launch = launch_shape(device_mod)
        # The kernel may drop buffers it never touches: pick its buffers from the host list by name.
        host_names = [func_or_mod.buffer_map[v].name if v in func_or_mod.buffer_map else v.name for v in func_or_mod.params]
        device_func = next(iter(device_mod.functions.values()))
        self.device_positions = [host_names.index(v.name) for v in device_func.params]
        self._kernel = None
        super().__init__(func_or_mod, params=params, result_idx=result_idx)

    def get_kernel_source(self, kernel_only: bool = True) -> str:
        return self.kernel_global_source

    def compiled(self) -> Any:
        if self._kernel is None:
            from ..emulator import compile_kernel

            self._kernel = compile_kernel(self.kernel_global_source)
        return self._kernel

    def _convert_torch_func(self) -> Any:
        import torch

        n_params = len(self.params)
        outputs = set(self.result_idx)

        def run(*args: Any) -> Any:
            expected_inputs = n_params - len(outputs)
            if len(args) != expected_inputs:
                raise TypeError(f"kernel {self.launch.kernel_name} takes {expected_inputs} tensors, got {len(args)}")
            inputs = iter(args)
            tensors = []
            for i, param in enumerate(self.params):
                if i in outputs:
                    shape = [int(d) for d in param.shape]
                    dtype = _torch_dtype(param.dtype)
                    # Outputs start poisoned (NaN / -1), so elements the kernel never writes show up.
                    fill = float("nan") if dtype.is_floating_point else -1
                    tensors.append(torch.full(shape, fill, dtype=dtype))
                else:
                    tensors.append(next(inputs))
            self.compiled().launch([tensors[i] for i in self.device_positions], self.launch.grid, self.launch.block)
            results = [tensors[i] for i in self.result_idx]
            if not results:
                return None
            return results[0] if len(results) == 1 else results

        return run
