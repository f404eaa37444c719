"""What a kernel does with atomics, read from its MSL (for racecheck's schedule comparison).

Atomics make some outputs legitimately depend on the order threads run in: float atomic adds round
differently in another order (and so does everything later computed from the accumulated value),
and the previous value an atomic returns (`return_prev=True`, a ticket) is whatever the schedule
made it. The printer's atomics have a fixed shape (docs/msl_contract.md, "Atomics"): an atomic
object cast of `NAME + offset`, as the argument of an `atomic_*_explicit` function or of a
`__tlm_atomic_*` helper, used as a statement of its own unless its value is wanted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .signature import BufferParam, KernelSignature

_ATOMIC_CAST_RE = re.compile(r"\(\s*(?:device|threadgroup)\s+atomic_(?:int|uint|float)\s*\*\s*\)\s*\(\s*([A-Za-z_]\w*)")
_ATOMIC_CALL_RE = re.compile(r"\b(?:atomic_\w+_explicit|__tlm_atomic_\w+)\s*\(")
FLOAT_TYPES = frozenset({"float", "half", "bfloat"})


@dataclass(frozen=True)
class AtomicUsage:
    targets: frozenset[int]  # buffer indices of device buffers that atomics update
    float_atomics: bool  # an atomic on floating-point data (device or threadgroup memory)
    results_used: bool  # the kernel reads the value an atomic returns (or loads atomically)


def atomic_usage(msl: str, signature: KernelSignature) -> AtomicUsage:
    """Atomics of the (single) kernel of `msl`; the helpers before the kernel are not its uses."""
    body = "\n".join(msl.splitlines()[signature.line - 1 :])  # from the kernel's opening line on
    elem = {p.name: p.elem_type for p in signature.params if isinstance(p, BufferParam)}
    elem.update({a.name: a.elem_type for a in signature.threadgroup_arrays})
    elem.update({v.name: v.elem_type for v in signature.threadgroup_views})
    index = {p.name: p.index for p in signature.params if isinstance(p, BufferParam)}
    targets, float_atomics, results_used = set(), False, False
    for line in body.splitlines():
        code = line.split("//", 1)[0]
        for cast in _ATOMIC_CAST_RE.finditer(code):
            name = cast.group(1)
            if name in index:
                targets.add(index[name])
            float_atomics |= elem.get(name) in FLOAT_TYPES or "atomic_float" in cast.group(0)
        call = _ATOMIC_CALL_RE.search(code)
        # a statement `atomic_...(...);` or `(atomic_...(...), atomic_...(...));` discards the values
        if call and code[: call.start()].strip() not in ("", "("):
            results_used = True
    return AtomicUsage(frozenset(targets), float_atomics, results_used)
