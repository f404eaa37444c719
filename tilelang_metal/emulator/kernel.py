"""A compiled kernel library and its launch entry."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .. import config
from ..target.limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES
from .errors import EmulatorLaunchError, EmulatorRaceError, EmulatorRuntimeError, EmulatorStackError
from .signature import ArgStructParam, KernelSignature, ScalarParam

if TYPE_CHECKING:
    import torch

DEFAULT_STACK_BYTES = 256 * 1024  # fiber stack of a kernel without big thread arrays
DEFAULT_STACK_LIMIT_KB = 16 * 1024  # the most a fiber stack may grow to (TILELANG_METAL_EMULATOR_STACK_KB)
STACK_MARGIN_BYTES = 128 * 1024  # frames and compiler temporaries on top of the declared thread arrays
_ERROR_BYTES = 4096

_libs: dict[str, ctypes.CDLL] = {}
_libs_lock = threading.Lock()


def _load(path: Path) -> ctypes.CDLL:
    key = str(path)
    with _libs_lock:
        lib = _libs.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            fn = lib.tlm_launch
            fn.restype = ctypes.c_int
            fn.argtypes = [
                ctypes.POINTER(ctypes.c_void_p),
                ctypes.POINTER(ctypes.c_int64),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.POINTER(ctypes.c_uint32),
                ctypes.c_int32,
                ctypes.c_uint64,
                ctypes.c_uint64,
                ctypes.c_char_p,
                ctypes.c_uint64,
            ]
            if hasattr(lib, "tlm_instrument"):
                lib.tlm_instrument.restype = None
                lib.tlm_instrument.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_uint64]
            _libs[key] = lib
        return lib


def default_workers() -> int:
    configured = config.emulator_workers()
    if configured is not None:
        return configured
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - non-Linux
        return max(1, os.cpu_count() or 1)


def stack_limit_bytes() -> int:
    """The largest fiber stack the emulator gives a GPU thread (TILELANG_METAL_EMULATOR_STACK_KB)."""
    return config.emulator_stack_kb() * 1024 or DEFAULT_STACK_LIMIT_KB * 1024


def stack_bytes(signature: KernelSignature, *, array_scale: float = 1.0) -> int:
    """Fiber stack for `signature`: its thread arrays plus a margin (at least the default), within the limit.

    Raises EmulatorStackError (one line, naming the size and the setting) when the arrays do not fit.
    `array_scale` > 1 for builds that keep shadow state next to every thread-array element."""
    need = int(signature.thread_array_bytes * array_scale) + STACK_MARGIN_BYTES
    limit = stack_limit_bytes()
    if need > limit:
        big = max(signature.thread_arrays, key=lambda a: a.bytes)
        raise EmulatorStackError(
            f"kernel {signature.name}: thread-private arrays need {need // 1024} KiB of stack per GPU thread "
            f"(largest: {big.elem_type} {big.name}[{big.count}], line {big.line}; margin included), above the "
            f"emulator's limit of {limit // 1024} KiB: raise TILELANG_METAL_EMULATOR_STACK_KB"
        )
    granule = 64 * 1024
    return min(limit, (max(DEFAULT_STACK_BYTES, need) + granule - 1) // granule * granule)


def _dims(value: Sequence[int], what: str) -> tuple[int, int, int]:
    dims = tuple(int(v) for v in value)
    if not 1 <= len(dims) <= 3:
        raise EmulatorLaunchError(f"{what} must have 1 to 3 dimensions, got {value!r}")
    dims = dims + (1,) * (3 - len(dims))
    if any(d < 1 or d >= 2**32 for d in dims):
        raise EmulatorLaunchError(f"{what} dimensions must be >= 1, got {value!r}")
    return dims  # type: ignore[return-value]


class EmulatedKernel:
    """An MSL kernel compiled for the CPU; `launch` runs it on torch CPU tensors in place."""

    def __init__(
        self, signature: KernelSignature, library: Path, source: str, checked: bool, *,
        instrument: str | None = None, stack: int | None = None,
    ) -> None:
        self.signature = signature
        self.name = signature.name
        self.library_path = library
        self.source = source  # the C++ that was compiled (rewritten kernel + driver)
        self.checked = checked
        self.instrument = instrument  # None, "counters" or "racecheck" (instrument.py)
        self._stack = stack
        self._lib = _load(library)
        self._instrument_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"EmulatedKernel({self.name!r}, checked={self.checked}, library={str(self.library_path)!r})"

    def _bind_arguments(self, args: Sequence[object]) -> list[torch.Tensor]:
        """One tensor per [[ buffer(i) ]]: the caller's tensors, and each scalar held in a one-element
        tensor of its parameter's dtype (the driver passes a pointer to it, as Metal's setBytes does)."""
        import torch

        bound = self.signature.bound
        if len(args) != len(bound):
            names = ", ".join(b.name for b in bound)
            raise EmulatorLaunchError(
                f"kernel {self.name} takes {len(bound)} buffer(s) ({names}), got {len(args)} argument(s)"
            )
        out = []
        for b, t in zip(bound, args):
            expected = getattr(torch, b.torch_dtype_name, None)
            if expected is None:  # pragma: no cover - very old torch
                raise EmulatorLaunchError(f"{b.describe()}: torch has no dtype {b.torch_dtype_name}")
            if isinstance(b, ScalarParam):
                out.append(self._scalar_tensor(b, t, expected))
                continue
            if isinstance(b, ArgStructParam):
                if not isinstance(t, (bytes, bytearray)) or len(t) != b.size:
                    got = f"{len(t)} bytes" if isinstance(t, (bytes, bytearray)) else type(t).__name__
                    raise EmulatorLaunchError(f"{b.describe()}: expected its {b.size} bytes, got {got}")
                out.append(torch.frombuffer(bytearray(t), dtype=torch.uint8))
                continue
            if not isinstance(t, torch.Tensor):
                raise EmulatorLaunchError(f"{b.describe()}: expected a torch.Tensor, got {type(t).__name__}")
            if t.dtype != expected:
                raise EmulatorLaunchError(f"{b.describe()}: expected dtype {expected}, got {t.dtype}")
            if t.device.type != "cpu":
                raise EmulatorLaunchError(f"{b.describe()}: tensor must be on the CPU, got device {t.device}")
            if not t.is_contiguous():
                raise EmulatorLaunchError(f"{b.describe()}: tensor must be contiguous")
            out.append(t)
        return out

    @staticmethod
    def _scalar_tensor(p: ScalarParam, value: object, dtype: torch.dtype) -> torch.Tensor:
        import torch

        if isinstance(value, torch.Tensor):
            if value.numel() != 1 or value.dtype != dtype or value.device.type != "cpu":
                raise EmulatorLaunchError(
                    f"{p.describe()}: expected a number or a one-element CPU {dtype} tensor, "
                    f"got a {value.dtype} tensor of shape {tuple(value.shape)} on {value.device}"
                )
            return value.reshape(1).clone()
        if not isinstance(value, (bool, int, float)):
            raise EmulatorLaunchError(f"{p.describe()}: expected a number, got {type(value).__name__}")
        try:
            held = torch.tensor([value], dtype=dtype)
        except (RuntimeError, OverflowError):
            held = None
        if held is None or (not dtype.is_floating_point and held.item() != value):
            raise EmulatorLaunchError(f"{p.describe()}: {value!r} does not fit in {dtype}")
        return held

    def launch(
        self,
        tensors: Sequence[object],
        grid: tuple[int, int, int],
        block: tuple[int, int, int],
        *,
        workers: int | None = None,
        _instrumentation: tuple[int, int, int] | None = None,
    ) -> None:
        """Run the kernel over `grid` threadgroups of `block` threads; writes land in the tensors.

        `tensors` holds one entry per [[ buffer(i) ]] in index order: a tensor for a device buffer, a
        number (or one-element tensor) for a `constant T&` scalar, `bytes` for an argument struct.
        (`_instrumentation` = (mode, counters address, seed) is instrument.py's, for instrumented builds.)"""
        tensors = self._bind_arguments(tensors)
        g = _dims(grid, "grid")
        b = _dims(block, "block")
        nthreads = b[0] * b[1] * b[2]
        limit = min(MAX_THREADS_PER_THREADGROUP, self.signature.max_total_threads or MAX_THREADS_PER_THREADGROUP)
        if nthreads > limit:
            why = "max_total_threads_per_threadgroup" if self.signature.max_total_threads else "Metal's maximum"
            raise EmulatorLaunchError(f"kernel {self.name}: block {b} has {nthreads} threads, {why} is {limit}")
        nworkers = default_workers() if workers is None else int(workers)
        if nworkers < 1:
            raise EmulatorLaunchError(f"workers must be >= 1, got {workers}")
        n = len(tensors)
        ptrs = (ctypes.c_void_p * max(n, 1))(*[t.data_ptr() for t in tensors])
        counts = (ctypes.c_int64 * max(n, 1))(*[t.numel() for t in tensors])
        grid_arr = (ctypes.c_uint32 * 3)(*g)
        block_arr = (ctypes.c_uint32 * 3)(*b)
        err = ctypes.create_string_buffer(_ERROR_BYTES)
        stack = self._stack or stack_bytes(self.signature)
        mode, counters, seed = _instrumentation or (0, 0, 0)
        if mode and self.instrument is None:
            raise EmulatorLaunchError(f"kernel {self.name}: instrumented launch of a plain build")
        with self._instrument_lock if self.instrument else contextlib.nullcontext():  # setting is per library
            if self.instrument is not None:
                self._lib.tlm_instrument(mode, counters or None, seed)
            # ctypes releases the GIL for the duration of the call.
            rc = self._lib.tlm_launch(
                ptrs, counts, grid_arr, block_arr, nworkers, stack, THREADGROUP_MEMORY_BYTES, err, _ERROR_BYTES
            )
        if rc == 2:
            raise EmulatorRaceError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
        if rc != 0:
            raise EmulatorRuntimeError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
