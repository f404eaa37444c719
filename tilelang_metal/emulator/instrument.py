"""Counters and race detection for kernels compiled with `execution_backend="emulator"`.

Both run a separately compiled flavour of the kernel (`-DTLM_COUNTERS` / `-DTLM_RACECHECK`, with
stores and predicated accesses marked by mark_insertion.py), so plain launches pay nothing.

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

from ..target.isa import COUNTED
from .atomic_usage import AtomicUsage, atomic_usage
from .errors import EmulatorRaceError

# Same order as `enum counter` in shim/tlm/runtime_api.h: the scalar counters, then one per matrix
# instruction the runtime counts (named from the registry: `isa.COUNTED`).
SCALAR_COUNTER_NAMES: tuple[str, ...] = (
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
    "narrow_device_loads",
    # GPU-level counts: merged per-thread instructions, segments and bank passes per simdgroup-wide
    # access, barriers by kind (docs/emulator.md, "GPU-level counts")
    "load_instructions",
    "store_instructions",
    "unique_device_load_bytes",
    "device_transactions",
    "threadgroup_replays",
    "memory_barriers",
    "lockstep_barriers",
)
MATRIX_COUNTER_NAMES: tuple[str, ...] = tuple(inst.counter for inst in COUNTED)
COUNTER_NAMES: tuple[str, ...] = SCALAR_COUNTER_NAMES + MATRIX_COUNTER_NAMES
_MODE_COUNTERS, _MODE_RACECHECK = 1, 2


@dataclass(frozen=True)
class KernelCounters:
    """Counts of one launch: `total` and per threadgroup `(x, y, z)`, both counter name -> int."""

    total: dict[str, int]
    threadgroups: dict[tuple[int, int, int], dict[str, int]]


def _adapter(kernel: Any, tool: str) -> Any:
    """The emulator adapter of `kernel`. Another backend's adapter binds MLX arrays or MPS tensors,
    which the CPU launches here cannot read (torch failed on "device string: mlx"): refused first."""
    adapter = getattr(kernel, "adapter", kernel)
    backend = getattr(getattr(adapter, "device", None), "backend", None) or getattr(kernel, "execution_backend", None)
    if backend != "emulator" or not (hasattr(adapter, "kernel_global_source") and hasattr(adapter, "call")):
        what = f"was compiled with execution_backend={backend!r}" if backend else f"is a {type(kernel).__name__}, not a tilelang JITKernel"
        raise TypeError(
            f"emulator.{tool} runs kernels compiled with execution_backend='emulator' and this kernel {what}: "
            f"compile the same program with tilelang.compile(..., execution_backend='emulator') and pass CPU torch tensors"
        )
    return adapter


def _launches(adapter: Any, args: tuple, run_one: Any) -> Any:
    """Bind `args` as a call of the adapter's kernel does (checks, outputs) and pass every launch
    of the module, in host order, to `run_one(kernel source, launch values, grid, block)`."""
    from ..codegen.kernel_text import split_kernels

    sources = split_kernels(adapter.kernel_global_source)
    bound = adapter.call.bind(args, adapter.device, poison=True)  # the adapter's CPU device
    for launch in adapter.call.launches:
        shape = launch.shape(bound)
        if not shape.empty:
            run_one(sources[launch.kernel_name], launch.values(bound), shape.grid, shape.block)
    return bound


def counters(kernel: Any, *args: Any) -> KernelCounters:
    """Run `kernel(*args)` once in the counting flavour and return what it did. A module with
    several kernels adds up their counts (per threadgroup position too)."""
    adapter = _adapter(kernel, "counters")
    measured: list[KernelCounters] = []
    _launches(adapter, args, lambda msl, values, grid, block: measured.append(launch_counters(msl, values, grid, block)))
    total = dict.fromkeys(COUNTER_NAMES, 0)
    groups: dict[tuple[int, int, int], dict[str, int]] = {}
    for one in measured:
        for k, v in one.total.items():
            total[k] += v
        for pos, row in one.threadgroups.items():
            acc = groups.setdefault(pos, dict.fromkeys(COUNTER_NAMES, 0))
            for k, v in row.items():
                acc[k] += v
    return KernelCounters(total=total, threadgroups=groups)


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

    # reshape(-1), not contiguous(): a tensor torch calls contiguous may still have a size-1 last
    # dimension with a stride other than 1 (`x.t()` of a (1, n) x), which view() cannot reinterpret
    ab, bb = a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)
    if torch.equal(ab, bb):
        return None
    width = a.element_size()
    diff = (ab.view(-1, width) != bb.view(-1, width)).any(dim=1).nonzero()
    i = int(diff[0])
    return i, a.reshape(-1)[i].item(), b.reshape(-1)[i].item()


# How each tensor is compared between schedules (see _policies).
BITWISE, CLOSE, UNCOMPARED = "bitwise", "close", "uncompared"
# Relative tolerance for outputs of float atomics: order-dependent rounding of a sum of n terms is a
# few ulps times sqrt(n)-ish, relative to the terms (hence also atol = rtol * the tensor's largest value).
_ATOMIC_RTOL = {"float32": 1e-4, "float16": 1e-2, "bfloat16": 4e-2}
# Unit roundoff u of each float type: a rounded add is off by at most u * |its result|. A float
# atomic sum's partial sums are among the values the runtime sees its atomics leave behind, so one
# schedule's sum is within u * (sum of those magnitudes) of the exact sum, and two schedules within
# u * (M_first + M_other). The bound below doubles that (the bfloat CAS helper rounds twice:
# float, then bfloat; subnormal results have an absolute error floor).
_UNIT_ROUNDOFF = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8}
_MAGNITUDE_TYPES = {"float32": 1, "float16": 2, "bfloat16": 3}  # runtime_api.h, magnitude_type
_MAGNITUDE_BUFFERS = 256  # runtime_api.h, kMagnitudeBuffers


class _FloatAtomicMagnitudes(ctypes.Structure):
    """Mirror of tlm::rt::float_atomic_magnitudes (shim/tlm/runtime_api.h)."""

    _fields_ = [
        ("sum_abs", ctypes.c_void_p * _MAGNITUDE_BUFFERS),
        ("elem_type", ctypes.c_uint8 * _MAGNITUDE_BUFFERS),
    ]


def _dtype_name(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _magnitude_key(t: Any) -> tuple[int, int, str]:
    return t.data_ptr(), t.numel(), _dtype_name(t)


def _storage(t: Any) -> int:
    return t.untyped_storage().data_ptr()


def _policies(values: Sequence[Any], usages: Sequence[tuple[AtomicUsage, Sequence[Any]]]) -> list[str]:
    """Per value: BITWISE, or (modules with atomics) CLOSE for floating tensors when some atomic works
    on floating-point data (its rounding depends on the order, and so does whatever is computed from
    it), or UNCOMPARED for tensors that no atomic targets when a kernel uses atomics' return values
    (tickets, previous values: schedule-dependent by design). `usages`: per launch, its atomics and
    its launch values (to map atomic targets to tensors)."""
    import torch

    float_atomics = any(u.float_atomics for u, _ in usages)
    results_used = any(u.results_used for u, _ in usages)
    targets = {
        _storage(vals[i]) for u, vals in usages for i in u.targets if i < len(vals) and isinstance(vals[i], torch.Tensor)
    }
    out = []
    for v in values:
        if not isinstance(v, torch.Tensor):
            out.append(BITWISE)
        elif results_used and _storage(v) not in targets:
            out.append(UNCOMPARED)
        elif float_atomics and v.is_floating_point():
            out.append(CLOSE)
        else:
            out.append(BITWISE)
    return out


def racecheck(kernel: Any, *args: Any, seeds: Sequence[int] = (0, 1, 2)) -> Any:
    """Run `kernel(*args)` under race detection once per schedule seed; return what the call returns.

    Raises EmulatorRaceError for a data race, an uninitialized read of threadgroup memory or of a
    thread array, or outputs that differ between schedules (bitwise; with atomics see _policies).
    Inputs are copied for every schedule; the first schedule's results are written back to in-place
    arguments. Every kernel of a module runs, in host order."""
    import torch

    adapter = _adapter(kernel, "racecheck")
    adapter.call.bind(args, adapter.device, poison=True)  # a plain call's checks on the caller's tensors (clones are contiguous)

    def run(seed: int) -> tuple[list[Any], list[str], list[Any]]:
        copies = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in args)
        usages: list[tuple[AtomicUsage, Sequence[Any]]] = []
        magnitudes: dict[tuple[int, int, str], Any] = {}  # shared by the module's launches

        def one(msl: str, values: Sequence[Any], grid: Any, block: Any) -> None:
            usages.append((_race_launch(msl, values, grid, block, seed, magnitudes), values))

        bound = _launches(adapter, copies, one)
        values = list(bound.values)
        return values, _policies(values, usages), _magnitudes_of(values, magnitudes)

    runs = _compare_schedules(run, "host parameter", seeds)  # host order, outputs included
    written = {arg.position for launch in adapter.call.launches for arg in launch.arguments if arg.written}
    originals = iter(args)
    first = runs[0]
    for i, t in enumerate(first):
        if i in adapter.call.signature.outputs:
            continue
        a = next(originals)
        # only what a kernel writes goes back: an input may be a view no copy can land in (a broadcast)
        if isinstance(a, torch.Tensor) and a is not t and i in written:
            a.copy_(t)
    outs = [first[i] for i in adapter.call.signature.outputs]
    return None if not outs else outs[0] if len(outs) == 1 else outs


def launch_racecheck(
    msl: str, tensors: Sequence[Any], grid: Sequence[int], block: Sequence[int], *, seeds: Sequence[int] = (0, 1, 2)
) -> None:
    """`racecheck` for MSL source and explicit launch tensors (the first schedule's results land in them)."""

    def run(seed: int) -> tuple[list[Any], list[str], list[Any]]:
        copies = [t.clone() for t in tensors]
        magnitudes: dict[tuple[int, int, str], Any] = {}
        usage = _race_launch(msl, copies, grid, block, seed, magnitudes)
        return copies, _policies(copies, [(usage, copies)]), _magnitudes_of(copies, magnitudes)

    runs = _compare_schedules(run, "launch tensor", seeds)
    for t, r in zip(tensors, runs[0]):
        t.copy_(r)


def _race_launch(
    msl: str,
    buffers: Sequence[Any],
    grid: Sequence[int],
    block: Sequence[int],
    seed: int,
    magnitudes: dict[tuple[int, int, str], Any] | None = None,
) -> AtomicUsage:
    """One schedule of one launch. With `magnitudes`, the float device buffers that atomics update
    get (or keep, across the launches of a module) a float64 tensor per element summing the
    magnitudes of the values their atomics leave (the bound of _first_mismatch)."""
    from . import compile_kernel

    emulated = compile_kernel(msl, instrument="racecheck")
    usage = atomic_usage(emulated.signature)
    config = _magnitude_config(usage, buffers, magnitudes) if magnitudes is not None else None
    address = ctypes.addressof(config) if config is not None else 0
    try:
        emulated.launch(buffers, grid, block, workers=1, _instrumentation=(_MODE_RACECHECK, address, int(seed)))
    except EmulatorRaceError as e:
        raise EmulatorRaceError(f"{e} (schedule seed {seed})") from None
    return usage


def _magnitude_config(
    usage: AtomicUsage, buffers: Sequence[Any], magnitudes: dict[tuple[int, int, str], Any]
) -> _FloatAtomicMagnitudes | None:
    import torch

    config = _FloatAtomicMagnitudes()
    used = False
    for i in usage.targets:
        t = buffers[i] if i < len(buffers) else None
        if not isinstance(t, torch.Tensor) or _dtype_name(t) not in _MAGNITUDE_TYPES or i >= _MAGNITUDE_BUFFERS:
            continue
        m = magnitudes.setdefault(_magnitude_key(t), torch.zeros(t.numel(), dtype=torch.float64))
        config.sum_abs[i] = m.data_ptr()
        config.elem_type[i] = _MAGNITUDE_TYPES[_dtype_name(t)]
        used = True
    return config if used else None


def _magnitudes_of(values: Sequence[Any], magnitudes: dict[tuple[int, int, str], Any]) -> list[Any]:
    """Per value: its float atomic magnitudes (float64, one per element), or None."""
    return [magnitudes.get(_magnitude_key(v)) if hasattr(v, "data_ptr") else None for v in values]


def _first_mismatch(
    a: Any, b: Any, magnitude_a: Any = None, magnitude_b: Any = None
) -> tuple[int, Any, Any, float, float] | None:
    """First element of float tensors `a`, `b` that differs by more than atomics' rounding allows:
    rtol of the tensor's largest value (values computed from atomic sums), or, for elements float
    atomics updated (`magnitude_*`: per element, the summed magnitudes of the values the atomics
    left, one per schedule), 2 u (M_a + M_b), which scales with the summed terms however much they
    cancel. The larger of the two applies, plus rtol of the value itself. Returns (element, value in
    `a`, value in `b`, rtol, the absolute tolerance of that element)."""
    import torch

    dtype = _dtype_name(a)
    rtol = _ATOMIC_RTOL.get(dtype, 1e-4)
    x, y = a.reshape(-1).double(), b.reshape(-1).double()
    finite = x[torch.isfinite(x)]
    scale = float(finite.abs().max()) if finite.numel() else 0.0
    atol = torch.full_like(x, rtol * scale)
    if magnitude_a is not None and magnitude_b is not None and magnitude_a.numel() == x.numel() == magnitude_b.numel():
        bound = 2.0 * _UNIT_ROUNDOFF.get(dtype, 2.0**-24) * (magnitude_a + magnitude_b)
        atol = torch.maximum(atol, bound)
    both_nan = x.isnan() & y.isnan()
    ok = both_nan | (x == y) | ((x - y).abs() <= atol + rtol * y.abs())
    if bool(ok.all()):
        return None
    i = int((~ok).nonzero()[0])
    return i, a.reshape(-1)[i].item(), b.reshape(-1)[i].item(), rtol, float(atol[i])


def _compare_schedules(run: Any, what: str, seeds: Sequence[int]) -> list[list[Any]]:
    """`run(seed)` once per seed (-> the tensors to compare and how: _policies); the tensors of every
    schedule must equal the first's. `what` names a tensor's position in reports."""
    if not seeds:
        raise ValueError("racecheck needs at least one seed")
    results = [run(seed) for seed in seeds]
    runs = [r[0] for r in results]
    policies = results[0][1]
    # optional third item: per value, its float atomic magnitudes (or None)
    magnitudes = [r[2] if len(r) > 2 else [None] * len(r[0]) for r in results]
    for seed, values, other_magnitudes in zip(seeds[1:], runs[1:], magnitudes[1:]):
        for i, (first, other) in enumerate(zip(runs[0], values)):
            policy = policies[i] if i < len(policies) else BITWISE
            if policy == UNCOMPARED or not hasattr(first, "element_size"):
                continue
            if policy == CLOSE:
                bad = _first_mismatch(first, other, magnitudes[0][i], other_magnitudes[i])
                if bad is not None:
                    raise EmulatorRaceError(
                        f"outputs depend on the schedule beyond float-atomic rounding: {what} {i} element {bad[0]} is "
                        f"{bad[1]!r} with seed {seeds[0]} and {bad[2]!r} with seed {seed} (compared within rtol "
                        f"{bad[3]:g} plus {bad[4]:.3g}: rtol of the tensor's largest value or the rounding bound of "
                        f"the element's float atomic adds, as the kernel accumulates with float atomics)"
                    )
                continue
            diff = _first_difference(first, other)
            if diff is not None:
                raise EmulatorRaceError(
                    f"outputs depend on the schedule: {what} {i} element "
                    f"{diff[0]} is {diff[1]!r} with seed {seeds[0]} and {diff[2]!r} with seed {seed}"
                )
    return runs
