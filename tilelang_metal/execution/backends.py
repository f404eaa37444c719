"""Execution-backend declarations of the plugin's Metal manifest."""

from __future__ import annotations

import shutil
from typing import Any

from ..host import ExecutionBackendSpec, metal_runtime_available

EMULATOR = "emulator"
MLX = "mlx"
TVM_FFI = "tvm_ffi"


def mps_available() -> bool:
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def cxx_available() -> bool:
    return shutil.which("g++") is not None or shutil.which("c++") is not None


def mlx_available() -> bool:
    try:
        import mlx.core  # noqa: F401
    except ImportError:
        return False
    return True


def execution_backends() -> tuple[Any, ...]:
    # Order matters for execution_backend="auto": torch (Metal GPU) where MPS runs, else the emulator.
    # MLX (kernels on mx.arrays) and tvm_ffi (stock TVM runtime) are only ever chosen by name.
    # tvm_ffi is tilelang's own TVMFFIKernelAdapter over a host module that imports TVM's Metal
    # runtime module (codegen/build.py, build_metal_runtime): tilelang builds both when the spec
    # asks for host codegen and device compile.
    return (
        ExecutionBackendSpec("torch", is_available=lambda: mps_available()),
        ExecutionBackendSpec(EMULATOR, is_available=lambda: cxx_available()),
        ExecutionBackendSpec(MLX, is_available=lambda: mlx_available()),
        ExecutionBackendSpec(TVM_FFI, is_available=lambda: metal_runtime_available(), enable_host_codegen=True, enable_device_compile=True),
    )


def unavailable_hint(name: str) -> str | None:
    """What to do when tilelang refuses a plugin backend as unavailable on this host."""
    if name == MLX and not mlx_available():
        return "execution_backend='mlx' needs MLX: pip install mlx (on Linux: pip install 'mlx[cpu]'), or in the tilelang-metal clone: pip install -e '.[mlx]'."
    if name == TVM_FFI and not metal_runtime_available():
        return (
            "execution_backend='tvm_ffi' needs TVM's Metal runtime, which tilelang's macOS wheel has "
            "(ffi.Module.create.metal); on this host use execution_backend='emulator'."
        )
    if name == EMULATOR and not cxx_available():
        return "execution_backend='emulator' needs a C++20 compiler (g++ or c++) on PATH (or TILELANG_METAL_EMULATOR_CXX)."
    return None
