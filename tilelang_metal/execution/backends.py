"""Execution-backend declarations of the plugin's Metal manifest."""

from __future__ import annotations

import shutil
from typing import Any

from .._host import ExecutionBackendSpec

EMULATOR = "emulator"


def mps_available() -> bool:
    try:
        import torch

        return bool(torch.backends.mps.is_available())
    except Exception:
        return False


def cxx_available() -> bool:
    return shutil.which("g++") is not None or shutil.which("c++") is not None


def execution_backends() -> tuple[Any, ...]:
    # Order matters for execution_backend="auto": torch (Metal GPU) where MPS runs, else the emulator.
    return (
        ExecutionBackendSpec("torch", is_available=lambda: mps_available()),
        ExecutionBackendSpec(EMULATOR, is_available=lambda: cxx_available()),
    )
