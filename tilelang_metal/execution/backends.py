"""Execution-backend declarations of the plugin's Metal manifest."""

from __future__ import annotations

import shutil
from typing import Any

from .._host import ExecutionBackendSpec

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
