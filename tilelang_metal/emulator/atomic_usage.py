"""What a kernel does with atomics (for racecheck's schedule comparison), from its artifact record.

Atomics make some outputs legitimately depend on the order threads run in: float atomic adds round
differently in another order (and so does everything later computed from the accumulated value),
and the previous value an atomic returns (`return_prev=True`, a ticket) is whatever the schedule
made it. The printer records what each kernel's atomics update, whether any is on float data and
whether the kernel reads a value an atomic returns (codegen/artifact.py); the front door reads the
same from hand-written MSL (handwritten.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from .signature import BufferParam, KernelSignature


@dataclass(frozen=True)
class AtomicUsage:
    targets: frozenset[int]  # buffer indices of device buffers that atomics update
    float_atomics: bool  # an atomic on floating-point data (device or threadgroup memory)
    results_used: bool  # the kernel reads the value an atomic returns (or loads atomically)


def atomic_usage(signature: KernelSignature) -> AtomicUsage:
    """Atomics of the kernel, as its record says."""
    record = signature.record
    index = {p.name: p.index for p in signature.params if isinstance(p, BufferParam)}
    targets = frozenset(index[name] for name in record.atomic_targets if name in index)
    return AtomicUsage(targets, record.float_atomics, record.atomic_results_used)
