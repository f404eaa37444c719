"""Metal target normalization: `target="metal"` gains the `metal4` key only where Metal 4 runs.

`"metal"` gets the `metal4` key (MPP cooperative tensors) with macOS >= 26 on arm64, an SDK >= 26 and
an Apple M5 or newer GPU, where matmul2d has its own hardware; MPP also runs on M1-M4 under macOS 26,
but there only an explicit metal4 target asks for it. On any other host (Linux included) `"metal"`
stays a plain Metal target. Targets passed with
explicit keys (dicts or `Target` objects) are honoured untouched, which is how source-only builds
on Linux ask for cooperative-tensor MSL.
"""

from __future__ import annotations

import functools
import platform
import re
import subprocess
from dataclasses import dataclass
from typing import Any

from ..host import Target
from .isa import METAL4_FEATURE, SIMD_WIDTH
from .limits import MAX_THREADS_PER_THREADGROUP

MIN_MACOS_MAJOR = 26
MIN_SDK_MAJOR = 26
MIN_APPLE_M_GENERATION = 5


@dataclass(frozen=True)
class HostFacts:
    """What decides Metal 4 support; injectable for tests."""

    macos_release: str  # "" off macOS
    machine: str
    sdk_version: str | None
    cpu_brand: str | None


def _major(version: str | None) -> int:
    match = re.match(r"\s*(\d+)", version or "")
    return int(match.group(1)) if match else 0


def _run(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def read_host_facts() -> HostFacts:
    release, _, machine = platform.mac_ver()
    if not release:
        return HostFacts("", platform.machine(), None, None)
    return HostFacts(
        release,
        machine,
        _run(["xcrun", "-sdk", "macosx", "--show-sdk-version"]),
        _run(["sysctl", "-n", "machdep.cpu.brand_string"]),
    )


def metal_available(facts: HostFacts) -> bool:
    return bool(facts.macos_release) and facts.machine == "arm64"


def apple_gpu_generation(cpu_brand: str | None) -> int:
    """5 for "Apple M5 Pro"; 0 when the brand string names no Apple M-series chip."""
    words = (cpu_brand or "").split()
    for vendor, model in zip(words, words[1:]):
        if vendor == "Apple" and model[:1] == "M" and model[1:].isdigit():
            return int(model[1:])
    return 0


def metal4_supported(facts: HostFacts) -> bool:
    """True only when OS, SDK and GPU generation all support Metal 4."""
    requirements = (
        metal_available(facts),
        _major(facts.macos_release) >= MIN_MACOS_MAJOR,
        _major(facts.sdk_version) >= MIN_SDK_MAJOR,
        apple_gpu_generation(facts.cpu_brand) >= MIN_APPLE_M_GENERATION,
    )
    return all(requirements)


@functools.lru_cache(maxsize=1)
def _local_facts() -> HostFacts:
    return read_host_facts()


def metal_target_keys(facts: HostFacts | None = None) -> list[str]:
    facts = facts if facts is not None else _local_facts()
    keys = ["metal", "gpu"]
    if metal4_supported(facts):
        keys.append(METAL4_FEATURE)
    return keys


# TVM's metal kind defaults to 16-lane warps and 256 threads; the plugin launches 32-lane simdgroups and
# up to 1024 threads per threadgroup. Said on the targets it makes (the MSL is the same either way).
APPLE_GPU_ATTRS = {"thread_warp_size": SIMD_WIDTH, "max_num_threads": MAX_THREADS_PER_THREADGROUP,
                   "max_threads_per_block": MAX_THREADS_PER_THREADGROUP}


def make_metal_target(keys: list[str]) -> Any:
    """A Metal target with these keys and the Apple GPU's simdgroup width and threadgroup size."""
    return Target({"kind": "metal", "keys": keys, **APPLE_GPU_ATTRS})


def _kind(target: object) -> str | None:
    """The target kind a normalizer is asked about: a Target's kind, a dict's "kind", a bare name."""
    if isinstance(target, Target):
        return str(target.kind.name)
    if isinstance(target, dict):
        return target.get("kind")
    return target.strip() if isinstance(target, str) else None


def normalize_metal_target(target: object, facts: HostFacts | None = None) -> Target | None:
    """tilelang target-normalizer hook: handles `"metal"` and Metal targets, ignores the rest. Only the
    bare name is given this host's keys; a Target or a dict keeps the keys it was written with."""
    if _kind(target) != "metal":
        return None
    if isinstance(target, str):
        return make_metal_target(metal_target_keys(facts))
    return target if isinstance(target, Target) else Target({**APPLE_GPU_ATTRS, **target})


def detect_metal_target() -> Target | None:
    """tilelang target-detector hook for `target="auto"`."""
    facts = _local_facts()
    if not metal_available(facts):
        return None
    return make_metal_target(metal_target_keys(facts))


def is_metal(target: Target) -> bool:
    return target.kind.name == "metal"


def metal4_target() -> Any:
    """An explicit Metal 4 target: cooperative-tensor MSL on any host (source-only on Linux)."""
    return make_metal_target(["metal", "gpu", METAL4_FEATURE])


def plain_metal_target() -> Any:
    """Metal without the metal4 key: simdgroup-matrix MSL, what `target="metal"` gives before M5."""
    return make_metal_target(["metal", "gpu"])
