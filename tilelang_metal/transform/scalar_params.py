"""Refuse scalar kernel parameters the host cannot pass, at the start of lowering, by name.

tilelang's MakePackedAPI unpacks a float scalar argument only for IEEE float types: a `T.bfloat16`
scalar stopped lowering with TVM's `Check failed: (dtype.is_float())`, naming neither the kernel
nor the parameter. Metal has no fp8 at all. Tensors of these types are fine; only scalars are refused.
"""

from __future__ import annotations

from typing import Any

from ..errors import MetalLoweringError
from .function_pass import per_function_pass


def _refusal(kernel: str, name: str, dtype: str) -> str | None:
    if dtype == "bfloat16":
        return (f"kernel {kernel}: scalar parameter '{name}' is bfloat16, which tilelang's host argument unpacking "
                f"(MakePackedAPI) cannot take; declare it T.float32 and convert inside the kernel with T.cast({name}, 'bfloat16')")
    if dtype.startswith(("float8", "float6", "float4")):
        return (f"kernel {kernel}: scalar parameter '{name}' is {dtype}, which Metal does not have; declare it "
                f"T.float32 (or T.float16) and quantize inside the kernel")
    return None


def _checked(func: Any) -> Any:
    kernel = str(func.attrs["global_symbol"]) if func.attrs is not None and "global_symbol" in func.attrs else "main"
    for param in func.params:
        dtype = str(param.dtype)
        if dtype == "handle":
            continue
        why = _refusal(kernel, param.name, dtype)
        if why is not None:
            raise MetalLoweringError(why)
    return func


CheckScalarParams = per_function_pass("tilelang_metal.CheckScalarParams", _checked)
