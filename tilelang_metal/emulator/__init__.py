"""Execute the plugin's MSL on Linux: compile it as C++ against shim headers and run it on the CPU.

Typical use::

    from tilelang_metal.emulator import compile_kernel
    k = compile_kernel(msl)                      # cached on disk by content hash
    k.launch([a, b, c], grid=(16, 8, 1), block=(128, 1, 1))

See docs/emulator.md for how it works and docs/lane_layouts.md for the matrix lane layouts.
"""

from __future__ import annotations

import threading

from . import toolchain
from .driver import generate as _generate_driver
from .errors import (
    EmulatorCompileError,
    EmulatorError,
    EmulatorLaunchError,
    EmulatorRaceError,
    EmulatorRuntimeError,
    EmulatorStackError,
)
from .kernel import EmulatedKernel, stack_bytes
from ..codegen.artifact import find_artifact
from ..codegen.kernel_text import split_kernels
from .handwritten import with_artifact
from .signature import KernelSignature, check_buffer_slots, rewrite
from .version import SHIM_VERSION

__all__ = [
    "SHIM_VERSION",
    "EmulatedKernel",
    "EmulatorCompileError",
    "EmulatorError",
    "EmulatorLaunchError",
    "EmulatorRaceError",
    "EmulatorRuntimeError",
    "EmulatorStackError",
    "KernelSignature",
    "build_stats",
    "check_source",
    "clear_memory_cache",
    "compile_kernel",
    "compile_msl",
    "ForeignKernel",
    "split_kernels",
    "counters",
    "launch_counters",
    "launch_racecheck",
    "racecheck",
    "KernelCounters",
    "COUNTER_NAMES",
]

_memo: dict[tuple[str, bool, str, str, str, str | None], EmulatedKernel] = {}


def _array_scale(instrument: str | None) -> float:
    return 2.0 if instrument == "racecheck" else 1.0  # local_array keeps a written flag per element
_memo_lock = threading.Lock()


def _printed(msl: str) -> str:
    """`msl` with its artifact: the printer's own, or the one the front door reads from hand-written
    MSL in the printer's shape (handwritten.py; the only place compile_kernel's MSL is parsed)."""
    try:
        found = find_artifact(msl)
    except ValueError as err:  # an artifact of another version, or damaged
        raise EmulatorCompileError(str(err)) from None
    return msl if found is not None else with_artifact(msl)


def _unit(msl: str, checked: bool, instrument: str | None = None) -> tuple[KernelSignature, toolchain.SourceUnit]:
    rw = rewrite(_printed(msl), checked=checked, instrument=instrument)
    check_buffer_slots(rw.signature.name, [p.index for p in rw.signature.bound])
    driver = _generate_driver(rw.signature, checked=checked, prints=rw.record.prints)
    return rw.signature, toolchain.SourceUnit(rw.signature.name, msl, rw.text, driver)


def check_source(msl: str) -> None:
    """Compile `msl` for syntax only (after the emulator's rewrites), each kernel of a multi-kernel
    file on its own; raise EmulatorCompileError if it fails."""
    printed = _printed(msl)
    for source in split_kernels(printed).values():
        _, unit = _unit(source, checked=True)
        toolchain.syntax_check(unit)


def compile_kernel(msl: str, *, checked: bool = True, instrument: str | None = None) -> EmulatedKernel:
    """Compile `msl` (or fetch it from the cache) into a launchable CPU kernel.

    `instrument` builds a separate flavour ("counters" or "racecheck", see instrument.py); plain builds
    contain no instrumentation at all."""
    memo_key = (msl, checked, str(toolchain.cache_dir()), toolchain.fiber_flavour(), toolchain.compiler(), instrument)
    with _memo_lock:
        hit = _memo.get(memo_key)
    if hit is not None and toolchain.cache.touch(hit.library_path):  # a use, for the LRU limit
        toolchain.bump("memory_hits")
        hit._stack = stack_bytes(hit.signature, array_scale=_array_scale(instrument))  # the limit may have moved
        return hit
    sig, unit = _unit(msl, checked, instrument)
    kernel_stack = stack_bytes(sig, array_scale=_array_scale(instrument))  # refuse before spending a build
    lib = toolchain.kernel_library(unit, checked, instrument)
    kernel = EmulatedKernel(sig, lib, unit.text, checked, instrument=instrument, stack=kernel_stack)
    with _memo_lock:
        _memo[memo_key] = kernel
    return kernel


def build_stats() -> dict[str, int]:
    """Counters of this process: kernel/runtime compiler runs and cache hits (for tests and benchmarks)."""
    with toolchain._stats_lock:
        return dict(toolchain.STATS)


def clear_memory_cache() -> None:
    """Forget kernels compiled in this process (the disk cache stays); used by tests."""
    with _memo_lock:
        _memo.clear()


from .instrument import (  # noqa: E402  (uses compile_kernel)
    COUNTER_NAMES,
    KernelCounters,
    counters,
    launch_counters,
    launch_racecheck,
    racecheck,
)
from .foreign import compile_msl  # noqa: E402
from .foreign.launcher import ForeignKernel  # noqa: E402
