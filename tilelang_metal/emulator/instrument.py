"""Counters and race detection for kernels compiled with `execution_backend="emulator"`.

Both run a separately compiled flavour of the kernel (`-DTLM_COUNTERS` / `-DTLM_RACECHECK`, with
stores and predicated accesses marked by access_marks.py), so plain launches pay nothing.

    stats = counters(jit_kernel, a, b)          # same arguments as jit_kernel(a, b)
    stats.total["matmul2d_16x32x16"], stats.threadgroups[(0, 0, 0)]["threadgroup_barriers"]
    racecheck(jit_kernel, a, b, seeds=(0, 1, 2))  # raises EmulatorRaceError

See docs/emulator.md (Counters, Race detection) for what is counted and checked.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .errors import EmulatorRaceError

# Same order as `enum counter` in shim/tlm/runtime_api.h.
COUNTER_NAMES: tuple[str, ...] = (
    "device_load_instructions",
    "device_load_bytes",
    "device_store_instructions",
    "device_store_bytes",
    "predicated_device_loads",
    "predicated_device_stores",
    "threadgroup_load_instructions",
    "threadgroup_load_bytes",
    "threadgroup_store_instructions",
    "threadgroup_store_bytes",
    "threadgroup_barriers",
    "simdgroup_barriers",
    "simd_collectives",
    "matmul2d_16x32x16",
    "simdgroup_multiply_accumulate_8x8x8",
    "simdgroup_multiply_8x8x8",
)
_MODE_COUNTERS, _MODE_RACECHECK = 1, 2


@dataclass(frozen=True)
class KernelCounters:
    """Counts of one launch: `total` and per threadgroup `(x, y, z)`, both counter name -> int."""

    total: dict[str, int]
    threadgroups: dict[tuple[int, int, int], dict[str, int]]


def _adapter(kernel: Any) -> Any:
    adapter = getattr(kernel, "adapter", kernel)
    if not (hasattr(adapter, "kernel_global_source") and hasattr(adapter, "call")):
        raise TypeError(
            f"expected a kernel compiled with execution_backend='emulator' (a tilelang JITKernel), got {type(kernel).__name__}"
        )
    return adapter


def counters(kernel: Any, *args: Any) -> KernelCounters:
    """Run `kernel(*args)` once in the counting flavour and return what it did."""
    adapter = _adapter(kernel)
    _, buffers = adapter.call.bind(args, "cpu", poison=True)
    return launch_counters(adapter.kernel_global_source, buffers, adapter.call.launch.grid, adapter.call.launch.block)


def launch_counters(msl: str, tensors: Sequence[Any], grid: Sequence[int], block: Sequence[int]) -> KernelCounters:
    """`counters` for MSL source and explicit launch arguments (as EmulatedKernel.launch takes them)."""
    from . import compile_kernel  # the package-level function (the test-suite wraps it)

    emulated = compile_kernel(msl, instrument="counters")
    grid3 = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    ngroups = math.prod(grid3)
    n = len(COUNTER_NAMES)
    rows = (ctypes.c_uint64 * max(1, ngroups * n))()
    emulated.launch(tensors, grid, block, _instrumentation=(_MODE_COUNTERS, ctypes.addressof(rows), 0))
    per_group: dict[tuple[int, int, int], dict[str, int]] = {}
    total = dict.fromkeys(COUNTER_NAMES, 0)
    for g in range(ngroups):
        row = {name: int(rows[g * n + i]) for i, name in enumerate(COUNTER_NAMES)}
        x, y, z = g % grid3[0], (g // grid3[0]) % grid3[1], g // (grid3[0] * grid3[1])
        per_group[(x, y, z)] = row
        for k, v in row.items():
            total[k] += v
    return KernelCounters(total=total, threadgroups=per_group)


def _first_difference(a: Any, b: Any) -> tuple[int, Any, Any] | None:
    import torch

    ab, bb = a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8)
    if torch.equal(ab, bb):
        return None
    width = a.element_size()
    diff = (ab.view(-1, width) != bb.view(-1, width)).any(dim=1).nonzero()
    i = int(diff[0])
    return i, a.reshape(-1)[i].item(), b.reshape(-1)[i].item()


def racecheck(kernel: Any, *args: Any, seeds: Sequence[int] = (0, 1, 2)) -> Any:
    """Run `kernel(*args)` under race detection once per schedule seed; return what the call returns.

    Raises EmulatorRaceError for a data race, an uninitialized read of threadgroup memory or of a
    thread array, or outputs that differ bitwise between schedules. Inputs are copied for every
    schedule; the first schedule's results are written back to in-place arguments."""
    import torch

    adapter = _adapter(kernel)

    def bind(seed: int) -> tuple[list[Any], list[Any]]:
        copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        return adapter.call.bind(copies, "cpu", poison=True)

    what = "host parameter"  # host order, outputs included
    runs = _race_runs(adapter.kernel_global_source, bind, what, adapter.call.launch.grid, adapter.call.launch.block, seeds)
    originals = iter(args)
    for i, t in enumerate(runs[0]):
        if i in adapter.call.outputs:
            continue
        a = next(originals)
        if isinstance(a, torch.Tensor) and a is not t:
            a.copy_(t)
    return adapter.call.results(runs[0])


def launch_racecheck(
    msl: str, tensors: Sequence[Any], grid: Sequence[int], block: Sequence[int], *, seeds: Sequence[int] = (0, 1, 2)
) -> None:
    """`racecheck` for MSL source and explicit launch tensors (the first schedule's results land in them)."""

    def bind(seed: int) -> tuple[list[Any], list[Any]]:
        copies = [t.clone() for t in tensors]
        return copies, copies

    runs = _race_runs(msl, bind, "launch tensor", grid, block, seeds)
    for t, r in zip(tensors, runs[0]):
        t.copy_(r)


def _race_runs(msl: str, bind: Any, what: str, grid: Sequence[int], block: Sequence[int], seeds: Sequence[int]) -> list[list[Any]]:
    """Run under racecheck once per seed (`bind(seed)` -> (tensors to compare, launch buffers)) and
    compare the tensors of every schedule bitwise with the first's; `what` names a tensor's position."""
    from . import compile_kernel

    if not seeds:
        raise ValueError("racecheck needs at least one seed")
    emulated = compile_kernel(msl, instrument="racecheck")
    runs: list[list[Any]] = []
    for seed in seeds:
        tensors, buffers = bind(seed)
        try:
            emulated.launch(buffers, grid, block, workers=1, _instrumentation=(_MODE_RACECHECK, 0, int(seed)))
        except EmulatorRaceError as e:
            raise EmulatorRaceError(f"{e} (schedule seed {seed})") from None
        runs.append(tensors)
    for seed, tensors in zip(seeds[1:], runs[1:]):
        for i, (first, other) in enumerate(zip(runs[0], tensors)):
            diff = _first_difference(first, other)
            if diff is not None:
                raise EmulatorRaceError(
                    f"kernel {emulated.name}: outputs depend on the schedule: {what} {i} element "
                    f"{diff[0]} is {diff[1]!r} with seed {seeds[0]} and {diff[2]!r} with seed {seed}"
                )
    return runs
