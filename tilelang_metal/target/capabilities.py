"""What a Metal target can do, derived once from its `Target` (`capabilities_of`), frozen.

Selection, GEMM lowering, the plugin passes, the register budget, the autotuner and the ready
kernels read a `TargetCapabilities`, never the Target's keys: `capabilities_of` is the one place
that reads them (tests/unit/test_capabilities.py checks no other module does). Public entry points
that take a target as the user writes it (a Target, "metal", "metal4"-keyed dicts, None for this
host's Metal) normalize it once with `resolve_capabilities`.

No tilelang import at module level: selection stays unit-testable on its own.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .isa import METAL4_FEATURE, SIMD_WIDTH
from .limits import BUFFER_ARGUMENT_SLOTS, MAX_THREADS_PER_THREADGROUP, THREADGROUP_MEMORY_BYTES

# MSL version the printed code needs: cooperative tensors (MPP tensor operations) need MSL 4.0
# (execution/metal4_launch.py); everything else is written for MSL 3.2 (macOS 15), the version the
# emulator's predefines (emulator/foreign) and T.print's os_log (codegen/debug_print.py) assume.
METAL4_MSL_VERSION = "4.0"
PLAIN_MSL_VERSION = "3.2"

# Chip class the target's code is tuned for: `target="metal"` gets the metal4 key only on M5 and newer
# (target.py), where matmul2d has its own hardware; plain metal is tuned for M1-M4 (simdgroup matrices).
METAL4_CHIP_CLASS = "M5+"
PLAIN_CHIP_CLASS = "M1-M4"


@dataclass(frozen=True)
class TargetCapabilities:
    """A Metal target's capabilities: its instruction features and the Apple GPU limits the plugin
    launches with (limits.py; TVM's metal kind defaults say 16 lanes and 256 threads, see target.py)."""

    features: frozenset[str] = frozenset()  # the target's keys: what isa.REGISTRY filters instructions by
    simd_width: int = SIMD_WIDTH
    max_threads_per_threadgroup: int = MAX_THREADS_PER_THREADGROUP
    threadgroup_memory_bytes: int = THREADGROUP_MEMORY_BYTES
    buffer_argument_slots: int = BUFFER_ARGUMENT_SLOTS

    @property
    def metal4(self) -> bool:
        """Metal 4's MPP tensor operations (cooperative tensors) are available."""
        return METAL4_FEATURE in self.features

    @property
    def msl_version(self) -> str:
        return METAL4_MSL_VERSION if self.metal4 else PLAIN_MSL_VERSION

    @property
    def chip_class(self) -> str:
        return METAL4_CHIP_CLASS if self.metal4 else PLAIN_CHIP_CLASS

    @property
    def name(self) -> str:
        """"metal4" or "metal": how the CLI, `--explain` and kernels/matmul.py name the target."""
        return "metal4" if self.metal4 else "metal"


def capabilities_with(features: Iterable[str]) -> TargetCapabilities:
    """Capabilities of a Metal target with these keys (a metal4 target: `{METAL4_FEATURE}`)."""
    return _capabilities(True, tuple(sorted(str(f) for f in features)))


@functools.lru_cache(maxsize=None)
def _capabilities(is_metal: bool, keys: tuple[str, ...]) -> TargetCapabilities:
    return TargetCapabilities(features=frozenset(keys) if is_metal else frozenset())


def capabilities_of(target: Any) -> TargetCapabilities:
    """The capabilities of a tilelang/TVM `Target`, derived once per kind and key set. A target of
    another kind has no Metal features."""
    return _capabilities(str(target.kind.name) == "metal", tuple(sorted(str(k) for k in target.keys)))


def resolve_capabilities(target: Any = None) -> TargetCapabilities:
    """A public entry's `target` argument as capabilities: a `TargetCapabilities` as it is, a Target
    as `capabilities_of` reads it, a string or a dict through tilelang's target resolution (the
    plugin's normalizer included), None as "metal" (this host's Metal)."""
    if isinstance(target, TargetCapabilities):
        return target
    if isinstance(target, bool):
        raise TypeError(f"target={target!r}: pass a Target, 'metal' or None (this host), or capabilities_with({{'metal4'}}) / "
                        "capabilities_with(()) instead of a bool")
    if not hasattr(target, "keys") or isinstance(target, dict):
        from ..host import resolve_target

        target = resolve_target(target if target is not None else "metal")
    return capabilities_of(target)
