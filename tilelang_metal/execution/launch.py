"""Launch geometry of a lowered Metal kernel, read from its device function."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LaunchShape:
    kernel_name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]


def launch_shape(device_mod: Any) -> LaunchShape:
    kernels = [(str(gvar.name_hint), func) for gvar, func in device_mod.functions.items()]
    if len(kernels) != 1:
        raise ValueError(f"expected one Metal kernel in the device module, found {len(kernels)}: {[k for k, _ in kernels]}")
    name, func = kernels[0]
    grid, block = [1, 1, 1], [1, 1, 1]
    for tag, extent in func.attrs["thread_extent"].items():
        tag = str(tag)
        axis = "xyz".index(tag[-1])
        if tag.startswith("blockIdx"):
            grid[axis] = int(extent)
        elif tag.startswith("threadIdx"):
            block[axis] = int(extent)
    return LaunchShape(name, tuple(grid), tuple(block))
