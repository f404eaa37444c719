"""Launching a compiled foreign kernel (`ForeignKernel`): each argument checked against the type the
compiled kernel declares (kind, dtype, struct size), device buffers copied into guarded memory and back,
the counters and racecheck flavours; which counters a foreign launch reports."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...target.isa import COUNTED
from .. import toolchain
from ..errors import EmulatorCompileError, EmulatorLaunchError, EmulatorRaceError, EmulatorRuntimeError
from .guarded_memory import _Guarded, _GuardRegion
from .kernel_entry import ForeignParam, _buffer_slots

_ABSENT_TRACED_BYTES = 4096  # zeros behind an absent buffer in the traced counters build (see launch)


# Element codes of shim/tlm/foreign.h (scalar_code) -> torch dtype names.
_SCALAR_CODES = {
    1: "bool", 2: "int8", 3: "uint8", 4: "int16", 5: "uint16", 6: "int32", 7: "uint32",
    8: "int64", 9: "uint64", 10: "float16", 11: "bfloat16", 12: "float32",
}


@dataclass(frozen=True)
class Binding:
    """What a [[buffer(i)]] parameter takes, as the compiled kernel declares it."""

    param: ForeignParam
    by_reference: bool  # `constant T& x`: a value (number, struct bytes), else a pointer to a buffer
    pointee_bytes: int
    dtype: str | None  # torch dtype name of the element (None: a struct)
    lanes: int  # vector width of the pointee (1: scalar)
    const: bool


class ForeignKernel:
    """A compiled foreign kernel. `launch(args, grid, block)`: one argument per [[buffer(i)]] in index
    order (a CPU tensor for a pointer; a number, one-element tensor or the struct's bytes for a
    `constant T&`); `grid` counts threadgroups (MTLCommandEncoder.dispatchThreadgroups)."""

    def __init__(self, name: str, callee: str, params: list[ForeignParam], library: Path, unit: toolchain.SourceUnit,
                 instrument: str | None, *, rebuild: Callable[[str], ForeignKernel], memory_traced: bool = False) -> None:
        from ..kernel import _load

        self.name = name
        self.callee = callee
        self.params = tuple(params)
        self.library_path = library
        self.unit = unit
        self.instrument = instrument
        self.memory_traced = memory_traced  # counters flavour built with memory tracing (MEMORY_COUNTERS count)
        self._rebuild = rebuild  # the same source compiled as another flavour (compile_msl, bound to it)
        self._lib = _load(library)
        self._lib.tlm_param_info.restype = ctypes.c_int
        self._lib.tlm_param_info.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
        self._lib.tlm_set_guards.restype = None
        self._lib.tlm_set_guards.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
        self._lock = threading.Lock()
        # every buffer parameter, in index order (the driver's slots); bindings: those that exist,
        # one launch argument each (a `function_constant(c)` parameter with c false has none)
        self.slots = tuple(_buffer_slots(params))
        self.bindings = tuple(self._describe(p) for p in self.slots if p.enabled)

    def __repr__(self) -> str:
        return f"ForeignKernel({self.name!r}, {self.callee!r})"

    def _describe(self, p: ForeignParam) -> Binding:
        out = (ctypes.c_int64 * 5)()
        if not self._lib.tlm_param_info(p.buffer, out):  # pragma: no cover - generated together
            raise EmulatorCompileError(f"kernel {self.name}: no type information for buffer {p.buffer}")
        return Binding(p, bool(out[0]), int(out[1]), _SCALAR_CODES.get(int(out[2])), int(out[3]), bool(out[4]))

    def _flavour(self, instrument: str) -> ForeignKernel:
        if self.instrument == instrument:
            return self
        return self._rebuild(instrument)

    def _argument_bytes(self, b: Binding, value: Any) -> tuple[bytes | None, Any]:
        """(bytes to place, tensor to copy back into or None) for one binding."""
        import torch

        what = f"kernel {self.name}: {b.param.describe()}"
        if b.by_reference:
            if b.dtype is None:  # a struct by reference
                if isinstance(value, ctypes.Structure):
                    value = bytes(value)
                if not isinstance(value, (bytes, bytearray, memoryview)):
                    raise EmulatorLaunchError(f"{what}: expected the struct's {b.pointee_bytes} bytes (bytes or a ctypes.Structure), got {type(value).__name__}")
                if len(value) != b.pointee_bytes:
                    raise EmulatorLaunchError(f"{what}: the struct has {b.pointee_bytes} bytes, got {len(value)}: check the field layout")
                return bytes(value), None
            dtype = getattr(torch, b.dtype)
            if isinstance(value, torch.Tensor):
                if value.numel() != b.lanes or value.dtype != dtype:
                    raise EmulatorLaunchError(f"{what}: expected {b.lanes} {dtype} value(s), got a {value.dtype} tensor of shape {tuple(value.shape)}")
                held = value.detach().cpu().reshape(-1).contiguous()
            else:
                values = list(value) if isinstance(value, (list, tuple)) else [value]
                if len(values) != b.lanes or not all(isinstance(v, (bool, int, float)) for v in values):
                    raise EmulatorLaunchError(f"{what}: expected {b.lanes} number(s), got {value!r}")
                held = torch.tensor(values, dtype=dtype)
                if not dtype.is_floating_point and held.tolist() != [int(v) for v in values]:
                    raise EmulatorLaunchError(f"{what}: {value!r} does not fit in {dtype}")
            return held.view(torch.uint8).numpy().tobytes(), None
        if b.dtype is None and isinstance(value, (ctypes.Structure, bytes, bytearray, memoryview)):
            # a pointer to structs (`const constant AttnParams* params`, set with setBytes): their bytes
            raw = bytes(value)
            if not raw or len(raw) % b.pointee_bytes:
                raise EmulatorLaunchError(f"{what}: {len(raw)} bytes is not a whole number of {b.pointee_bytes}-byte structs: check the field layout")
            return raw, None
        if not isinstance(value, torch.Tensor):
            raise EmulatorLaunchError(f"{what}: expected a torch.Tensor, got {type(value).__name__}")
        if value.device.type != "cpu" or not value.is_contiguous():
            raise EmulatorLaunchError(f"{what}: the tensor must be a contiguous CPU tensor")
        if b.dtype is not None and value.dtype != getattr(torch, b.dtype):
            raise EmulatorLaunchError(f"{what}: expected dtype torch.{b.dtype}, got {value.dtype}")
        nbytes = value.numel() * value.element_size()
        if nbytes % b.pointee_bytes:
            raise EmulatorLaunchError(f"{what}: {nbytes} bytes is not a whole number of {b.pointee_bytes}-byte elements")
        return None, value

    def launch(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int], *, workers: int | None = None,
               _instrumentation: tuple[int, int, int] | None = None) -> None:
        """Run over `grid` threadgroups of `block` threads; results land in the tensors."""
        from ...target.limits import MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES
        from ..kernel import DEFAULT_STACK_BYTES, _dims, default_workers

        if len(args) != len(self.bindings):
            names = ", ".join(b.param.name for b in self.bindings)
            absent = [p for p in self.slots if not p.enabled]
            why = f"; absent: {', '.join(f'{p.name} ({p.function_constant} is false)' for p in absent)}" if absent else ""
            raise EmulatorLaunchError(f"kernel {self.name} takes {len(self.bindings)} buffer argument(s) ({names}{why}), got {len(args)}")
        g, blk = _dims(grid, "grid"), _dims(block, "block")
        if blk[0] * blk[1] * blk[2] > MAX_THREADS_PER_THREADGROUP:
            raise EmulatorLaunchError(f"kernel {self.name}: block {blk} has more than {MAX_THREADS_PER_THREADGROUP} threads")
        prepared = [self._argument_bytes(b, a) for b, a in zip(self.bindings, args)]
        by_buffer = {b.param.buffer: (b, item) for b, item in zip(self.bindings, prepared)}
        regions: list[_Guarded] = []
        try:
            table = (_GuardRegion * max(1, len(self.slots)))()
            names = []
            for i, p in enumerate(self.slots):
                if p.enabled:
                    b, (raw, tensor) = by_buffer[p.buffer]
                    names.append(p.name.encode())
                    nbytes = len(raw) if raw is not None else tensor.numel() * tensor.element_size()
                elif self.memory_traced:
                    # The traced build is -O0: it evaluates reads the optimizer (and Metal's) drops as
                    # dead, e.g. MLX's steel GEMM reads the absent addmm_params to build an epilogue it
                    # never applies. Here an absent buffer reads as zeros and is not counted; the
                    # plain and racecheck builds keep the error below.
                    raw, nbytes = bytes(_ABSENT_TRACED_BYTES), _ABSENT_TRACED_BYTES
                    names.append(f"{p.name} (absent: function_constant({p.function_constant}) is false)".encode())
                else:  # absent: no bytes, so any access faults on the guard page and names why
                    raw, nbytes = b"", 0
                    names.append(f"{p.name} (absent: function_constant({p.function_constant}) is false)".encode())
                region = _Guarded(nbytes)
                regions.append(region)
                if raw is not None:
                    ctypes.memmove(region.address, raw, nbytes)
                elif nbytes:
                    ctypes.memmove(region.address, tensor.data_ptr(), nbytes)
                table[i] = _GuardRegion(region.guard_lo, region.guard_hi, region.address, nbytes, names[i], p.buffer,
                                        int(p.enabled and p.space == "device"))
            n = len(regions)
            ptrs = (ctypes.c_void_p * max(n, 1))(*[r.address for r in regions])
            counts = (ctypes.c_int64 * max(n, 1))(*[r.nbytes for r in regions])
            err = ctypes.create_string_buffer(4096)
            nworkers = default_workers() if workers is None else int(workers)
            mode, counters, seed = _instrumentation or (0, 0, 0)
            with self._lock:
                if self.instrument is not None:
                    self._lib.tlm_instrument(mode, counters or None, seed)
                self._lib.tlm_set_guards(ctypes.addressof(table), n)
                rc = self._lib.tlm_launch(ptrs, counts, (ctypes.c_uint32 * 3)(*g), (ctypes.c_uint32 * 3)(*blk), nworkers,
                                          4 * DEFAULT_STACK_BYTES, THREADGROUP_MEMORY_BYTES, err, 4096)
                self._lib.tlm_set_guards(None, 0)
            if rc == 2:
                raise EmulatorRaceError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
            if rc != 0:
                raise EmulatorRuntimeError(f"kernel {self.name}: " + err.value.decode(errors="replace"))
            for p, region in zip(self.slots, regions):
                if not p.enabled:
                    continue
                b, (raw, tensor) = by_buffer[p.buffer]
                if tensor is not None and not b.const and region.nbytes:
                    ctypes.memmove(tensor.data_ptr(), region.address, region.nbytes)
        finally:
            for r in regions:
                r.close()

    def counters(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int]) -> dict[str, int]:
        """Counts of one launch (totals): barriers, simd collectives, matrix instructions and, when the
        compiler can trace memory (clang; `memory_counts_unavailable()` says why not), the memory
        traffic of MEMORY_COUNTERS, counted from the kernel's own loads and stores by address (see
        docs/emulator.md, "Foreign MSL"). Counters the emulator cannot count for foreign MSL are left
        out rather than reported as 0: predicated accesses always, memory traffic without clang."""
        from ..instrument import _MODE_COUNTERS, COUNTER_NAMES
        from ..kernel import _dims

        k = self._flavour("counters")
        ngroups = 1
        for d in _dims(grid, "grid"):
            ngroups *= d
        rows = (ctypes.c_uint64 * max(1, ngroups * len(COUNTER_NAMES)))()
        k.launch(args, grid, block, _instrumentation=(_MODE_COUNTERS, ctypes.addressof(rows), 0))
        names = _FOREIGN_COUNTERS + (MEMORY_COUNTERS if k.memory_traced else ())
        total = dict.fromkeys(names, 0)
        for gi in range(ngroups):
            for i, name in enumerate(COUNTER_NAMES):
                if name in total:
                    total[name] += int(rows[gi * len(COUNTER_NAMES) + i])
        return total

    def racecheck(self, args: Sequence[Any], grid: Sequence[int], block: Sequence[int], *,
                  seeds: Sequence[int] = (0, 1, 2)) -> None:
        """Run once per schedule seed (threads of a threadgroup and threadgroups in seeded orders) on
        copies of the arguments and require bitwise-identical outputs; the first schedule's results
        land in `args`. Foreign kernels' individual accesses are not tracked, so this finds races whose
        outcome depends on the order (a missing barrier before a read of shared data), not every race."""
        import torch

        from ..instrument import _MODE_RACECHECK, _first_difference

        k = self._flavour("racecheck")
        if not seeds:
            raise ValueError("racecheck needs at least one seed")
        runs = []
        for seed in seeds:
            copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            try:
                k.launch(copies, grid, block, workers=1, _instrumentation=(_MODE_RACECHECK, 0, int(seed)))
            except EmulatorRaceError as e:
                raise EmulatorRaceError(f"{e} (schedule seed {seed})") from None
            runs.append(copies)
        for seed, run in zip(seeds[1:], runs[1:]):
            for i, (first, other) in enumerate(zip(runs[0], run)):
                if isinstance(first, torch.Tensor):
                    diff = _first_difference(first, other)
                    if diff is not None:
                        raise EmulatorRaceError(
                            f"kernel {self.name}: outputs depend on the schedule: buffer {self.bindings[i].param.buffer} "
                            f"('{self.bindings[i].param.name}') element {diff[0]} is {diff[1]!r} with seed {seeds[0]} "
                            f"and {diff[2]!r} with seed {seed}"
                        )
        for a, r in zip(args, runs[0]):
            if isinstance(a, torch.Tensor):
                a.copy_(r)


_FOREIGN_COUNTERS = ("threadgroup_barriers", "memory_barriers", "lockstep_barriers", "simdgroup_barriers",
                     "simd_collectives") + tuple(inst.counter for inst in COUNTED)
# Memory traffic, counted for foreign kernels when the compiler can trace it (memory_counts_unavailable).
MEMORY_COUNTERS = (
    "device_load_instructions", "device_load_bytes", "device_store_instructions", "device_store_bytes",
    "threadgroup_load_instructions", "threadgroup_load_bytes", "threadgroup_store_instructions",
    "threadgroup_store_bytes", "narrow_device_loads",
    "load_instructions", "store_instructions", "unique_device_load_bytes", "device_transactions", "threadgroup_replays",
)
