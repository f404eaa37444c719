"""Execution-backend declarations of the plugin's Metal manifest."""

from __future__ import annotations

import shutil
from typing import Any

from ..host import ExecutionBackendSpec

EMULATOR = "emulator"
MLX = "mlx"


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
    # MLX (kernels on mx.arrays) is only ever chosen by name.
    return (
        ExecutionBackendSpec("torch", is_available=lambda: mps_available()),
        ExecutionBackendSpec(EMULATOR, is_available=lambda: cxx_available()),
        ExecutionBackendSpec(MLX, is_available=lambda: mlx_available()),
    )


def unavailable_hint(name: str) -> str | None:
    """What to do when tilelang refuses a plugin backend as unavailable on this host."""
    if name == MLX and not mlx_available():
        return "execution_backend='mlx' needs MLX: pip install mlx (on Linux: pip install 'mlx[cpu]'), or in the tilelang-metal clone: pip install -e '.[mlx]'."
    if name == EMULATOR and not cxx_available():
        return "execution_backend='emulator' needs a C++20 compiler (g++ or c++) on PATH (or TILELANG_METAL_EMULATOR_CXX)."
    return None
